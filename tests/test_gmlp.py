"""gMLP / aMLP (ssmlm.models.gmlp, "Pay Attention to MLPs"): shapes, the FFN-at-init property, the Toeplitz
build, causality, every Table-3 variant, the aMLP tiny attention, length extension and the paper's
parameter counts. Everything that runs uses tiny sizes; full-size counts never allocate (nnx.eval_shape).
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numerics import EPS32, assert_close_scaled
from scipy.special import erf

from ssmlm.models import build_classifier, build_mlm, count_params
from ssmlm.models.flops import abstract as flops_abstract
from ssmlm.models.gmlp import (
    GMLP_SIZES,
    SPATIAL_INIT_EPS,
    GMLPBlock,
    extend_params,
    param_count_formula,
    spatial_matrix,
    toeplitz,
)
from ssmlm.recipe import ModelConfig

V, D, F, N, A = 50, 16, 32, 8, 8
SGUS = ["split_multiplicative", "multiplicative", "additive", "linear"]


def cfg_small(**kw) -> ModelConfig:
    base = dict(
        arch="gmlp",
        vocab_size=V,
        hidden_size=D,
        num_layers=2,
        intermediate_size=F,
        max_seq_length=N,
        tiny_attention_size=A,
    )
    base.update(kw)
    return ModelConfig(**base)


def arr(p) -> np.ndarray:
    return np.asarray(p[...], np.float64)


def randomize_spatial(model: nnx.Module, seed: int = 0, scale: float = 0.3) -> None:
    """Give every spatial kernel non-trivial values (at init W ≈ 0 and nothing mixes across tokens)."""
    key = jax.random.key(seed)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if path[-2:] == ("spatial", "kernel"):
            key, sub = jax.random.split(key)
            var.set_value(scale * jax.random.normal(sub, var.get_value().shape))


def ids_and_types(batch: int, length: int, seed: int = 0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return jax.random.randint(k1, (batch, length), 0, V), jax.random.randint(k2, (batch, length), 0, 2)


# ----------------------------------------------------------------------------- shapes and variants


@pytest.mark.parametrize("arch", ["gmlp", "amlp"])
@pytest.mark.parametrize("sgu", SGUS)
@pytest.mark.parametrize("spatial", ["toeplitz", "dense"])
def test_every_variant_builds_runs_and_counts(arch, sgu, spatial):
    cfg = cfg_small(arch=arch, sgu=sgu, spatial=spatial, num_layers=1)
    model = build_mlm(cfg)
    ids, types = ids_and_types(2, N)
    logits = model(ids, token_type_ids=types)
    assert logits.shape == (2, N, V) and bool(jnp.isfinite(logits).all())
    assert count_params(model) == param_count_formula(cfg)["mlm_total"]
    gate = F // 2 if sgu == "split_multiplicative" else F
    block = model.encoder.layers[0]
    assert block.proj_out.kernel.shape == (gate, D)  # V reads the gate width
    assert block.sgu.spatial.kernel.shape == ((2 * N - 1,) if spatial == "toeplitz" else (N, N))


def test_shapes_short_inputs_heads_and_too_long():
    cfg = cfg_small(arch="amlp")
    model = build_mlm(cfg)
    ids, types = ids_and_types(3, 5)  # shorter than n: uses W[:5, :5], b[:5]
    assert model.encoder(ids, types).shape == (3, 5, D)
    positions = jnp.array([[0, 2], [1, 4], [3, 3]])
    assert model(ids, positions=positions, token_type_ids=types).shape == (3, 2, V)
    assert model.encoder.word_embeddings().shape == (V, D)
    assert model.encoder.spatial_weights().shape == (2, N, N)
    clf = build_classifier(cfg, num_labels=3)
    mask = jnp.array([[1, 1, 1, 0, 0]] * 3)
    assert clf(ids, mask, types).shape == (3, 3)
    too_long, _ = ids_and_types(1, N + 1)
    with pytest.raises(ValueError, match="max_seq_length"):
        model.encoder(too_long)


def test_no_position_embeddings_and_transfer_names():
    model = build_mlm(cfg_small())
    emb = model.encoder.embeddings
    assert emb.position is None
    assert {"word", "token_type", "norm"} <= set(vars(emb))


# ----------------------------------------------------------------------------- Toeplitz spatial weights


def test_toeplitz_matches_explicit_loops():
    n = 6
    w = jax.random.normal(jax.random.key(1), (2 * n - 1,))
    ref = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            ref[i, j] = float(w[i - j + n - 1])  # diagonal offset i - j, centred at index n - 1
    np.testing.assert_array_equal(np.asarray(toeplitz(w, n)), ref)
    for length in (1, 3, n):  # shorter inputs read the top-left block
        np.testing.assert_array_equal(np.asarray(spatial_matrix(w, length)), ref[:length, :length])
        np.testing.assert_array_equal(
            np.asarray(spatial_matrix(w, length, causal=True)), np.tril(ref[:length, :length])
        )
    dense = jax.random.normal(jax.random.key(2), (n, n))
    np.testing.assert_array_equal(np.asarray(spatial_matrix(dense, 4)), np.asarray(dense)[:4, :4])
    with pytest.raises(ValueError):
        toeplitz(w[:-1], n)


# ----------------------------------------------------------------------------- at init every block is an FFN


def ln_ref(x, scale, bias, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def gelu_ref(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def ffn_ref(block: GMLPBlock, x: np.ndarray, sgu: str, eps: float) -> np.ndarray:
    """Y = s(GELU(LN(X) U)) V + X with the spatial gate f replaced by its init value 1 (paper Section 2.1)."""
    xh = ln_ref(x, arr(block.norm.scale), arr(block.norm.bias), eps)
    z = gelu_ref(xh @ arr(block.proj_in.kernel) + arr(block.proj_in.bias))
    if sgu == "split_multiplicative":
        s = z[..., : z.shape[-1] // 2] * 1.0
    elif sgu == "multiplicative":
        s = z * 1.0
    else:  # additive: Z + 1
        s = z + 1.0
    return s @ arr(block.proj_out.kernel) + arr(block.proj_out.bias) + x


@pytest.mark.parametrize("sgu", ["split_multiplicative", "multiplicative", "additive"])
def test_block_at_init_equals_plain_ffn(sgu):
    cfg = cfg_small(sgu=sgu, initializer_range=0.5)  # large U, V so the FFN branch is far from zero
    block = GMLPBlock(cfg, rngs=nnx.Rngs(params=3))
    kernel = arr(block.sgu.spatial.kernel)
    assert 0.0 < np.abs(kernel).max() <= SPATIAL_INIT_EPS / N  # near zero but not zero
    np.testing.assert_array_equal(arr(block.sgu.spatial.bias), np.ones(N))
    x = np.asarray(jax.random.normal(jax.random.key(0), (2, N, D)), np.float64)
    out = np.asarray(block(jnp.asarray(x, jnp.float32)), np.float64)
    ref = ffn_ref(block, x, sgu, cfg.layer_norm_eps)
    branch, ref_branch = out - x, ref - x
    # |f - 1| ≤ ε·max|LN(Z)| at init, so the FFN branch is off by about 1e-3 relative, no more
    rel = np.linalg.norm(branch - ref_branch) / np.linalg.norm(ref_branch)
    assert 1e-7 < rel < 5e-3, rel
    # with W exactly 0 the gate is exactly b = 1
    block.sgu.spatial.kernel.set_value(jnp.zeros_like(block.sgu.spatial.kernel[...]))
    out0 = np.asarray(block(jnp.asarray(x, jnp.float32)), np.float64)
    np.testing.assert_allclose(out0 - x, ref_branch, rtol=1e-4, atol=1e-4 * np.abs(ref_branch).max())


# ----------------------------------------------------------------------------- causality / bidirectionality


def block_jacobian(cfg: ModelConfig) -> np.ndarray:
    """|∂out[i, :] / ∂in[j, :]| summed over channels: (L, L), for one sequence on continuous inputs."""
    block = GMLPBlock(cfg, rngs=nnx.Rngs(params=0))
    randomize_spatial(block)
    x = jax.random.normal(jax.random.key(4), (1, N, D))
    jac = jax.jacrev(lambda v: block(v[None])[0])(x[0])  # (L, d, L, d)
    return np.abs(np.asarray(jac)).sum(axis=(1, 3))


@pytest.mark.parametrize("arch", ["gmlp", "amlp"])
@pytest.mark.parametrize("spatial", ["toeplitz", "dense"])
def test_causal_block_never_looks_ahead(arch, spatial):
    dep = block_jacobian(cfg_small(arch=arch, spatial=spatial, causal=True))
    assert np.all(np.triu(dep, k=1) == 0.0)  # output i does not depend on any input j > i, exactly
    assert np.all(np.tril(dep, k=-1)[np.tril_indices(N, -1)] > 0)  # but does on every j < i


@pytest.mark.parametrize("arch", ["gmlp", "amlp"])
def test_bidirectional_block_sees_both_sides(arch):
    dep = block_jacobian(cfg_small(arch=arch, causal=False))
    off = ~np.eye(N, dtype=bool)
    assert np.all(dep[off] > 0)  # every position depends on every other, before and after


# ----------------------------------------------------------------------------- aMLP


def test_amlp_with_zero_attention_output_equals_gmlp():
    # without the final LayerNorm, so that the last check sees the attention's contribution unnormalised
    amlp = build_mlm(cfg_small(arch="amlp", final_norm=False), seed=5)
    randomize_spatial(amlp, seed=1)
    for i, layer in enumerate(amlp.encoder.layers):
        layer.attn.out.kernel.set_value(jnp.zeros_like(layer.attn.out.kernel[...]))
        layer.attn.out.bias.set_value(jnp.zeros_like(layer.attn.out.bias[...]))
        amlp.encoder.layers[i] = layer  # a copy in the scanned layout: write it back
    gmlp = build_mlm(cfg_small(arch="gmlp", final_norm=False), seed=7)
    src = dict(nnx.to_flat_state(nnx.state(amlp, nnx.Param)))
    flat = [(p, v.replace(src[p].get_value())) for p, v in nnx.to_flat_state(nnx.state(gmlp, nnx.Param))]
    nnx.update(gmlp, nnx.from_flat_state(flat))
    ids, types = ids_and_types(2, N)
    mask = jnp.array([[1] * N, [1] * 5 + [0] * 3])
    a = amlp.encoder(ids, types, mask)
    g = gmlp.encoder(ids, types, mask)
    np.testing.assert_allclose(np.asarray(a), np.asarray(g), rtol=1e-6, atol=1e-6)
    # and the attention is not a no-op once its output projection is back
    layer = amlp.encoder.layers[0]
    layer.attn.out.kernel.set_value(jax.random.normal(jax.random.key(3), (A, F // 2)))
    amlp.encoder.layers[0] = layer
    assert np.abs(np.asarray(amlp.encoder(ids, types, mask)) - np.asarray(g)).max() > 1e-3


def test_amlp_attention_respects_padding_mask():
    cfg = cfg_small(arch="amlp", initializer_range=0.5)
    block = GMLPBlock(cfg, rngs=nnx.Rngs(params=2))
    # W = 0: the SGU itself then mixes no tokens, so any influence of the padding goes through the attention
    block.sgu.spatial.kernel.set_value(jnp.zeros_like(block.sgu.spatial.kernel[...]))
    real = 5
    x = jax.random.normal(jax.random.key(0), (1, N, D))
    x2 = x.at[:, real:].set(jax.random.normal(jax.random.key(1), (1, N - real, D)))  # other padding content
    mask = jnp.array([[1] * real + [0] * (N - real)])
    np.testing.assert_allclose(
        np.asarray(block(x, mask)[:, :real]), np.asarray(block(x2, mask)[:, :real]), rtol=1e-6, atol=1e-6
    )
    assert not np.allclose(np.asarray(block(x)[:, :real]), np.asarray(block(x2)[:, :real]), atol=1e-4)


# ----------------------------------------------------------------------------- determinism, remat


def test_deterministic_for_a_fixed_seed():
    cfg = cfg_small(arch="amlp")
    ids, types = ids_and_types(2, N)
    a, b, c = build_mlm(cfg, seed=0), build_mlm(cfg, seed=0), build_mlm(cfg, seed=1)
    np.testing.assert_array_equal(np.asarray(a(ids, token_type_ids=types)), np.asarray(b(ids, token_type_ids=types)))
    assert not np.allclose(np.asarray(a(ids, token_type_ids=types)), np.asarray(c(ids, token_type_ids=types)))
    rng = jax.random.key(9)  # dropout: the same key gives the same output, no key means no dropout
    np.testing.assert_array_equal(np.asarray(a(ids, rng=rng)), np.asarray(a(ids, rng=rng)))
    assert not np.allclose(np.asarray(a(ids, rng=rng)), np.asarray(a(ids)))


def test_remat_gives_the_same_loss_and_gradients():
    ids, types = ids_and_types(2, N)

    def loss_and_grads(remat):
        model = build_mlm(cfg_small(num_layers=1, remat=remat), seed=0)
        randomize_spatial(model)
        graphdef, params = nnx.split(model, nnx.Param)
        loss = lambda p: nnx.merge(graphdef, p)(ids, token_type_ids=types).std()  # noqa: E731
        fn = jax.value_and_grad(loss)
        assert ("remat" in str(jax.make_jaxpr(fn)(params))) == remat  # the rematerialisation is in the graph
        return jax.jit(fn)(params)

    (l0, g0), (l1, g1) = loss_and_grads(False), loss_and_grads(True)
    np.testing.assert_allclose(float(l0), float(l1), rtol=1e-6)
    # the recomputed forward pass may be fused and ordered differently: the gradients agree to float32 rounding of
    # each row, and at least 1e-3 of the largest gradient, which the shared cotangents carry to every leaf
    # (tests/numerics.py). Measured ≤ 4ε of that scale (AVX-512, SSE4.2); 64ε leaves a 16x margin.
    floor = 1e-3 * max(float(np.abs(x).max()) for x in jax.tree.leaves(g0))
    g1 = dict(jax.tree_util.tree_leaves_with_path(g1))
    for path, x in jax.tree_util.tree_leaves_with_path(g0):
        assert_close_scaled(g1[path], x, rtol=64 * EPS32, floor=floor, name=jax.tree_util.keystr(path))


# ----------------------------------------------------------------------------- length extension


def extend_like_transplant(target: nnx.Module, source: nnx.Module) -> None:
    """What extend-length does: copy equal shapes by path, ask extend_params for the rest."""
    src = dict(nnx.to_flat_state(nnx.state(source, nnx.Param)))
    flat = []
    for path, var in nnx.to_flat_state(nnx.state(target, nnx.Param)):
        old, new = src[path].get_value(), var.get_value()
        value = old if old.shape == new.shape else extend_params(path, old, new.shape)
        assert value is not None, path
        flat.append((path, var.replace(value)))
    nnx.update(target, nnx.from_flat_state(flat))


@pytest.mark.parametrize("spatial", ["toeplitz", "dense"])
@pytest.mark.parametrize("arch", ["gmlp", "amlp"])
def test_extend_params_keeps_short_inputs_unchanged(spatial, arch):
    short = build_mlm(cfg_small(arch=arch, spatial=spatial), seed=0)
    randomize_spatial(short)
    for i, layer in enumerate(short.encoder.layers):  # trained-looking biases, so "old then ones" is visible
        layer.sgu.spatial.bias.set_value(1.0 + 0.1 * jnp.arange(N, dtype=jnp.float32))
        short.encoder.layers[i] = layer  # a copy in the scanned layout: write it back
    long = build_mlm(cfg_small(arch=arch, spatial=spatial, max_seq_length=2 * N), seed=1)
    extend_like_transplant(long, short)

    old_k, new_k = (
        arr(short.encoder.layers[0].sgu.spatial.kernel),
        arr(long.encoder.layers[0].sgu.spatial.kernel),
    )
    if spatial == "toeplitz":
        assert new_k.shape == (4 * N - 1,)
        np.testing.assert_array_equal(new_k[N : 3 * N - 1], old_k)  # offsets -(N-1)..N-1 kept, centred
        np.testing.assert_array_equal(new_k[:N], 0.0)
        np.testing.assert_array_equal(new_k[3 * N - 1 :], 0.0)
    else:
        np.testing.assert_array_equal(new_k[:N, :N], old_k)
        assert not new_k[N:].any() and not new_k[:, N:].any()
    new_b = arr(long.encoder.layers[0].sgu.spatial.bias)
    np.testing.assert_allclose(new_b, np.concatenate([1.0 + 0.1 * np.arange(N), np.ones(N)]), rtol=1e-6)

    ids, types = ids_and_types(2, N)
    out_long, out_short = long(ids, token_type_ids=types), short(ids, token_type_ids=types)
    np.testing.assert_allclose(np.asarray(out_long), np.asarray(out_short), rtol=1e-5, atol=1e-5)
    longer, _ = ids_and_types(2, 2 * N)
    assert long(longer).shape == (2, 2 * N, V)


def test_extend_params_ignores_other_paths_and_can_crop():
    assert extend_params(("encoder", "embeddings", "word", "embedding"), jnp.zeros((3, 4)), (5, 4)) is None
    assert extend_params(("encoder", "layers", 0, "sgu", "norm", "bias"), jnp.zeros((4,)), (8,)) is None
    w = jnp.arange(2 * N - 1, dtype=jnp.float32)
    path = ("encoder", "layers", 0, "sgu", "spatial", "kernel")
    cropped = extend_params(path, w, (2 * 4 - 1,))  # n 8 -> 4: the centred 7 diagonals
    np.testing.assert_array_equal(np.asarray(toeplitz(cropped, 4)), np.asarray(toeplitz(w, N))[:4, :4])


# ----------------------------------------------------------------------------- the paper's parameter counts


def mlm_count(cfg: ModelConfig) -> int:
    """Parameters of encoder + MLM head (dense d×d transform, LayerNorm, output bias; the decoder is tied to
    the word embeddings), counted from an abstract model (nothing allocated). Deep models are counted from
    1- and 2-block builds (blocks are identical), because tracing hundreds of blocks is slow."""

    def count(layers):
        abstract = flops_abstract(lambda: build_mlm(dataclasses.replace(cfg, num_layers=layers)))
        return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))

    one, two = count(1), count(2)
    return one + (cfg.num_layers - 1) * (two - one)


def paper_cfg(layers, d, ffn, attn=None, **kw) -> ModelConfig:
    arch = "amlp" if attn else "gmlp"
    return ModelConfig(
        arch=arch,
        vocab_size=30522,
        hidden_size=d,
        num_layers=layers,
        intermediate_size=ffn,
        max_seq_length=128,
        tiny_attention_size=attn or 64,
        **kw,
    )


@pytest.mark.parametrize("name", list(GMLP_SIZES))
def test_param_counts_match_the_paper(name):
    """Tables 3-5 (Table 6 for the aMLP attention sizes), with the BERT vocabulary and n = 128: within 2%."""
    layers, d, ffn, attn, paper_m = GMLP_SIZES[name]
    cfg = paper_cfg(layers, d, ffn, attn)
    total = mlm_count(cfg)
    assert total == param_count_formula(cfg)["mlm_total"]
    assert abs(total / 1e6 - paper_m) / paper_m < 0.02, (name, total)


def test_param_count_extrapolation_is_exact_for_gmlp_base():
    cfg = paper_cfg(48, 512, 3072)
    abstract = flops_abstract(lambda: build_mlm(cfg))
    assert count_params(abstract) == mlm_count(cfg) == param_count_formula(cfg)["mlm_total"]


@pytest.mark.parametrize(
    "layers, ffn, sgu, paper_m",
    [
        (18, 3072, "split_multiplicative", 59),  # Table 4
        (72, 3072, "split_multiplicative", 187),  # Table 4
        (144, 3072, "split_multiplicative", 357),  # Table 4
        (36, 2048, "multiplicative", 92),  # Table 3 non-split rows: matched by d_ffn 2048 (module docstring)
    ],
)
def test_param_counts_tables_3_and_4(layers, ffn, sgu, paper_m):
    total = param_count_formula(paper_cfg(layers, 512, ffn, sgu=sgu))["mlm_total"]
    assert abs(total / 1e6 - paper_m) / paper_m < 0.02, total


@pytest.mark.parametrize("name", ["gmlp_base", "gmlp_ablation", "amlp_base"])
def test_dry_run_prints_the_papers_count_with_the_recipes_own_vocabulary(name):
    """`ssmlm pretrain gmlp_base --dry-run` builds from the recipe as shipped (its BERT-sized WordPiece and C4
    source, no data read) and lands on Table 5's / Table 3's count."""
    from ssmlm.recipe import load_recipe
    from ssmlm.train.plan import plan

    recipe = load_recipe(name)
    assert recipe.data.vocab_size == 30522 and recipe.data.source.startswith("hub:allenai/c4")
    p = plan(recipe)
    paper = {"gmlp_base": 130e6, "gmlp_ablation": 102e6, "amlp_base": 109e6}[name]
    assert p["vocab_size"] == 30522
    assert abs(p["params_total"] - paper) / paper < 0.01, p["params_total"]
