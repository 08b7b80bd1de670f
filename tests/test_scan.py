"""Scan over layers (model.scan_layers): the scanned and the unrolled encoder are one function of one set of
parameters — same initial values for a seed, same logits and gradients with dropout, remat and padding —
their parameter trees convert into each other (ssmlm.models.layout) wherever a checkpoint is loaded, and
every encoder returns named intermediates on request."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numerics import EPS32, assert_close_scaled

from ssmlm.models import build_classifier, build_mlm, layout
from ssmlm.models.config import fields_of
from ssmlm.models.gmlp import extend_params
from ssmlm.recipe import ModelConfig
from ssmlm.runs.checkpoint import Checkpoints, load_params
from ssmlm.train.transplant import transplant

ARCHS = ["bigs", "stack_ssm", "gated_att", "bert", "gmlp", "amlp"]
NL, B, N, D, V = 3, 2, 12, 16, 40


def tiny(arch, scan, **kw):
    base = dict(
        arch=arch,
        vocab_size=V,
        hidden_size=D,
        num_layers=NL,
        intermediate_size=32,
        max_seq_length=N,
        num_ssm=8,
        num_heads=2,
        tiny_attention_size=8,
        dropout=0.1,
        scan_layers=scan,
    )
    return ModelConfig(**{k: v for k, v in {**base, **kw}.items() if k in fields_of(arch)})


def nontrivial(model, seed=1):
    """Random values for every parameter (init zeros/ones would hide a wrong layer order or a missed key)."""
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    nnx.update(
        model,
        jax.tree.unflatten(tree, [x + 0.2 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]),
    )
    return model


def params(model):
    return nnx.state(model, nnx.Param)


def flat(state) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(state)}


def assert_same(a, b, **tol):
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_allclose(fa[k], fb[k], err_msg="/".join(map(str, k)), **tol)


def batch():
    ids = jax.random.randint(jax.random.key(7), (B, N), 1, V)
    ids = ids.at[1, 8:].set(0)  # padding in the second example
    return ids, jax.random.normal(jax.random.key(8), (B, N, V))


@nnx.jit
def loss_and_grads(model, ids, weights, rng):
    """(loss, logits, gradients) of a random linear function of the logits."""

    def loss(m):
        logits = m(ids, rng=rng)
        return (logits * weights).sum(), logits

    (value, logits), grads = nnx.value_and_grad(loss, has_aux=True)(model)
    return value, logits, grads


# Scanned and unrolled encoders sum in different orders, so they differ by float32 rounding, which is relative to
# the size of the terms summed, not of the result (tests/numerics.py). Scales: one position's logits; one gradient
# row, and at least 1e-3 of the largest gradient in the model (rounding anywhere in the backward pass reaches every
# leaf through the shared cotangents, and some gradients are zeros made of such terms: an attention key bias, to
# which the softmax is blind). Measured for the six families on AVX-512, AVX2 and SSE4.2 (XLA_FLAGS=
# --xla_cpu_max_isa=...): at most ~200ε of that scale, the most in the SSM step and C gradients, where phases
# step·A_im·l ~ 10³ cancel. 1024ε ≈ 1.2e-4 keeps a 5x margin above that and stays 8x below an error of 1e-3 in
# any leaf (a missing, swapped or misordered layer, or a wrong dropout key, is off by far more).
RTOL = 1024 * EPS32


def assert_same_function(scanned_out, unrolled_out, weights):
    """The scanned encoder's (loss, logits, gradients) are the unrolled one's, up to rounding (see RTOL)."""
    (ls, logits_s, gs), (lu, logits_u, gu) = scanned_out, unrolled_out
    assert_close_scaled(logits_s, logits_u, rtol=RTOL, name="logits")  # per position, over the vocabulary
    # the loss sums logits · weights over every position: its terms' magnitudes give the scale (measured ≤ 2ε of it)
    terms = float(np.abs(np.asarray(logits_u) * np.asarray(weights)).sum())
    assert_close_scaled(ls, lu, rtol=64 * EPS32, floor=terms, name="loss")
    fs, fu = flat(layout.to_layout(gs, gu)), flat(gu)
    assert fs.keys() == fu.keys()
    floor = 1e-3 * max(float(np.abs(g).max()) for g in fu.values())
    for k in fu:
        assert_close_scaled(fs[k], fu[k], rtol=RTOL, floor=floor, name="gradient of " + "/".join(map(str, k)))


def test_initialisation_is_the_unrolled_one_after_stacking():
    for arch in ARCHS:
        unrolled, scanned = build_mlm(tiny(arch, False), seed=3), build_mlm(tiny(arch, True), seed=3)
        assert layout.layout_of(unrolled) == "unrolled" and layout.layout_of(scanned) == "scanned"
        assert_same(layout.to_layout(params(unrolled), params(scanned)), params(scanned), rtol=0, atol=0)
        assert_same(layout.to_layout(params(scanned), params(unrolled)), params(unrolled), rtol=0, atol=0)


# CI time: the default run keeps BiGS without remat, BERT with it and gMLP (the spatial unit); every other
# family and remat setting is slow-marked (pytest -m slow), 40-80 s each on 2 cores.
DEFAULT_SCAN_CASES = {("bigs", False)}  # the others with -m slow (CI time: 25-35 s each)
SCAN_CASES = [
    pytest.param(a, r, marks=[] if (a, r) in DEFAULT_SCAN_CASES else [pytest.mark.slow], id=f"{a}-{r}")
    for a in ARCHS
    for r in (False, True)
]


@pytest.mark.parametrize("arch, remat", SCAN_CASES)
def test_scanned_and_unrolled_give_the_same_logits_and_gradients(arch, remat):
    kw = dict(remat=remat, stack_norm="post") if arch == "bert" else dict(remat=remat)
    unrolled = nontrivial(build_mlm(tiny(arch, False, **kw), seed=0))
    scanned = build_mlm(tiny(arch, True, **kw), seed=1)  # another seed: every value comes from `unrolled`
    nnx.update(scanned, layout.to_layout(params(unrolled), params(scanned)))
    ids, weights = batch()
    # training with dropout on (and, once per family, evaluation)
    for rng in (jax.random.key(5),) if remat else (None, jax.random.key(5)):
        out_u = loss_and_grads(unrolled, ids, weights, rng)
        out_s = loss_and_grads(scanned, ids, weights, rng)
        assert_same_function(out_s, out_u, weights)
    if not remat:  # dropout really acts (else the keys would not be tested)
        assert float(loss_and_grads(scanned, ids, weights, None)[0]) != pytest.approx(float(out_s[0]), rel=1e-6)


def test_layer_views_read_and_write_the_stack():
    model = build_mlm(tiny("bigs", True), seed=0)
    layers = model.encoder.layers
    assert len(layers) == NL and len(list(layers)) == NL
    w = np.asarray(model.encoder.layers.block.w_v.kernel[...])
    np.testing.assert_array_equal(np.asarray(layers[2].w_v.kernel[...]), w[2])
    one = layers[1]
    one.w_v.kernel[...] = jnp.zeros_like(one.w_v.kernel[...])
    layers[1] = one
    got = np.asarray(model.encoder.layers.block.w_v.kernel[...])
    assert not got[1].any() and np.array_equal(got[0], w[0]) and np.array_equal(got[2], w[2])
    fwd, bwd = model.encoder.kernels(N)
    assert fwd.shape == bwd.shape == (NL, N)
    with pytest.raises(IndexError):
        layers[NL]


# ----------------------------------------------------------------------------- layouts of checkpoints


def test_stack_and_unstack_are_inverse_and_work_on_abstract_trees():
    unrolled = build_mlm(tiny("gmlp", False), seed=0)
    f = list(nnx.to_flat_state(params(unrolled)))
    back = layout.unstack_layers(layout.stack_layers(f))
    assert [p for p, _ in back] == [p for p, _ in f]
    for (_, a), (_, b) in zip(back, f, strict=True):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))
    abstract = nnx.split(nnx.eval_shape(lambda: build_mlm(tiny("gmlp", True))), nnx.Param)[1]
    stacked = layout.to_layout(
        nnx.split(nnx.eval_shape(lambda: build_mlm(tiny("gmlp", False))), nnx.Param)[1], abstract
    )
    assert {p: v.get_value().shape for p, v in nnx.to_flat_state(stacked)} == {
        p: v.get_value().shape for p, v in nnx.to_flat_state(abstract)
    }
    assert layout.is_stacked("encoder/layers/block/sgu/spatial/kernel")
    assert not layout.is_stacked(("encoder", "layers", 0, "sgu", "spatial", "kernel"))


@pytest.mark.parametrize("saved_scanned", [False, True])
def test_load_params_reads_a_checkpoint_of_the_other_layout(tmp_path, saved_scanned):
    saved = nontrivial(build_mlm(tiny("bigs", saved_scanned), seed=0))
    ckpt = Checkpoints(tmp_path, keep=1)
    ckpt.save(0, params(saved), {"x": jnp.zeros(())}, {"step": 0})
    ckpt.close()
    other = nnx.eval_shape(lambda: build_mlm(tiny("bigs", not saved_scanned)))
    loaded, meta = load_params(tmp_path, nnx.split(other, nnx.Param)[1])
    assert meta["step"] == 0 and layout.layout_of(loaded) == ("unrolled" if saved_scanned else "scanned")
    assert_same(loaded, layout.to_layout(params(saved), loaded), rtol=0, atol=0)


@pytest.mark.parametrize("src_scanned", [False, True])
def test_transplant_converts_the_layout(src_scanned):
    src = nontrivial(build_mlm(tiny("gated_att", src_scanned), seed=0))
    dst = build_classifier(tiny("gated_att", not src_scanned), 3, seed=1)
    report = transplant(dst, params(src))
    assert report["copied"] == len(flat(params(dst.encoder)))
    ids, _ = batch()
    mask = (ids != 0).astype(jnp.int32)
    assert_close_scaled(dst.encoder(ids, None, mask), src.encoder(ids, None, mask), rtol=RTOL, name="hidden")


def test_extend_params_on_stacked_spatial_weights_is_per_layer():
    rng = np.random.default_rng(0)
    kernel = jnp.asarray(rng.normal(size=(NL, 2 * N - 1)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(NL, N)), jnp.float32)
    p = ("encoder", "layers", "block", "sgu", "spatial")
    grown_k = extend_params((*p, "kernel"), kernel, (NL, 4 * N - 1))
    grown_b = extend_params((*p, "bias"), bias, (NL, 2 * N))
    for i in range(NL):
        one = ("encoder", "layers", i, "sgu", "spatial")
        np.testing.assert_array_equal(grown_k[i], extend_params((*one, "kernel"), kernel[i], (4 * N - 1,)))
        np.testing.assert_array_equal(grown_b[i], extend_params((*one, "bias"), bias[i], (2 * N,)))


# ----------------------------------------------------------------------------- named intermediates

EXPECTED = {  # name -> shape after the layer axis
    "bigs": {"ssm_kernel_forward": (N,), "ssm_kernel_backward": (N,)},
    "stack_ssm": {"ssm_kernel_forward": (N,), "ssm_kernel_backward": (N,)},
    "gated_att": {"attention": (B, 2, N, N)},
    "bert": {"attention": (B, 2, N, N)},
    "gmlp": {"spatial_weights": (N, N)},
    "amlp": {"spatial_weights": (N, N), "attention": (B, 1, N, N)},
}


@pytest.mark.parametrize("arch", ARCHS)
def test_intermediates_names_shapes_and_last_hidden_state(arch):
    ids, _ = batch()
    mask = (ids != 0).astype(jnp.int32)
    out = {}
    unrolled = nontrivial(build_mlm(tiny(arch, False, final_norm=False), seed=0))
    for scan in (False, True):
        model = build_mlm(tiny(arch, scan, final_norm=False), seed=0)
        nnx.update(model, layout.to_layout(params(unrolled), params(model)))
        h = model.encoder(ids, None, mask)
        assert isinstance(h, jax.Array)  # the default call is unchanged
        h2, aux = model.encoder(ids, None, mask, intermediates=True)
        np.testing.assert_array_equal(np.asarray(h2), np.asarray(h))
        want = {"hidden": (B, N, D), **EXPECTED[arch]}
        assert {k: v.shape for k, v in aux.items()} == {k: (NL, *s) for k, s in want.items()}
        # the last hidden state is the encoder's output (before the final norm, off here)
        np.testing.assert_allclose(np.asarray(aux["hidden"][-1]), np.asarray(h), rtol=1e-6, atol=1e-6)
        if "attention" in aux:
            np.testing.assert_allclose(np.asarray(aux["attention"].sum(-1)), 1.0, rtol=1e-5)
        out[scan] = aux
    for k in out[False]:  # per position / query / kernel row; scanned and unrolled differ by rounding (RTOL)
        assert_close_scaled(out[True][k], out[False][k], rtol=RTOL, name=k)
    if arch in ("bigs", "stack_ssm"):  # the same kernels the parameters give directly
        fwd, _ = model.encoder.kernels(N)
        np.testing.assert_allclose(np.asarray(out[True]["ssm_kernel_forward"]), np.asarray(fwd), rtol=1e-6)
    if arch in ("gmlp", "amlp"):
        np.testing.assert_allclose(np.asarray(out[True]["spatial_weights"]), model.encoder.spatial_weights(N))


def test_intermediates_through_the_heads_and_with_the_final_norm():
    cfg = tiny("bigs", True)
    ids, _ = batch()
    model = build_mlm(cfg, seed=0)
    logits, aux = model(ids, intermediates=True)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(model(ids)))
    h = model.encoder(ids, None, (ids != 0).astype(jnp.int32))
    np.testing.assert_allclose(np.asarray(model.encoder.final_norm(aux["hidden"][-1])), np.asarray(h), rtol=1e-5)
    clf = build_classifier(dataclasses.replace(cfg, num_layers=2), 3)
    mask = (ids != 0).astype(jnp.int32)
    scores, aux = clf(ids, mask, intermediates=True)
    assert scores.shape == (B, 3) and aux["hidden"].shape == (2, B, N, D)
