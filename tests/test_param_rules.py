"""Parameter rules (ssmlm.models.rules): first match wins, what each rule caught, the two mistakes, frozen
parameters, user rules from a recipe, and the default rules reproducing the optimizer they replaced."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import invoke, tiny_recipe
from flax import nnx

from ssmlm.errors import RecipeError
from ssmlm.models import build_mlm, count_params
from ssmlm.models.config import fields_of
from ssmlm.models.rules import SSM_PATTERN, ParamRule, assign, path_name
from ssmlm.recipe import ModelConfig, TrainConfig, load_recipe
from ssmlm.train.optim import make_optimizer, param_rules


def tiny(arch: str) -> ModelConfig:
    base = dict(
        arch=arch,
        vocab_size=30,
        hidden_size=8,
        num_layers=2,
        intermediate_size=16,
        max_seq_length=8,
        num_ssm=4,
        num_heads=2,
        tiny_attention_size=4,
        scan_layers=False,
    )
    # unrolled, so tensor counts are per layer (the scanned layout's one stacked tensor per parameter is
    # covered by test_rules_do_not_depend_on_layer_indices and tests/test_scan.py)
    return ModelConfig(**{k: v for k, v in base.items() if k in fields_of(arch)})


def params_of(arch: str):
    return nnx.state(build_mlm(tiny(arch)), nnx.Param)


def names(params) -> list[str]:
    return [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


def steps(tx, params, n=3, seed=0):
    """Updates of ``n`` steps on random gradients (the same gradients for any optimizer)."""
    state, out = tx.init(params), []
    for i in range(n):
        key = jax.random.fold_in(jax.random.key(seed), i)
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(key, len(leaves))
        grads = treedef.unflatten([jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)])
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        out.append(updates)
    return out, params, state


# ----------------------------------------------------------------------------- the optimizer before rules


def old_optimizer(cfg: TrainConfig, total: int) -> optax.GradientTransformation:
    """ssmlm.train.optim.make_optimizer as it was before parameter rules, with its two name tests."""
    from ssmlm.train.optim import schedule

    def decay_mask(params):
        def keep(path, _):
            names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
            names = [n for n in names if n != "value"]
            return names[-1] not in ("bias", "scale")

        return jax.tree_util.tree_map_with_path(keep, params)

    def is_ssm(path) -> bool:
        return any(str(getattr(k, "key", getattr(k, "name", ""))).startswith("ssm") for k in path)

    lr = schedule(cfg, total)
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
    adamw = lambda rate, wd: optax.adamw(  # noqa: E731
        rate, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=wd, mask=decay_mask
    )
    if cfg.ssm_lr_multiplier == 1.0 and cfg.ssm_weight_decay:
        parts.append(adamw(lr, cfg.weight_decay))
    else:
        ssm_lr = lambda step: lr(step) * cfg.ssm_lr_multiplier  # noqa: E731
        groups = {
            "default": adamw(lr, cfg.weight_decay),
            "ssm": adamw(ssm_lr, cfg.weight_decay if cfg.ssm_weight_decay else 0.0),
        }
        labels = lambda tree: jax.tree_util.tree_map_with_path(lambda p, _: "ssm" if is_ssm(p) else "default", tree)  # noqa: E731
        parts.append(optax.multi_transform(groups, labels))
    return optax.chain(*parts)


OLD_SETTINGS = [
    {},  # the official BiGS setup: one AdamW
    {"grad_clip": 1.0, "weight_decay": 0.1},
    {"ssm_lr_multiplier": 0.1},
    {"ssm_lr_multiplier": 0.25, "ssm_weight_decay": False},
]


@pytest.mark.parametrize("arch", ["bigs", "gmlp"])
@pytest.mark.parametrize("setting", OLD_SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "default")
def test_default_rules_reproduce_the_old_optimizer(arch, setting):
    """Bit for bit, every step, and the same optimizer-state layout (old checkpoints resume). The old masks are
    reimplemented above: decay everything but biases and LayerNorm scales, SSM group under `ssm*` modules."""
    cfg = TrainConfig(steps=10, warmup_steps=2, learning_rate=1e-2, **setting)
    params = params_of(arch)
    new = make_optimizer(cfg, 10, params, tiny(arch))
    old = old_optimizer(cfg, 10)
    got, p_new, s_new = steps(new.tx, params)
    want, p_old, s_old = steps(old, params)
    for a, b in zip(jax.tree.leaves(got + [p_new]), jax.tree.leaves(want + [p_old]), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
    if arch == "bigs" or not setting:  # the old one gave gMLP an empty 'ssm' group; it has none now
        assert jax.tree.structure(s_new) == jax.tree.structure(s_old)


def test_ssm_weight_decay_off_alone_matches_the_old_values():
    """The old optimizer made a second group for it (decay rate 0); the rules mask decay instead, in one group.
    Same values; the state layout differs (such a run's old checkpoints restart their optimizer state)."""
    cfg = TrainConfig(steps=10, warmup_steps=0, learning_rate=1e-2, ssm_weight_decay=False)
    params = params_of("bigs")
    got, *_ = steps(make_optimizer(cfg, 10, params, tiny("bigs")).tx, params)
    want, *_ = steps(old_optimizer(cfg, 10), params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- semantics


def test_first_matching_rule_wins():
    params = params_of("bigs")
    rules = [
        ParamRule(r"/w_v/kernel$", lr_multiplier=0.5, name="half"),
        ParamRule(r"/kernel$", lr_multiplier=0.0, name="kernels"),  # w_v's kernels are already taken
        ParamRule(r"/w_v/", lr_multiplier=0.0, name="shadowed"),  # matches, but only what earlier rules took
        ParamRule(".*", weight_decay=False, name="rest"),
    ]
    opt = make_optimizer(TrainConfig(steps=10, warmup_steps=0, learning_rate=1.0), 10, params, rules=rules)
    caught = {c.name: c for c in opt.caught}
    assert caught["half"].tensors == 2  # one w_v kernel per layer
    assert caught["shadowed"].tensors == 1 * 2  # w_v's biases
    (updates,), *_ = steps(opt.tx, params, n=1)
    for name, u in zip(names(params), jax.tree.leaves(updates), strict=True):
        moved = bool(np.abs(np.asarray(u)).max() > 0)
        frozen = (name.endswith("/kernel") and "/w_v/" not in name) or name.endswith("/w_v/bias")
        assert moved != frozen, name


def test_counts_cover_every_parameter_once():
    for arch in ("bigs", "stack_ssm", "gated_att", "bert", "gmlp", "amlp"):
        cfg, params = tiny(arch), params_of(arch)
        caught = make_optimizer(TrainConfig(), 100, params, cfg).caught
        assert [c.name for c in caught][-2:] == ["no_decay", "default"], arch
        assert sum(c.tensors for c in caught) == len(jax.tree.leaves(params))
        assert sum(c.elements for c in caught) == count_params(build_mlm(cfg))
        ssm = [c for c in caught if c.name == "ssm"]
        if arch in ("bigs", "stack_ssm"):  # 2 SSMs x 5 tensors (4N+2 numbers) per layer
            assert (ssm[0].tensors, ssm[0].elements) == (2 * 2 * 5, 2 * 2 * (4 * 4 + 2)), arch
        else:
            assert ssm == [], arch


def test_a_rule_that_matches_nothing_is_an_error():
    rules = [ParamRule("/ssm_typo/")] + param_rules(tiny("gmlp"), TrainConfig())
    with pytest.raises(RecipeError, match="^parameter rule '/ssm_typo/' matches no parameter of the 'gmlp' model"):
        make_optimizer(TrainConfig(), 10, params_of("gmlp"), tiny("gmlp"), rules=rules)
    # the SSM rule of one family is not silently carried to another
    with pytest.raises(RecipeError, match="matches no parameter of the 'gmlp' model"):
        make_optimizer(
            TrainConfig(), 10, params_of("gmlp"), tiny("gmlp"), rules=param_rules(tiny("bigs"), TrainConfig())
        )


def test_a_parameter_no_rule_matches_is_an_error():
    """Families end with a catch-all; an exhaustive list of one's own names what it missed."""
    rules = [ParamRule(SSM_PATTERN), ParamRule(r"(^|/)(bias|scale)$"), ParamRule(r"/kernel$")]
    with pytest.raises(
        RecipeError, match=r"^parameter 'encoder/embeddings/position/embedding' matches no parameter rule"
    ):
        make_optimizer(TrainConfig(), 10, params_of("bigs"), rules=rules)


def test_frozen_parameters_do_not_move_and_keep_no_state():
    params = params_of("bigs")
    rules = [ParamRule("^encoder/embeddings/", lr_multiplier=0.0, name="embeddings")] + param_rules(
        tiny("bigs"), TrainConfig()
    )
    opt = make_optimizer(TrainConfig(steps=10, warmup_steps=0), 10, params, rules=rules)
    _, after, state = steps(opt.tx, params)
    for name, a, b in zip(names(params), jax.tree.leaves(params), jax.tree.leaves(after), strict=True):
        assert np.array_equal(a, b) == name.startswith("encoder/embeddings/"), name
    # no Adam moments for the frozen tensors: their group's state is empty
    assert jax.tree.leaves(state[-1].inner_states["frozen"]) == []
    word = (30, 8)
    assert sum(x.shape == word for x in jax.tree.leaves(state)) == 0


def test_rules_do_not_depend_on_layer_indices():
    """A scanned layout stacks every layer's parameters under one path without the index."""
    L = 3
    layers = {
        "ssm_f": {"A_re": jnp.zeros((L, 4)), "log_step": jnp.zeros((L, 1))},
        "norm": {"scale": jnp.ones((L, 8)), "bias": jnp.zeros((L, 8))},
        "w_v": {"kernel": jnp.zeros((L, 8, 16)), "bias": jnp.zeros((L, 16))},
    }
    scanned = {"encoder": {"layers": layers}}
    caught = {c.name: c for c in assign(param_rules(tiny("bigs"), TrainConfig()), scanned, "bigs")}
    assert (caught["ssm"].tensors, caught["no_decay"].tensors, caught["default"].tensors) == (2, 3, 1)


def test_hawk_style_no_decay_on_recurrence_and_biases():
    """The rule list a Hawk-like family would use: recurrence parameters and biases undecayed, the rest decayed
    (shown on BiGS's SSM). With zero gradients Adam's step is 0, so an update is exactly the decay term."""
    rules = [
        ParamRule(SSM_PATTERN, weight_decay=False, name="recurrence"),
        ParamRule(r"(^|/)(bias|scale)$", weight_decay=False, name="no_decay"),
        ParamRule(".*", name="default"),
    ]
    params = params_of("bigs")
    cfg = TrainConfig(steps=10, warmup_steps=0, schedule="constant", learning_rate=0.1, weight_decay=0.5)
    tx = make_optimizer(cfg, 10, params, rules=rules).tx
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    for name, p, u in zip(names(params), jax.tree.leaves(params), jax.tree.leaves(updates), strict=True):
        undecayed = "/ssm_" in name or name.endswith(("/bias", "/scale"))
        np.testing.assert_allclose(u, 0 if undecayed else -0.1 * 0.5 * np.asarray(p), rtol=1e-6, err_msg=name)


def test_bad_rules_are_refused():
    with pytest.raises(RecipeError, match="not a regular expression"):
        ParamRule("(unclosed")
    with pytest.raises(RecipeError, match="lr_multiplier = -1.0: expected at least 0"):
        ParamRule("x", lr_multiplier=-1.0)


# ----------------------------------------------------------------------------- from a recipe


def test_user_rules_from_set_and_yaml(tmp_path):
    freeze = '[{pattern: "^encoder/embeddings/", lr_multiplier: 0, name: embeddings}]'
    r = load_recipe("default", [f"train.param_rules={freeze}"])
    (rule,) = r.train.param_rules
    assert (rule.pattern, rule.lr_multiplier, rule.weight_decay) == ("^encoder/embeddings/", 0.0, True)
    rules = param_rules(r.model, r.train)
    assert rules[0] == ParamRule("^encoder/embeddings/", 0.0, True, "embeddings")
    assert rules[1:] == param_rules(r.model, TrainConfig(ssm_lr_multiplier=r.train.ssm_lr_multiplier))

    path = tmp_path / "r.yaml"
    path.write_text("base: default\ntrain:\n  param_rules:\n    - pattern: '/w_v/'\n      weight_decay: false\n")
    (rule,) = load_recipe(str(path)).train.param_rules
    assert (rule.pattern, rule.lr_multiplier, rule.weight_decay, rule.name) == ("/w_v/", 1.0, False, "")
    assert param_rules(tiny("bigs"), load_recipe(str(path)).train)[0].name == "user"


@pytest.mark.parametrize(
    "value, message",
    [
        ('[{pattern: "(oops"}]', "'train.param_rules[0].pattern' = '(oops': expected a non-empty Python regular"),
        ('[{pattern: "x", lr_multiplier: -1}]', "'train.param_rules[0].lr_multiplier' = -1.0: expected at least 0"),
        ('[{pattern: "x", lr: 0}]', "unknown key 'train.param_rules[0].lr'; valid keys: pattern, lr_multiplier"),
        ("[{lr_multiplier: 0}]", "train.param_rules[0]"),
        ('{pattern: "x"}', "'train.param_rules' = {'pattern': 'x'}: expected a list of ParamRuleConfig"),
    ],
)
def test_bad_user_rules_are_one_line_errors(value, message):
    with pytest.raises(RecipeError) as e:
        load_recipe("default", [f"train.param_rules={value}"])
    assert message in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("--set")


def test_training_logs_the_rules(tmp_path, corpus_file):
    """pretrain prints the table and writes it into the checkpoint manifest; a frozen rule holds in training,
    across a resume."""
    os.chdir(tmp_path)
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"steps": 2})
    freeze = 'train.param_rules=[{pattern: "^encoder/embeddings/word/", lr_multiplier: 0, name: words}]'
    args = ["pretrain", str(recipe), "--name", "frozen", "--set", freeze]
    r = invoke(*args, "--stop-after", "1")
    assert "parameter rules" in r.output and "words" in r.output
    r = invoke(*args, code=None)  # resumes: the frozen group's (empty) optimizer state restores too
    assert r.exit_code == 0 and "resuming" in r.output, r.output
    from ssmlm.runs import open_run

    model, meta = open_run(tmp_path / "runs/frozen").load_model()
    rows = {x["name"]: x for x in meta["param_rules"]}
    assert list(rows) == ["words", "ssm", "no_decay", "default"]
    assert rows["words"]["tensors"] == 1 and rows["words"]["lr_multiplier"] == 0.0
    assert json.loads(json.dumps(meta["param_rules"])) == meta["param_rules"]
    # the frozen word embeddings are still those the model was built with
    start = build_mlm(
        open_run(tmp_path / "runs/frozen").recipe.model, seed=open_run(tmp_path / "runs/frozen").recipe.train.seed
    )
    np.testing.assert_array_equal(
        np.asarray(model.encoder.embeddings.word.embedding[...]),
        np.asarray(start.encoder.embeddings.word.embedding[...]),
    )
