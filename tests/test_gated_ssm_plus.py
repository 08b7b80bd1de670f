"""Gated SSM+ is the Birdie paper's Appendix E.2 listing: the block against a plain numpy loop of the listing, in
float64, for both readings of its convolution, causal and with a bidirectional prefix; its parameter count."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ssmlm.models import build_lm, count_params
from ssmlm.models import lm as lm_family
from ssmlm.models.config import ModelConfig
from ssmlm.models.lm_context import make_context

D, N, W = 12, 8, 4


def cfg(plus_conv, bidirectional="none", **kw):
    kw = {
        "vocab_size": 40,
        "hidden_size": D,
        "state_size": N,
        "num_layers": 1,
        "conv_width": W,
        "dropout": 0.0,
        "gelu": "tanh",
        "plus_conv": plus_conv,
        "bidirectional": bidirectional,
        **kw,
    }
    return ModelConfig(arch="gated_ssm_plus", **kw)


def block_of(c, bidirectional, seed=0):
    block = lm_family.block_class("gated_ssm_plus")(c, bidirectional, rngs=nnx.Rngs(seed))
    # non-zero biases and norm scales, so a forgotten bias or scale cannot pass unnoticed
    rng = np.random.default_rng(seed)
    for path, p in nnx.iter_graph(block):
        if isinstance(p, nnx.Param) and (path[-1] in ("bias", "scale")):
            p[...] = jnp.asarray(rng.normal(1.0 if path[-1] == "scale" else 0.0, 0.3, p.shape), p.dtype)
    return block


def np_params(block):
    return jax.tree.map(lambda v: np.asarray(v, np.float64), nnx.to_pure_dict(nnx.state(block, nnx.Param)))


def gelu_tanh(x):  # jax.nn.gelu's default, the listing's
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rms(x, scale, eps=1e-6):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


def dense(p, x):
    return x @ p["kernel"] + p.get("bias", 0.0)


def listing(p, x, prefix_len, bidirectional, plus_conv):
    """E.2 written out for one sample (L, d) in float64, step by step, plus the pre-norm, residual and MLP."""
    length = x.shape[0]
    u = rms(x, p["norm"]["scale"])
    out_gate = gelu_tanh(dense(p["w_out_gate"], u))  # from the block input, before the convolution
    k, b = p["conv"]["kernel"], p["conv"]["bias"]
    conv = np.zeros((length, b.shape[0]))
    for t in range(length):  # causal: taps t, t-1, …, t-3
        conv[t] = b
        for j in range(W):
            if t - j >= 0:
                conv[t] += u[t - j] @ k[j] if plus_conv == "dense" else u[t - j] * k[j]
    f = sigmoid(dense(p["w_f"], conv))
    z = dense(p["w_z"], conv) * sigmoid(dense(p["w_z_gate"], conv))
    h = np.zeros((length, N))
    half = N // 2 if bidirectional else N
    state = np.zeros(N)
    for t in range(length):  # the forward half (all of a causal layer), left to right
        state = f[t] * state + z[t]
        h[t, :half] = state[:half]
    if bidirectional:  # the reverse half, right to left inside the prefix; outside it h = z
        state = np.zeros(N)
        for t in reversed(range(length)):
            keep = t < prefix_len
            state = (f[t] if keep else 0.0) * state + z[t]
            h[t, half:] = state[half:]
    y = x + dense(p["w_out"], out_gate * h)
    m = p["mlp"]
    v = rms(y, m["norm"]["scale"])
    return y + dense(m["w_down"], gelu_tanh(dense(m["w_gate"], v)) * dense(m["w_up"], v))


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("plus_conv", ["depthwise", "dense"])
def test_block_equals_the_e2_listing(plus_conv, bidirectional):
    c = cfg(plus_conv, "alternate" if bidirectional else "none")
    block = block_of(c, bidirectional)
    rng = np.random.default_rng(1)
    length, prefix_len = 11, 5
    x = rng.normal(size=(2, length, D)).astype(np.float32)
    types = np.array([[1] * prefix_len + [3] * (length - prefix_len)] * 2) if bidirectional else None
    ctx = make_context(jnp.zeros((2, length), jnp.int32), token_types=None if types is None else jnp.asarray(types))
    got = np.asarray(block(jnp.asarray(x), ctx), np.float64)
    p = np_params(block)
    want = np.stack([listing(p, row.astype(np.float64), prefix_len, bidirectional, plus_conv) for row in x])
    # float32 against float64: relative to the size of the activations (|y| ~ 1-10)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("plus_conv", ["depthwise", "dense"])
def test_parameter_count(plus_conv):
    c = cfg(plus_conv)
    block = block_of(c, False)
    m = lm_family.mlp_width(c)
    conv = W * D + D if plus_conv == "depthwise" else W * D * N + N
    width = D if plus_conv == "depthwise" else N
    want = D + (D * N + N) + conv + 3 * (width * N + N) + (N * D + D) + (D + 3 * D * m)
    assert count_params(block) == want
    assert lm_family.param_count_formula(c)["per_layer"] == want
    shapes = {k: v.shape for k, v in jax.tree_util.tree_leaves_with_path(np_params(block))}
    assert any(s == ((W, D, N) if plus_conv == "dense" else (W, D)) for s in shapes.values())


def test_paper_size_recipe_is_about_1b4():
    c = ModelConfig(arch="gated_ssm_plus", vocab_size=32000, hidden_size=2048, state_size=2560, num_layers=21)
    total = lm_family.param_count_formula(c)["total"]
    assert 1.35e9 < total < 1.45e9
    assert count_params(nnx.eval_shape(lambda: build_lm(c))) == total


@pytest.mark.parametrize("plus_conv", ["depthwise", "dense"])
def test_decoding_equals_the_full_forward(plus_conv):
    m = build_lm(cfg(plus_conv, "alternate", num_layers=2), seed=3)
    p, k = 4, 5
    rng = np.random.default_rng(2)
    tokens = rng.integers(2, 40, (2, p + 1 + k))
    types = np.array([[1] * p + [3] * (1 + k)] * 2)
    full = m(jnp.asarray(tokens), token_types=jnp.asarray(types))
    cache = m.init_cache(2, p + 1 + k)
    logits, cache = m.prefill(jnp.asarray(tokens[:, : p + 1]), jnp.asarray(types[:, : p + 1]), cache)
    decoded = [logits[:, -1]]
    for j in range(p + 1, p + 1 + k):
        step_logits, cache = m.step(jnp.asarray(tokens[:, j]), cache)
        decoded.append(step_logits)
    got, want = np.asarray(jnp.stack(decoded, 1)), np.asarray(full[:, p:])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
