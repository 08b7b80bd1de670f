"""The shared layer toolkit (ssmlm.models.layers): dense, RMSNorm and attention pinned against the formulas they
replaced — flax's nnx.RMSNorm (the recurrent LMs' norm until the toolkit was unified), the Transformer LM's own
float32 RMSNorm, the encoders' −1e9 attention softmax and the Transformer's −1e30 one."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ssmlm.models import build_lm
from ssmlm.models.config import LMConfig, ModelConfig
from ssmlm.models.layers import MASK_VALUE, RMSNorm, attend, attention_weights, dense

D = 64


def inputs(dtype=jnp.float32, shape=(32, D)):
    x = jax.random.normal(jax.random.key(0), shape) * 3 + 0.5
    scale = 1 + 0.3 * jax.random.normal(jax.random.key(1), (shape[-1],))
    return x.astype(dtype), scale


def pair(compute, param=jnp.float32, dim=D):
    """(flax's nnx.RMSNorm, the shared RMSNorm) with one random scale."""
    _, scale = inputs(shape=(1, dim))
    old = nnx.RMSNorm(dim, epsilon=1e-6, dtype=compute, param_dtype=param, rngs=nnx.Rngs(0))
    new = RMSNorm(dim, 1e-6, dtype=compute, param_dtype=param)
    old.scale[...] = scale.astype(param)
    new.scale[...] = scale.astype(param)
    return old, new


def old_transformer_rms_norm(x, scale, eps, dtype):
    """ssmlm.models.transformer_lm.RMSNorm.__call__ before the toolkit was unified."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(dtype or x.dtype)


# ---- RMSNorm ----


def test_rms_norm_parameter_as_before():
    new = RMSNorm(D, 1e-6, param_dtype=jnp.bfloat16)
    old = nnx.RMSNorm(D, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    [(path, p)] = nnx.to_flat_state(nnx.state(new, nnx.Param))
    [(old_path, q)] = nnx.to_flat_state(nnx.state(old, nnx.Param))
    assert path == old_path == ("scale",)
    assert p.shape == q.shape == (D,) and p.dtype == q.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(p[...], np.float32), 1.0)


def test_rms_norm_draws_the_key_flax_drew():
    """With rngs it consumes one params key, as nnx.RMSNorm did, so later parameters of a seed are unchanged."""
    a, b = nnx.Rngs(params=3), nnx.Rngs(params=3)
    nnx.RMSNorm(D, rngs=a)
    RMSNorm(D, rngs=b)
    np.testing.assert_array_equal(jax.random.key_data(a.params()), jax.random.key_data(b.params()))


def test_rms_norm_matches_flax_in_float32():
    old, new = pair(jnp.float32)
    x, _ = inputs()
    y = new(x)
    assert y.dtype == jnp.float32
    # flax multiplies x by (rsqrt · scale), the shared norm (x · rsqrt) · scale: one float32 rounding apart
    np.testing.assert_allclose(np.asarray(y), np.asarray(old(x)), rtol=1e-6, atol=0)


@pytest.mark.parametrize("compute", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("x_dtype", [jnp.float32, jnp.bfloat16])
def test_rms_norm_equals_the_old_transformer_norm(compute, x_dtype):
    norm = RMSNorm(D, 1e-6, dtype=compute)
    x, scale = inputs(x_dtype)
    norm.scale[...] = scale
    y = norm(x)
    assert y.dtype == compute
    np.testing.assert_array_equal(
        np.asarray(y, np.float32), np.asarray(old_transformer_rms_norm(x, scale, 1e-6, compute), np.float32)
    )
    # dtype None: the input's dtype, as before
    plain = RMSNorm(D, 1e-6)
    plain.scale[...] = scale
    assert plain(x).dtype == x_dtype


def exact(x, scale, eps=1e-6):
    x64, g64 = np.asarray(x, np.float64), np.asarray(scale, np.float64)
    return x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps) * g64


@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float32])
def test_rms_norm_in_bfloat16(x_dtype):
    """bfloat16 compute with float32 parameters (the default param dtype): statistics, rsqrt and scale product
    are float32 and the result is rounded once, so it is within ½ bf16 ulp of the exact value. flax's norm also
    took float32 statistics, but rounded the scale (and a float32 input) to bf16 first, so it is further off: the
    two differ by at most one bf16 ulp for a bf16 input (the LMs' residual stream), two for a float32 one. This
    is where the recurrent LMs' normalisation changed."""
    old, new = pair(jnp.bfloat16, dim=512)
    x, _ = inputs(x_dtype, shape=(64, 512))
    y, y_old = np.asarray(new(x), np.float64), np.asarray(old(x), np.float64)
    ref = exact(x, new.scale[...])
    ulp = lambda v: 2.0 ** (np.floor(np.log2(np.abs(v))) - 7)  # noqa: E731  bf16 spacing at v (8 significant bits)
    assert np.all(np.abs(y - ref) <= ulp(ref) / 2 * (1 + 2.0**-12))  # rounded once (from float32)
    apart = 1 if x_dtype == jnp.bfloat16 else 2  # flax also rounded a float32 input to bf16 first
    assert np.all(np.abs(y - y_old) <= apart * np.maximum(ulp(y), ulp(y_old)))  # bf16 ulps
    assert np.mean(y != y_old) > 0.05  # and they do differ: flax rounded the scale to bf16 first
    assert np.max(np.abs(y_old - ref) / np.abs(ref)) > np.max(np.abs(y - ref) / np.abs(ref))


def test_rms_norm_bfloat16_params_equal_flax():
    old, new = pair(jnp.bfloat16, param=jnp.bfloat16)
    x, _ = inputs(jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(new(x), np.float32), np.asarray(old(x), np.float32))


def test_language_model_forward_as_with_flax_norms():
    """A gated_ssm LM gives the same logits with its norms swapped back to flax's nnx.RMSNorm (same scales)."""
    cfg = ModelConfig(arch="gated_ssm", vocab_size=40, hidden_size=32, num_layers=2, state_size=48)
    model = build_lm(cfg, seed=0)
    tokens = jax.random.randint(jax.random.key(2), (2, 12), 1, 40)
    owners = [*model.blocks, model]
    names = ["norm"] * len(model.blocks) + ["final_norm"]
    for i, (owner, name) in enumerate(zip(owners, names, strict=True)):
        norm = getattr(owner, name)
        assert isinstance(norm, RMSNorm)
        norm.scale[...] = 1 + 0.2 * jax.random.normal(jax.random.key(10 + i), (cfg.hidden_size,))
    new = model(tokens)
    for owner, name in zip(owners, names, strict=True):
        old = nnx.RMSNorm(cfg.hidden_size, epsilon=cfg.norm_eps, dtype=jnp.float32, rngs=nnx.Rngs(0))
        old.scale[...] = getattr(owner, name).scale[...]
        setattr(owner, name, old)
    np.testing.assert_allclose(np.asarray(new), np.asarray(model(tokens)), rtol=1e-5, atol=1e-6)


# ---- dense ----


def test_dense_builders_as_before():
    cfg = LMConfig(arch="gated_ssm", hidden_size=8, initializer_range=0.3, compute_dtype="bfloat16")
    lin = dense(cfg, 8, 5, nnx.Rngs(params=4), bias=False)
    ref = nnx.Linear(
        8,
        5,
        use_bias=False,
        kernel_init=nnx.initializers.normal(0.3),
        dtype=jnp.bfloat16,
        param_dtype=jnp.float32,
        rngs=nnx.Rngs(params=4),
    )
    np.testing.assert_array_equal(lin.kernel[...], ref.kernel[...])
    assert lin.bias is None and lin.dtype == jnp.bfloat16
    with_bias = dense(cfg, 8, 5, nnx.Rngs(params=4))
    np.testing.assert_array_equal(with_bias.bias[...], np.zeros(5))
    # no config (the reward model): flax's defaults
    plain = dense(None, 8, 5, nnx.Rngs(params=4), bias=False)
    ref = nnx.Linear(8, 5, use_bias=False, param_dtype=jnp.float32, rngs=nnx.Rngs(params=4))
    np.testing.assert_array_equal(plain.kernel[...], ref.kernel[...])
    assert plain.dtype is None


# ---- attention ----


def qkv(dtype=jnp.float32, b=2, lq=6, lk=6, h=2, dh=8):
    k1, k2, k3 = jax.random.split(jax.random.key(7), 3)
    q = jax.random.normal(k1, (b, lq, h, dh)) * 2
    k = jax.random.normal(k2, (b, lk, h, dh)) * 2
    v = jax.random.normal(k3, (b, lk, h, dh))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def allowed_with_empty_row(b=2, lq=6, lk=6):
    allowed = jax.random.bernoulli(jax.random.key(9), 0.6, (b, lq, lk)) | jnp.eye(lq, lk, dtype=bool)[None]
    return allowed.at[0, 3].set(False)  # query 3 of row 0 sees nothing


def old_encoder_weights(q, k, allowed):
    """ssmlm.models.layers.MultiHeadAttention's softmax before the toolkit was unified (−1e9)."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(q.shape[-1])
    return jax.nn.softmax(jnp.where(allowed, logits, -1e9), axis=-1)


def old_transformer_attend(q, k, v, allowed):
    """ssmlm.models.transformer_lm.attend before the toolkit was unified (−1e30)."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
    mask = allowed[:, None]
    p = jax.nn.softmax(jnp.where(mask, s, -1e30), axis=-1) * mask
    return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_attention_weights_equal_the_old_encoder_softmax(dtype):
    q, k, _ = qkv(dtype)
    allowed = allowed_with_empty_row()[:, None]
    p, old = attention_weights(q, k, allowed), old_encoder_weights(q, k, allowed)
    assert p.dtype == jnp.float32
    has_key = np.asarray(allowed.any(-1))[..., None] & np.ones(p.shape, bool)
    np.testing.assert_array_equal(np.asarray(p)[has_key], np.asarray(old)[has_key])
    # a fully masked row: finite (uniform), as the encoders' −1e9 gave
    empty = np.asarray(p)[0, :, 3]
    assert np.all(np.isfinite(empty))
    np.testing.assert_allclose(empty, 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(p).sum(-1), 1.0, rtol=1e-6)
    assert np.all(np.asarray(p)[~np.broadcast_to(np.asarray(allowed), p.shape) & has_key] == 0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_attend_equals_the_old_transformer_attention(dtype):
    q, k, v = qkv(dtype, lq=1, lk=6)  # a decoding step shape: one query, a longer cache
    allowed = jnp.asarray([[[True, True, False, True, False, False]], [[False] * 6]])
    out, old = attend(q, k, v, allowed), old_transformer_attend(q, k, v, allowed)
    assert out.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(old, np.float32))
    np.testing.assert_array_equal(np.asarray(out[1], np.float32), 0.0)  # no allowed key: 0, finite
    q, k, v = qkv(dtype)
    allowed = allowed_with_empty_row()
    out = attend(q, k, v, allowed)
    np.testing.assert_array_equal(
        np.asarray(out, np.float32), np.asarray(old_transformer_attend(q, k, v, allowed), np.float32)
    )
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    np.testing.assert_array_equal(np.asarray(out[0, 3], np.float32), 0.0)


def test_mask_value_is_finite_in_every_compute_dtype():
    assert np.isfinite(np.float32(MASK_VALUE)) and np.isfinite(float(jnp.asarray(MASK_VALUE, jnp.bfloat16)))
    # far from float32's minimum: subtracting a row maximum or adding a score cannot reach −inf
    assert np.isfinite(np.float32(MASK_VALUE) - np.float32(1e6))
    q, k, _ = qkv(jnp.bfloat16)
    q = q * 100  # large bf16 scores
    p = attention_weights(q, k, jnp.zeros((2, 1, 6, 6), bool))
    assert np.all(np.isfinite(np.asarray(p)))
