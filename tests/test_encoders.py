"""Every encoder of the zoo: shapes, bidirectionality, padding behaviour, determinism, heads, and the
paper-size parameter counts of every shipped recipe (computed abstractly, nothing allocated)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ssmlm.models import (
    build_classifier,
    build_mlm,
    build_multiple_choice,
    build_span,
    count_params,
    model_class,
)
from ssmlm.models.config import FAMILIES, fields_of
from ssmlm.models.flops import abstract, flops_per_token
from ssmlm.recipe import ModelConfig, load_recipe

ARCHS = ["bigs", "stack_ssm", "gated_att", "bert", "gmlp", "amlp"]
ATTENTION = {"bert", "gated_att"}


def tiny(arch, **kw):
    base = dict(
        arch=arch,
        vocab_size=40,
        hidden_size=16,
        num_layers=2,
        intermediate_size=32,
        max_seq_length=12,
        num_ssm=8,
        num_heads=2,
        tiny_attention_size=8,
        dropout=0.0,
    )
    own = fields_of(arch)  # each family has its own fields
    return ModelConfig(**{**{k: v for k, v in base.items() if k in own}, **kw})


def encoder(arch, seed=0, **kw):
    return model_class(arch)(tiny(arch, **kw), rngs=nnx.Rngs(params=seed))


def make_nontrivial(model, seed=1):
    """Random values for every parameter (init zeros/ones would hide dependencies, e.g. gMLP's W≈0)."""
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [(x + 0.3 * jax.random.normal(k, x.shape)).astype(x.dtype) for x, k in zip(leaves, keys, strict=True)]
    nnx.update(model, jax.tree.unflatten(tree, new))
    return model


def test_registry_covers_every_arch():
    from ssmlm.models import is_lm

    assert {a for a in FAMILIES if not is_lm(a)} == set(ARCHS)
    assert {a for a in FAMILIES if is_lm(a)} == {"gated_ssm", "gated_ssm_plus", "hawk", "transformer_lm"}


@pytest.mark.parametrize("arch", ARCHS)
def test_shapes_and_heads(arch):
    cfg = tiny(arch)
    ids = jnp.ones((3, 12), jnp.int32)
    mask = jnp.ones((3, 12), jnp.int32)
    assert encoder(arch)(ids).shape == (3, 12, 16)
    assert build_mlm(cfg)(ids).shape == (3, 12, 40)
    assert build_mlm(cfg)(ids, positions=jnp.zeros((3, 4), jnp.int32)).shape == (3, 4, 40)
    assert build_classifier(cfg, 5)(ids, mask).shape == (3, 5)
    start, end = build_span(cfg)(ids, mask)
    assert start.shape == end.shape == (3, 12)
    assert build_multiple_choice(cfg)(jnp.ones((2, 4, 12), jnp.int32), jnp.ones((2, 4, 12), jnp.int32)).shape == (2, 4)


@pytest.mark.parametrize("arch", ARCHS)
def test_bidirectional(arch):
    """An output depends on tokens on both sides (gradient w.r.t. the input embeddings)."""
    enc = make_nontrivial(encoder(arch))
    x = jax.random.normal(jax.random.key(0), (1, 12, 16))

    def out_at(x, i=6):
        h = x
        for layer in enc.layers:
            h = layer(h, jnp.ones((1, 12), jnp.int32), None)
        return h[0, i].sum()

    g = np.abs(np.asarray(jax.grad(out_at)(x)))[0].sum(-1)
    assert g[:6].max() > 1e-6 and g[7:].max() > 1e-6, g


@pytest.mark.parametrize("arch", ARCHS)
def test_deterministic_for_a_seed(arch):
    ids = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % 40
    a, b, c = encoder(arch, seed=3)(ids), encoder(arch, seed=3)(ids), encoder(arch, seed=4)(ids)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_behaviour(arch):
    """Every family ignores what the pads hold (attention masks them; SSM inputs and gMLP's spatial input are
    zeroed there, model.mask_padding). With mask_padding off — the official BiGS code, the gMLP paper — the
    backward SSM and the spatial projection read the pads."""
    enc = make_nontrivial(encoder(arch))
    ids = jnp.array([[5, 6, 7, 8, 9, 10, 11, 12, 0, 0, 0, 0]], jnp.int32)
    other = ids.at[0, 8:].set(jnp.array([13, 14, 15, 16]))
    mask = (ids != 0).astype(jnp.int32)
    a, b = np.asarray(enc(ids, None, mask))[0, :8], np.asarray(enc(other, None, mask))[0, :8]
    np.testing.assert_allclose(a, b, atol=1e-5)
    if arch not in ATTENTION:
        official = make_nontrivial(encoder(arch, mask_padding=False))
        a, b = np.asarray(official(ids, None, mask))[0, :8], np.asarray(official(other, None, mask))[0, :8]
        assert not np.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_prediction_does_not_depend_on_batch_padding(arch):
    """A sentence's logits are the same whether its batch pads it to 12 or to 32 positions (as `task.padding:
    longest` does with batches of different longest sentences), with every family's own pooler."""
    cfg = tiny(arch, max_seq_length=32)
    model = make_nontrivial(build_classifier(cfg, 3))
    sent = jnp.array([2, 5, 6, 7, 8, 9, 10, 3], jnp.int32)
    logits = []
    for width in (12, 20, 32):
        ids = jnp.zeros((1, width), jnp.int32).at[0, :8].set(sent)
        logits.append(np.asarray(model(ids, (ids != 0).astype(jnp.int32))))
    np.testing.assert_allclose(logits[0], logits[1], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(logits[0], logits[2], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["bigs", "bert"])
def test_remat_and_bf16_compute_give_the_same_function(arch):
    ids = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % 40
    ref = np.asarray(build_mlm(tiny(arch))(ids))
    np.testing.assert_allclose(np.asarray(build_mlm(tiny(arch, remat=True))(ids)), ref, rtol=1e-5, atol=1e-5)
    grads = nnx.grad(lambda m: m(ids).sum())(build_mlm(tiny(arch, remat=True)))
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
    low = np.asarray(build_mlm(tiny(arch, compute_dtype="bfloat16"))(ids))
    np.testing.assert_allclose(low, ref, atol=0.1)


def test_per_channel_ssm_kernels():
    enc = encoder("bigs", ssm_kernels="per_channel")
    ssm = enc.layers[0].ssm_f
    assert ssm.C.shape == (16, 8, 2) and ssm.kernel(12).shape == (16, 12)
    # channels now differ: a constant input gives different outputs per channel
    y = np.asarray(ssm(jnp.ones((1, 12, 16))))
    assert np.std(y[0, -1]) > 1e-3


@pytest.mark.parametrize("arch", ["bert", "stack_ssm"])
def test_pre_ln_is_the_default_and_has_final_norm(arch):
    """Stacked baselines are pre-LN by default (academic-budget-bert's BERT, the setting BiGS Table 1 cites):
    LayerNorm before each sublayer and one after the last layer; post-LN (BERT's original) is an option."""
    post, pre = encoder(arch, stack_norm="post"), encoder(arch)
    assert ModelConfig(arch=arch).stack_norm == "pre" and load_recipe("bert_large").model.stack_norm == "pre"
    assert post.final_norm is None and pre.final_norm is not None
    assert pre.layers[0].pre_norm and not post.layers[0].pre_norm
    # pre-LN: the residual stream passes unnormalised between layers; post-LN normalises every layer output
    x = jax.random.normal(jax.random.key(0), (2, 12, pre.cfg.hidden_size)) * 5.0
    mask = jnp.ones((2, 12), jnp.int32)
    y_post = post.layers[0](x, mask)
    assert np.allclose(np.asarray(y_post).std(-1), 1.0, atol=0.05)
    y_pre = pre.layers[0](x, mask)
    assert np.asarray(y_pre).std(-1).mean() > 3.0
    ids = jnp.ones((1, 12), jnp.int32)
    assert pre(ids).shape == post(ids).shape


# Paper parameter counts (MLM model, tied decoder). BiGS/BERT figures from docs/faithfulness.md#bigs-param-counts
# and the paper ("~350M", BERT-large 335M at 512 positions). gMLP/aMLP: gMLP paper Table 5 (130M/365M/941M;
# aMLP 109M/316M).
PAPER = {
    "bigs_full": (346_314_134 + 2 * 1024, 0.0),  # official count + ssmlm's final LayerNorm (final_norm)
    "bigs_512": (346_707_350 + 2 * 1024, 0.0),
    "bigs_12l_4096": (119_000_000, 0.02),
    "bert_large": (335_000_000, 0.02),
    "stack_ssm": (346_000_000, 0.04),  # 24 stacked layers are matched to the gated model's 23
    "gated_att": (346_314_134, 0.01),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_recipe_parameter_counts(name):
    r = load_recipe(name)
    cfg = ModelConfig(**{**r.model.__dict__, "vocab_size": 30522})
    n = count_params(abstract(lambda: build_mlm(cfg)))
    target, tol = PAPER[name]
    assert abs(n - target) <= tol * target + 1, f"{name}: {n:,} vs {target:,}"


def test_gated_vs_stack_accounting():
    """Paper Section 4: a gated layer has ≈13d² parameters, a stacked one ≈12d²."""
    d = 1024
    per_layer = {}
    for arch, inter in [("bigs", 3 * d), ("gated_att", 3 * d), ("stack_ssm", 4 * d), ("bert", 4 * d)]:
        one = ModelConfig(
            arch=arch, vocab_size=8, hidden_size=d, intermediate_size=inter, num_layers=1, max_seq_length=8
        )
        two = ModelConfig(**{**one.__dict__, "num_layers": 2})
        per_layer[arch] = count_params(abstract(lambda c=two: build_mlm(c))) - count_params(
            abstract(lambda c=one: build_mlm(c))
        )
    assert abs(per_layer["bigs"] / d**2 - 13) < 0.05 and abs(per_layer["gated_att"] / d**2 - 13) < 0.05
    assert abs(per_layer["bert"] / d**2 - 12) < 0.05 and abs(per_layer["stack_ssm"] / d**2 - 12) < 0.05


def test_flops_per_token_attention_grows_with_length():
    cfg = ModelConfig(arch="bert", vocab_size=30522, hidden_size=1024, num_layers=24, intermediate_size=4096)
    m = abstract(lambda: build_mlm(cfg))
    f128, f4096 = flops_per_token(m, cfg, 128), flops_per_token(m, cfg, 4096)
    assert f4096 - f128 == pytest.approx(12 * (4096 - 128) * 1024 * 24)
    n = count_params(m) - (30522 + 128 + 2) * 1024
    assert f128 == pytest.approx(6 * n + 12 * 128 * 1024 * 24, rel=0.01)


def test_each_family_pools_as_its_paper():
    """BERT and gMLP/aMLP classify from the [CLS] token (BERT's pooler: Dense + tanh of the first token); BiGS
    and its ablations average the non-padding tokens (official BiGS code); model.pooler overrides."""
    from ssmlm.models.heads import Pooler, pooler_kind

    expect = {
        "bert": "cls",
        "gmlp": "cls",
        "amlp": "cls",
        "bigs": "non_padding_mean",
        "stack_ssm": "non_padding_mean",
        "gated_att": "non_padding_mean",
    }
    for arch, kind in expect.items():
        assert pooler_kind(tiny(arch)) == kind
        assert build_classifier(tiny(arch), 2).pooler.kind == kind
        for name in {"bert": ["bert_large"], "gmlp": ["gmlp_base"], "bigs": ["bigs_full", "default"]}.get(arch, []):
            assert pooler_kind(load_recipe(name).model) == kind
    assert pooler_kind(tiny("bert", pooler="non_padding_mean")) == "non_padding_mean"

    h = jax.random.normal(jax.random.key(0), (2, 6, 16))
    mask = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], jnp.int32)
    for kind, reads in [("cls", [0]), ("non_padding_mean", [0, 1, 2, 3])]:
        pool = Pooler(tiny("bert", pooler=kind), rngs=nnx.Rngs(params=0))
        jac = jax.jacobian(lambda x, pool=pool: pool(x, mask)[0])(h)  # (d, B, L, d): positions of row 0 it reads
        used = np.flatnonzero(np.abs(np.asarray(jac[:, 0])).sum((0, 2)) > 0)
        assert used.tolist() == reads, kind
        np.testing.assert_allclose(
            np.asarray(pool(h, mask)),
            np.tanh(
                np.asarray(
                    pool.dense(h[:, 0] if kind == "cls" else (h * mask[..., None]).sum(1) / mask.sum(1)[:, None])
                )
            ),
            atol=1e-6,
        )


def test_padding_longest_is_refused_where_padding_would_change_predictions():
    from ssmlm.errors import UserError
    from ssmlm.train.parts.task import check_padding

    for arch in ARCHS:
        check_padding(tiny(arch), "longest")  # default: every family is padding-invariant
        check_padding(tiny(arch, mask_padding=False), "max_length")  # the official fixed length is always fine
        if arch not in ATTENTION:
            with pytest.raises(UserError, match="mask_padding"):
                check_padding(tiny(arch, mask_padding=False), "longest")
    with pytest.raises(UserError, match="pooler"):
        check_padding(tiny("bigs", pooler="mean"), "longest")


def test_runs_written_before_the_layout_options_keep_their_layout(tmp_path):
    """A run directory from before final_norm / mask_padding existed lists every model field of its time but
    not these; it opens with the layout it was trained with (no final norm, padding unmasked), so its
    checkpoint still fits. A current run's recipe.yaml is read as written."""
    import json

    import yaml

    from ssmlm.recipe import Recipe
    from ssmlm.runs import open_run

    current = Recipe(model=tiny("bigs")).to_dict()
    old = json.loads(json.dumps(current))
    for key in ("final_norm", "mask_padding", "gate_norm"):
        del old["model"][key]
    for name, data in (("old", old), ("new", current)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "recipe.yaml").write_text(yaml.safe_dump(data))
        (tmp_path / name / "run.json").write_text(json.dumps({"kind": "pretrain"}))
    m_old, m_new = open_run(tmp_path / "old").recipe.model, open_run(tmp_path / "new").recipe.model
    assert (m_old.final_norm, m_old.mask_padding, m_old.gate_norm) == (False, False, False)
    assert (m_new.final_norm, m_new.mask_padding) == (True, True)
