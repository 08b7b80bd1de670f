"""Scan over layers for the language models (model.scan_layers, ssmlm.models.lm): the scanned LM runs its blocks
in groups of p (the period of the layers' bidirectional flags) and is the unrolled one's function of the same
parameters — same initial values for a seed, same logits, gradients, decoding and counts — its parameter tree
converts into the unrolled one and back (ssmlm.models.layout), and what reads parameter paths (optimizer rules,
sharding, checkpoint loading) treats both alike."""

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from numerics import EPS32, assert_close_scaled

from ssmlm.models import build_lm, count_params, family_rules, layout
from ssmlm.models.config import SCAN_LAYERS_FROM, ModelConfig
from ssmlm.models.decode import Sampling, generate_ids
from ssmlm.models.flops import abstract, param_counts
from ssmlm.models.layers import LayerStack
from ssmlm.models.lm import blocks_scanned, layer_period
from ssmlm.models.rules import assign
from ssmlm.runs.checkpoint import Checkpoints, load_params
from ssmlm.train.mesh import _spec
from ssmlm.train.transplant import transplant

ARCHS = ["gated_ssm", "gated_ssm_plus", "hawk", "transformer_lm"]
NL, B, N, V = 4, 2, 10, 50
# Scan and loop run the same operations in the same order: identical at the tests' XLA settings (conftest), and with
# LLVM's optimisation on at most 5ε of a row's largest logit and 13ε of a gradient row (measured, AVX-512). 64ε and
# 256ε leave a wide margin and stay far below any bug (a block skipped, misordered or given the wrong bidirectional
# flag changes the logits by more than 1e-3 of their scale).
RTOL = 64 * EPS32
GRAD_RTOL = 256 * EPS32


def tiny(arch, scan, bidirectional="alternate", **kw):
    return ModelConfig(
        **{
            "arch": arch,
            "vocab_size": V,
            "hidden_size": 16,
            "state_size": 16,
            "num_layers": NL,
            "num_heads": 2,
            "dropout": 0.0,
            "bidirectional": bidirectional,
            "scan_layers": scan,
            **kw,
        }
    )


def params(model):
    return nnx.state(model, nnx.Param)


def flat(state) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def assert_same(a, b):
    fa, fb = flat(a), flat(b)
    assert list(fa) == list(fb)
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg="/".join(map(str, k)))


def nontrivial(model, seed=1):
    """Random values for every parameter (norm scales of 1 and zero biases would hide a misplaced block)."""
    leaves, tree = jax.tree.flatten(params(model))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    moved = [x + 0.2 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    nnx.update(model, jax.tree.unflatten(tree, moved))
    return model


def pair(arch, bidirectional="alternate", **kw):
    """(unrolled with random parameters, scanned holding the same ones): the scanned one is built from another
    seed, so every value it has comes from the conversion."""
    unrolled = nontrivial(build_lm(tiny(arch, False, bidirectional, **kw), seed=0))
    scanned = build_lm(tiny(arch, True, bidirectional, **kw), seed=1)
    nnx.update(scanned, layout.to_layout(params(unrolled), params(scanned)))
    return unrolled, scanned


def batch():
    """A packed row of two samples (prefix, then causal tokens) and a row with one sample and padding."""
    tokens = np.asarray(jax.random.randint(jax.random.key(7), (B, N), 2, V))
    segments = np.array([[1] * 6 + [2] * 4, [1] * 7 + [0] * 3])
    types = np.array([[1, 1, 1, 3, 3, 3, 1, 1, 3, 3], [1, 1, 1, 1, 3, 3, 3, 0, 0, 0]])
    return jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(types)


@nnx.jit
def forward(model, tokens, segments, types):
    return model(tokens, segments, types)


def test_auto_scans_deep_stacks_in_whole_groups():
    deep = dict(num_layers=SCAN_LAYERS_FROM)
    assert blocks_scanned(tiny("gated_ssm", "auto", **deep)) and not blocks_scanned(tiny("gated_ssm", "auto"))
    assert [layer_period(tiny(a, True)) for a in ARCHS] == [2, 2, 2, 1]  # the Transformer: a prefix in every layer
    assert {layer_period(tiny(a, True, b)) for a in ARCHS for b in ("all", "none")} == {1}
    # alternate over an odd depth is not whole groups: the loop, in the unrolled layout
    odd = build_lm(tiny("gated_ssm", True, num_layers=3), seed=0)
    assert isinstance(odd.blocks, nnx.List) and layout.layout_of(odd) == "unrolled"
    with pytest.raises(ValueError, match="3 blocks are not whole groups of 2"):
        layout.to_layout(params(odd), "scanned", group=2)


@pytest.mark.parametrize("bidirectional", ["alternate", "none"])
@pytest.mark.parametrize("arch", ARCHS)
def test_scanned_is_the_unrolled_model(arch, bidirectional):
    cfg_u, cfg_s = tiny(arch, False, bidirectional), tiny(arch, True, bidirectional)
    fresh_u, fresh_s = build_lm(cfg_u, seed=3), build_lm(cfg_s, seed=3)
    assert isinstance(fresh_s.blocks, LayerStack) and len(fresh_s.blocks) == NL // layer_period(cfg_s)
    assert layout.layout_of(fresh_s) == "scanned" and layout.group_size(fresh_s) == layer_period(cfg_s)
    # one seed, one initialisation, whichever the layout
    assert_same(layout.to_layout(params(fresh_u), params(fresh_s)), params(fresh_s))
    assert param_counts(fresh_s) == param_counts(fresh_u) and count_params(fresh_s) == count_params(fresh_u)

    unrolled, scanned = pair(arch, bidirectional)
    logits = forward(scanned, *batch())
    assert_close_scaled(logits, forward(unrolled, *batch()), rtol=RTOL, name="logits")
    # decoding (decode.generate_ids: the jitted prefill, then steps), greedy: the same tokens and logits
    got, want = [], []
    prompt = dict(prefix=[5, 6, 7], causal=[1, 9], sampling=Sampling(max_new_tokens=4))
    assert generate_ids(scanned, **prompt, logits_out=got) == generate_ids(unrolled, **prompt, logits_out=want)
    assert_close_scaled(np.stack(got), np.stack(want), rtol=RTOL, name="decoded logits")


def test_gradients_are_the_unrolled_ones():
    unrolled, scanned = pair("gated_ssm_plus")
    weights = jax.random.normal(jax.random.key(8), (B, N, V))

    @nnx.jit
    def grads(model, tokens, segments, types):
        return nnx.grad(lambda m: (m(tokens, segments, types) * weights).sum())(model)

    gs, gu = (grads(m, *batch()) for m in (scanned, unrolled))
    gs, gu = flat(layout.to_layout(gs, params(unrolled))), flat(gu)
    assert gs.keys() == gu.keys()
    # rounding reaches every leaf through the shared cotangents: scale by a row, at least 1e-3 of the largest one
    floor = 1e-3 * max(float(np.abs(g).max()) for g in gu.values())
    for k in gu:
        assert_close_scaled(gs[k], gu[k], rtol=GRAD_RTOL, floor=floor, name="gradient of " + "/".join(map(str, k)))


@pytest.mark.parametrize("arch", ["hawk", "transformer_lm"])
def test_remat_changes_nothing(arch):
    unrolled, scanned = pair(arch, remat=True)
    want = forward(pair(arch)[0], *batch())
    assert_close_scaled(forward(scanned, *batch()), want, rtol=RTOL, name="scanned, remat")
    assert_close_scaled(forward(unrolled, *batch()), want, rtol=RTOL, name="unrolled, remat")


# ----------------------------------------------------------------------------- layouts and parameter paths


def test_layouts_convert_both_ways_and_regroup():
    unrolled, scanned = pair("hawk")
    stacked = np.asarray(scanned.blocks.block[1].rg_lru.a_param[...])  # member 1 of each group: blocks 1 and 3
    for g, i in enumerate((1, 3)):
        np.testing.assert_array_equal(stacked[g], np.asarray(unrolled.blocks[i].rg_lru.a_param[...]))
    assert_same(layout.to_layout(params(scanned), params(unrolled)), params(unrolled))
    assert_same(
        layout.to_layout(layout.to_layout(params(unrolled), params(scanned)), params(unrolled)), params(unrolled)
    )
    f = list(nnx.to_flat_state(params(unrolled)))
    back = layout.unstack_layers(layout.stack_layers(f, group=2))
    assert [p for p, _ in back] == [p for p, _ in f]
    # a scanned tree of another group size (alternate -> none) is regrouped, row by row
    one = build_lm(tiny("hawk", True, "none"), seed=1)
    assert layout.group_size(one) == 1
    assert_same(layout.to_layout(params(scanned), params(one)), layout.to_layout(params(unrolled), params(one)))
    # abstract trees (a restore target) convert too
    shapes = lambda tree: {p: v.get_value().shape for p, v in nnx.to_flat_state(tree)}  # noqa: E731
    target = params(abstract(lambda: build_lm(tiny("hawk", True))))
    assert shapes(layout.to_layout(params(abstract(lambda: build_lm(tiny("hawk", False)))), target)) == shapes(target)
    assert layout.is_stacked("blocks/block/1/rg_lru/a_param") and not layout.is_stacked("blocks/3/rg_lru/a_param")
    assert layout.unstacked_path(("blocks", "block", 1, "rg_lru", "a_param"), 1, group=2)[:2] == ("blocks", 3)


@pytest.mark.parametrize("arch", ["gated_ssm", "hawk"])
def test_optimizer_rules_catch_the_same_parameters(arch):
    unrolled, scanned = (params(abstract(lambda s=s: build_lm(tiny(arch, s)))) for s in (False, True))
    rules = family_rules(tiny(arch, True))
    caught = [{c.name: c.elements for c in assign(rules, p, arch)} for p in (unrolled, scanned)]
    assert caught[0] == caught[1] and caught[0]["recurrence"] > 0


def test_sharding_keeps_the_group_axis_whole():
    mesh = SimpleNamespace(shape={"data": 1, "fsdp": 2, "tensor": 2})
    model = abstract(lambda: build_lm(tiny("gated_ssm_plus", True, hidden_size=32, state_size=64)))
    for path, v in nnx.to_flat_state(params(model)):
        shape, name = v.get_value().shape, "/".join(map(str, path))
        if layout.is_stacked(path):
            one = "/".join(map(str, layout.unstacked_path(path, 0, group=2)))
            assert _spec(shape, mesh, name) == P(None, *_spec(shape[1:], mesh, one)), name
    assert _spec((2, 32, 64), mesh, "blocks/block/1/w_f/kernel") == P(None, "fsdp", "tensor")


# ----------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("saved_scanned", [False, True])
def test_a_checkpoint_of_one_layout_loads_into_the_other(tmp_path, saved_scanned):
    unrolled, scanned = pair("gated_ssm")
    saved, other = (scanned, unrolled) if saved_scanned else (unrolled, scanned)
    ckpt = Checkpoints(tmp_path, keep=1)
    ckpt.save(0, params(saved), {"x": jnp.zeros(())}, {"step": 0})
    ckpt.close()
    target = nnx.split(abstract(lambda: build_lm(dataclasses.replace(other.cfg))), nnx.Param)[1]
    loaded, meta = load_params(tmp_path, target)
    assert meta["step"] == 0 and layout.layout_of(loaded) == layout.layout_of(other)
    assert_same(loaded, params(other))


def test_transplant_converts_the_layout():
    unrolled, _ = pair("transformer_lm")
    dst = build_lm(tiny("transformer_lm", True), seed=5)
    report = transplant(dst, params(unrolled))
    assert report["copied"] == len(flat(params(dst))) and report["fresh"] == 0
    assert_close_scaled(forward(dst, *batch()), forward(unrolled, *batch()), rtol=RTOL, name="logits")
