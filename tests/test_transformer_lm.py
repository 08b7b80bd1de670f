"""The Birdie prefix-LM Transformer block (ssmlm.models.transformer_lm): mask, leakage, KV cache, packing,
RoPE, parameter count. Tiny sizes (d 32, 4 heads) so the whole file runs in seconds on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numerics import EPS32, assert_close_scaled

from ssmlm.models.config import LMConfig
from ssmlm.models.lm_context import make_context
from ssmlm.models.transformer_lm import RMSNorm, TransformerBlock, attention_mask, rope

D, HEADS = 32, 4
# Cached decoding, prefill and packed rows sum attention and projections in other orders than the full forward pass:
# they agree to float32 rounding of each position's output vector (tests/numerics.py). Measured ≤ 4ε of a row's
# largest entry (AVX-512 and SSE4.2); 64ε leaves a 16x margin, far below any masking or cache bug (≥ 1e-3).
ROUNDING = 64 * EPS32


def cfg(**kw):
    # initializer_range larger than the default so attention is far from uniform and leaks are visible
    base = dict(arch="transformer_lm", hidden_size=D, num_heads=HEADS, num_layers=1, initializer_range=0.2)
    return LMConfig(**{**base, **kw})


def block(bidirectional=True, seed=0, **kw):
    return TransformerBlock(cfg(**kw), bidirectional, rngs=nnx.Rngs(seed))


def packed_row():
    """One row of L = 12: sample 1 = 2 prefix + 3 causal, sample 2 = 3 prefix + 2 causal, 2 padding."""
    seg = [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0]
    types = [1, 1, 3, 3, 3, 1, 1, 1, 3, 3, 0, 0]
    pos = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 0]
    arr = lambda a: jnp.asarray([a], jnp.int32)  # noqa: E731
    return make_context(arr(seg), arr(seg), arr(types), arr(pos))


def expected_mask(bidirectional):
    """Written out by hand: rows = queries, columns = keys."""
    if bidirectional:
        rows = [
            "11..........",
            "11..........",
            "111.........",
            "1111........",
            "11111.......",
            ".....111....",
            ".....111....",
            ".....111....",
            ".....1111...",
            ".....11111..",
            "............",
            "............",
        ]
    else:
        rows = [
            "1...........",
            "11..........",
            "111.........",
            "1111........",
            "11111.......",
            ".....1......",
            ".....11.....",
            ".....111....",
            ".....1111...",
            ".....11111..",
            "............",
            "............",
        ]
    return np.array([[c == "1" for c in r] for r in rows])


@pytest.mark.parametrize("bidirectional", [True, False])
def test_mask_matches_hand_written(bidirectional):
    got = np.asarray(attention_mask(packed_row(), bidirectional))[0]
    np.testing.assert_array_equal(got, expected_mask(bidirectional))


@pytest.mark.parametrize("attention", ["dense", "blockwise"])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_jacobian_leaks_only_where_mask_allows(bidirectional, attention):
    ctx = packed_row()
    x = jax.random.normal(jax.random.key(1), (1, 12, D))
    blk = block(bidirectional, attention=attention)
    # reverse mode: the blockwise attention is a custom_vjp (no forward mode), and this is the mode training uses
    jac = jax.jit(jax.jacrev(lambda x: blk(x, ctx)))(x)  # (1, L, d, 1, L, d)
    dep = np.asarray(jnp.abs(jac[0, :, :, 0]).sum(axis=(1, 3)))  # (L_q, L_k)
    allowed = expected_mask(bidirectional) | np.eye(12, dtype=bool)  # the residual: q depends on x_q
    assert np.all(dep[~allowed] == 0.0)  # exactly zero: no cross-segment, future or padding leak
    assert np.all(dep[allowed] > 0)
    # prefix token 0 sees the later prefix token 1 only in the prefix-LM block
    assert (dep[0, 1] > 0) == bidirectional
    assert (dep[5, 7] > 0) == bidirectional
    assert np.all(np.isfinite(np.asarray(blk(x, ctx))))  # padding rows (no allowed key) stay finite


def test_kv_cache_matches_forward():
    p, n = 5, 11  # 5 prefix tokens, then 6 causal ones
    types = jnp.asarray([[1] * p + [3] * (n - p)] * 2)
    x = jax.random.normal(jax.random.key(2), (2, n, D))
    blk = block(True)
    full = blk(x, make_context(types, token_types=types))

    # prefill of the whole row == forward
    out, cache = blk.prefill(x, make_context(types, token_types=types), blk.init_cache(2, 16))
    assert_close_scaled(out, full, rtol=ROUNDING, name="prefill of the whole row")
    assert cache["k"].shape == (2, 16, HEADS, D // HEADS)
    np.testing.assert_array_equal(cache["lengths"], [n, n])

    # prefill(prefix + first causal token), then step each next token
    m = p + 1
    out, cache = blk.prefill(x[:, :m], make_context(types[:, :m], token_types=types[:, :m]), blk.init_cache(2, 16))
    assert_close_scaled(out, full[:, :m], rtol=ROUNDING, name="prefill")
    step = jax.jit(lambda blk, x, cache, pos: blk.step(x, cache, pos))
    for t in range(m, n):
        y, cache = step(blk, x[:, t], cache, jnp.full((2,), t, jnp.int32))
        assert_close_scaled(y, full[:, t], rtol=ROUNDING, name=f"step {t}")
    np.testing.assert_array_equal(cache["lengths"], [n, n])


def test_packed_row_equals_each_sample_alone():
    ctx = packed_row()
    x = jax.random.normal(jax.random.key(3), (1, 12, D))
    blk = block(True)
    packed = blk(x, ctx)
    for lo, hi in [(0, 5), (5, 10)]:
        types = 3 - 2 * ctx.prefix[:, lo:hi].astype(jnp.int32)  # 1 prefix, 3 causal
        alone = blk(x[:, lo:hi], make_context(types, token_types=types))  # positions 0, 1, …
        assert_close_scaled(packed[:, lo:hi], alone, rtol=ROUNDING, name=f"sample at {lo}:{hi}")


def test_rope_is_relative_and_uses_base_250k():
    q, k = jax.random.normal(jax.random.key(4), (2, 1, 1, HEADS, 8))
    score = lambda m, n: jnp.sum(rope(q, jnp.array([[m]]), 250_000.0) * rope(k, jnp.array([[n]]), 250_000.0))  # noqa: E731
    for m, n, s in [(3, 1, 7), (0, 5, 100), (2, 2, 1000)]:
        np.testing.assert_allclose(score(m, n), score(m + s, n + s), rtol=1e-4, atol=1e-4)
    assert abs(float(score(3, 1)) - float(score(4, 1))) > 1e-3  # but does depend on the difference

    # pair i = (channel i, channel i + d_h/2) turns by pos · base^(-2i/d_h): check the slowest pair
    dh, i, pos = 8, 3, 1000
    e = jnp.zeros((1, 1, 1, dh)).at[..., i].set(1.0)
    r = rope(e, jnp.array([[pos]]), 250_000.0)[0, 0, 0]
    theta = pos * 250_000.0 ** (-2 * i / dh)
    np.testing.assert_allclose([r[i], r[i + dh // 2]], [np.cos(theta), np.sin(theta)], atol=1e-5)
    assert block().rope_base == 250_000.0 == LMConfig(arch="transformer_lm").rope_base


def test_parameter_count():
    blk = block()
    n = sum(p.size for p in jax.tree.leaves(nnx.state(blk, nnx.Param)))
    width = round(8 * D / 3)
    assert width == 85
    assert n == 4 * D * D + 3 * D * width + 2 * D
    assert not any("bias" in str(path) for path, _ in nnx.to_flat_state(nnx.state(blk, nnx.Param)))


def test_rms_norm_and_bf16_compute():
    norm = RMSNorm(D, 1e-6)
    x = jax.random.normal(jax.random.key(5), (3, D)) * 7
    np.testing.assert_allclose(jnp.mean(norm(x) ** 2, axis=-1), 1.0, rtol=1e-4)
    blk = block(compute_dtype="bfloat16")
    types = jnp.asarray([[1, 1, 3, 3]])
    y = blk(jnp.ones((1, 4, D)), make_context(types, token_types=types))
    assert y.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(y)))
    assert blk.init_cache(1, 4)["k"].dtype == jnp.bfloat16
