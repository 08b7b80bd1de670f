"""ssmlm.models.attention: the blockwise packed-row attention equals the dense masked one (outputs and gradients),
whatever the block size and row layout; the Transformer LM gives the same logits with either; and decoding's
filled-cache read equals attending over the whole cache, and the full forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from numerics import EPS32, assert_close_scaled

from ssmlm.models import build_lm
from ssmlm.models.attention import attend_cache, key_span, resolve, segment_attention
from ssmlm.models.config import LMConfig, ModelConfig
from ssmlm.models.layers import attend
from ssmlm.models.lm_context import make_context
from ssmlm.models.platform import cudnn_available
from ssmlm.models.transformer_lm import TransformerBlock

L, HEADS, DH = 70, 2, 8
# The blockwise path sums the softmax over key blocks with running rescaling, the dense one in one pass: the two
# differ by float32 rounding of each sum. Outputs and gradients are sums of terms no larger than the array's
# largest entry (weights ≤ 1 times values; a gradient row's terms are bounded by that gradient's largest entry
# over all rows), so the scale is the whole array's and the tolerance a multiple of ε. Measured ≤ 3ε for the
# attention alone and ≤ 10ε for the whole LM's logits (per position) and parameter gradients; 64ε leaves a 6x margin
# and stays far below a masking error (a leaked or missed key moves entries by ≥ 1e-2 of the scale).
ROUNDING = 64 * EPS32


@pytest.fixture(autouse=True)
def full_float32_matmuls():
    """Float32 products in full precision: on a GPU XLA's default is TF32 (10-bit mantissa), whose rounding
    differs between the two paths by far more than float32's; CPUs compute float32 either way."""
    with jax.default_matmul_precision("highest"):
        yield


def context(rows):
    """A packed batch: each row a list of samples (length, prefix length), then padding up to L; or a row's
    (segment ids, token types) written out."""
    seg, types, pos = (np.zeros((len(rows), L), np.int32) for _ in range(3))
    for r, samples in enumerate(rows):
        if isinstance(samples, tuple):
            seg[r], types[r] = samples
            continue
        at = 0
        for s, (n, p) in enumerate(samples):
            seg[r, at : at + n] = s + 1
            types[r, at : at + n] = [1] * p + [3] * (n - p)
            pos[r, at : at + n] = np.arange(n)
            at += n
        assert at <= L
    return make_context(jnp.asarray(seg), jnp.asarray(seg), jnp.asarray(types), jnp.asarray(pos))


LAYOUTS = {
    # several samples (one without a prefix, one all prefix), then padding
    "mixed": [(5, 2), (17, 0), (30, 30)],
    "one sample": [(L, 35)],
    "many short": [(3, 1), (4, 2), (2, 0), (4, 4), (1, 1), (3, 0), (5, 2)] * 3 + [(4, 1)],
    "padding only": [],
    "causal only": [(20, 0), (44, 0)],
    # samples split into several runs, prefixes too: the spans come from sorting, so this is still exact
    "split samples": ([1, 1, 2, 2, 1, 1, 2, 1, 0, 0] * 7, [1, 3, 1, 1, 1, 3, 3, 3, 0, 0] * 7),
}


def rows_ctx():
    return context(list(LAYOUTS.values()))


def normal(seed, *shape):
    # numpy's generator: jax.random compiles a sampler per shape, seconds of this file's time
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def qkv(n_rows, seed=0):
    return normal(seed, 3, n_rows, L, HEADS, DH)


def vjp(impl, ctx, bidirectional, block, q, k, v, cotangent):
    """The attention's output and its gradients wrt q, k, v for the loss Σ out ⊙ cotangent."""
    f = lambda q, k, v: segment_attention(q, k, v, ctx, bidirectional, impl, block)
    out, back = jax.vjp(f, q, k, v)
    return out, *back(cotangent)


jitted_vjp = jax.jit(vjp, static_argnums=(0, 2, 3))


# prefix-LM and plain causal; block sizes none of which divides L = 70, and one larger than L (a single block)
@pytest.mark.parametrize(("bidirectional", "block"), [(True, 8), (False, 16), (True, 128)])
def test_blockwise_equals_dense(bidirectional, block):
    ctx = rows_ctx()
    q, k, v = qkv(len(LAYOUTS))
    cot = normal(1, *q.shape)
    dense = jitted_vjp("dense", ctx, bidirectional, 0, q, k, v, cot)  # block unused: one compile for all
    blockwise = jitted_vjp("blockwise", ctx, bidirectional, block, q, k, v, cot)
    for name, a, b in zip(["out", "dq", "dk", "dv"], blockwise, dense, strict=True):
        assert_close_scaled(a, b, rtol=ROUNDING, axis=None, name=f"{name}, block {block}")
        # padding queries (and the row of only padding) get exactly 0 output and gradient, as in the dense path
        pad = np.asarray(ctx.segment_ids == 0)
        assert np.all(np.asarray(a)[pad] == 0)


def test_key_span_hand_written():
    """The key span of each query: its sample's first position to its own, or to its prefix's end."""
    seg = jnp.asarray([1, 1, 1, 1, 2, 2, 2, 0])
    prefix = jnp.asarray([1, 1, 0, 0, 1, 1, 0, 0], bool)
    lo, hi = jax.jit(key_span)(seg, prefix)
    np.testing.assert_array_equal(lo, [0, 0, 0, 0, 4, 4, 4, 8])  # padding: the empty span (L, -1)
    np.testing.assert_array_equal(hi, [1, 1, 2, 3, 5, 5, 6, -1])
    lo, hi = jax.jit(key_span)(seg, jnp.zeros(8, bool))  # causal: up to the query itself
    np.testing.assert_array_equal(hi, [0, 1, 2, 3, 4, 5, 6, -1])


def test_resolve():
    """On the host (no compiling_for: tests/test_platform.py covers compiling for another platform)."""
    assert resolve("dense", jnp.float32, 64, True) == "dense"
    on_cpu = jax.default_backend() == "cpu"
    assert resolve("auto", jnp.float32, 64, True) == ("blockwise" if on_cpu else "dense")  # cuDNN takes no float32
    bf16 = {"cpu": "blockwise", "gpu": "cudnn" if cudnn_available() else "dense"}  # a TPU: dense (prefix-LM)
    assert resolve("auto", jnp.bfloat16, 64, True) == bf16.get(jax.default_backend(), "dense")
    with pytest.raises(ValueError, match="attention 'flash'"):
        resolve("flash", jnp.float32, 64, False)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN attention runs on a GPU only")
@pytest.mark.parametrize("bidirectional", [True, False])
def test_cudnn_equals_dense_on_gpu(bidirectional):
    """On a GPU: cuDNN's kernel with the boolean mask gives the dense path's outputs and gradients (bf16
    inputs, as cuDNN requires; the tolerance is bf16 rounding of the sums, not float32's)."""
    ctx = rows_ctx()
    q, k, v = (x.astype(jnp.bfloat16) for x in qkv(len(LAYOUTS)))
    cot = normal(1, *q.shape).astype(jnp.bfloat16)
    cudnn = jitted_vjp("cudnn", ctx, bidirectional, 0, q, k, v, cot)
    dense = jitted_vjp("dense", ctx, bidirectional, 0, q, k, v, cot)
    for name, a, b in zip(["out", "dq", "dk", "dv"], cudnn, dense, strict=True):
        assert_close_scaled(a.astype(jnp.float32), b.astype(jnp.float32), rtol=2**-5, axis=None, name=name)
        assert np.all(np.asarray(a, np.float32)[np.asarray(ctx.segment_ids == 0)] == 0)


def lm_cfg(attention):
    return ModelConfig(
        arch="transformer_lm",
        hidden_size=16,
        num_heads=HEADS,
        num_layers=2,
        vocab_size=40,
        dropout=0.0,
        initializer_range=0.2,
        attention=attention,
    )


def test_lm_blockwise_equals_dense():
    """The whole LM on packed prefix-LM rows: the same logits with either attention (gradients: above)."""
    ctx = rows_ctx()
    tokens = jnp.where(ctx.segment_ids > 0, np.random.default_rng(4).integers(1, 40, ctx.segment_ids.shape), 0)
    types = jnp.where(ctx.prefix, 1, jnp.where(ctx.segment_ids > 0, 3, 0))

    model = build_lm(lm_cfg("dense"), seed=1)
    run = jax.jit(lambda model: model(tokens, ctx.segment_ids, types, ctx.positions))
    dense = run(model)
    for block in model.blocks:  # the same parameters; the implementation is static, so run recompiles
        block.attention = "blockwise"
    # a sum over d of normalised activations times the head: rounding relative to each position's largest logit
    assert_close_scaled(run(model), dense, rtol=ROUNDING, name="logits")


@pytest.mark.parametrize("block", [16, 64])
def test_attend_cache_equals_whole_cache(block):
    """Reading the filled slots block by block (the last block running past a cache of 50) equals the dense
    softmax over all slots ≤ last; slots beyond hold garbage that must not count."""
    b, size = 4, 50
    q = normal(5, b, HEADS, DH)
    keys, values = normal(6, 2, b, size, HEADS, DH) * 3
    last = jnp.asarray([0, 7, 23, 49])
    got = jax.jit(attend_cache, static_argnums=4)(q, keys, values, last, block)
    allowed = (jnp.arange(size)[None] <= last[:, None])[:, None]
    want = jax.jit(attend)(q[:, None], keys, values, allowed)[:, 0]
    assert_close_scaled(got, want, rtol=ROUNDING, axis=None, name=f"cache read, block {block}")


def test_step_over_a_large_cache_matches_forward():
    """Rows with prompts of different lengths (padded at the end), a cache 40x longer than what they fill:
    each decoded position gets the full forward pass's output for its own row."""
    d, prompts, steps, max_len = 16, [5, 9, 12], 4, 512
    # dense prefill and forward: the reference here is the plain masked softmax (the blockwise one is tested above)
    cfg = LMConfig(
        arch="transformer_lm", hidden_size=d, num_heads=HEADS, num_layers=1, initializer_range=0.2, attention="dense"
    )
    blk = TransformerBlock(cfg, True, rngs=nnx.Rngs(7))
    x = normal(8, len(prompts), max(prompts) + steps, d)
    p = max(prompts)
    seg = jnp.asarray([[1] * n + [0] * (p - n) for n in prompts])
    types = jnp.asarray([[1] * (n - 1) + [3] + [0] * (p - n) for n in prompts])  # prefix, then START
    prefill = jax.jit(lambda blk, x, ctx, cache: blk.prefill(x, ctx, cache))
    _, cache = prefill(blk, x[:, :p], make_context(seg, seg, types), blk.init_cache(len(prompts), max_len))
    np.testing.assert_array_equal(cache["lengths"], prompts)
    rows = jnp.arange(len(prompts))
    at = jnp.asarray(prompts)
    decoded = []
    step = jax.jit(lambda blk, x, cache, pos: blk.step(x, cache, pos))
    for s in range(steps):
        y, cache = step(blk, x[rows, at + s], cache, at + s)  # row r's token s sits right after its own prompt
        decoded.append(y)
    # the full forward pass of every row at once: prompt, then the decoded tokens, then padding
    n = max(prompts) + steps
    seg = jnp.asarray([[1] * (m + steps) + [0] * (n - m - steps) for m in prompts])
    types = jnp.asarray([[1] * (m - 1) + [3] * (1 + steps) + [0] * (n - m - steps) for m in prompts])
    full = jax.jit(lambda blk, x, ctx: blk(x, ctx))(blk, x, make_context(seg, seg, types))
    for r, m in enumerate(prompts):
        got = jnp.stack([y[r] for y in decoded])
        assert_close_scaled(got, full[r, m : m + steps], rtol=ROUNDING, name=f"row {r} decoded")
