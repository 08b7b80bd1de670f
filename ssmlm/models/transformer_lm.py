"""The Birdie paper's Transformer baseline block: a pre-norm prefix-LM Transformer
(Table 7: 16 heads × 128, MLP expansion 8/3, RoPE base 250 000; docs/faithfulness.md#birdie-models).

One block, with x (L × d) the residual stream of a packed row, H heads of size d_h = d/H:

    h    = RMSNorm(x)                      RMSNorm(x) = x / √(mean(x²) + ε) ⊙ g,   g initialised to 1
    q, k, v = h W_q, h W_k, h W_v           d → d each, no biases, split into H heads
    q, k = RoPE(q, pos), RoPE(k, pos)        pos = position within the sample (ctx.positions)
    a    = softmax(q kᵀ / √d_h + bias) v W_o
    x    = x + a
    x    = x + W_down(silu(W_gate h') ⊙ W_up h'),   h' = RMSNorm(x),   W_gate, W_up: d → round(8/3 · d)

The attention bias is 0 where allowed and ssmlm.models.layers.MASK_VALUE elsewhere, with (prefix-LM,
docs/faithfulness.md#birdie-scan)

    allowed(q, k) = [(prefix_q ∧ prefix_k) ∨ k ≤ q] ∧ segment_q = segment_k ∧ segment_k ≠ 0

in every layer when ``bidirectional`` (the paper: "equivalent to the Prefix LM architecture"), and without
the prefix term (plain causal) otherwise. The last factor is ours: padding (segment 0) is never attended,
so a padding query attends to nothing and its attention output is 0 (instead of NaN or a mean of padding).
The attention itself is ssmlm.models.attention's, computed as ``cfg.attention`` says: the dense masked matrix,
or blockwise skipping the query/key blocks with no allowed pair (the CPU default), or cuDNN's kernel (GPU);
all give the same values.

Parameters per block: 4d² (attention) + 3·d·round(8d/3) (SwiGLU) + 2d (two RMSNorm scales).

Dense layers, RMSNorm and attention come from ssmlm.models.layers (shared with the encoders and the recurrent
LMs). This block's float32-accumulating RMSNorm became the package's only one, so its normalisation is unchanged;
the recurrent LMs it is compared with moved to it from flax's nnx.RMSNorm, which rounds input and scale to the
compute dtype first (equal in float32 to 1e-6, at most one bf16 ulp apart in bfloat16): all LMs now normalise
alike. The mask value stays −1e30 (MASK_VALUE, which the encoders now use too instead of −1e9).

Decoding keeps a KV cache per block: ``prefill`` runs a prompt (the same mask as training, so a
bidirectional prefix followed by causal tokens) and stores its keys/values at 0..P-1; ``step`` appends one
causal token, which attends to every cached key plus itself, reading the cache only up to the longest row's
filled slots (ssmlm.models.attention.attend_cache), so a step costs the text so far, not the cache's size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models.attention import attend_cache, attention_mask, segment_attention
from ssmlm.models.config import LMConfig
from ssmlm.models.layers import DTYPES, RMSNorm, attend, dense
from ssmlm.models.lm import (
    Config,
    LanguageModel,
    LMBlock,
    attention_flops,
    mixing_flops,
    mlp_params,
    mlp_text,
    param_rules,
)
from ssmlm.models.lm_context import Context

# RMSNorm, attend: ssmlm.models.layers; attention_mask: ssmlm.models.attention
__all__ = ["RMSNorm", "TransformerBlock", "attend", "attention_mask", "rope"]
__all__ += ["ARCHS", "MODELS", "Config", "mixing_flops", "param_rules"]  # the family interface


def rope(x, positions, base: float):
    """Rotary position embedding of x (..., L, H, d_h) at integer positions (..., L).

    Channel i is paired with channel i + d_h/2 (the "rotate half" layout of Llama/Gemma) and the pair is
    rotated by the angle pos · base^(-2i/d_h). Angles in float32; returns x's dtype."""
    half = x.shape[-1] // 2
    freq = base ** (-jnp.arange(half, dtype=jnp.float32) * 2 / x.shape[-1])  # (d_h/2,)
    angle = positions.astype(jnp.float32)[..., None, None] * freq  # (..., L, 1, d_h/2)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class TransformerBlock(nnx.Module):
    """Pre-RMSNorm multi-head self-attention (RoPE, prefix-LM mask when ``bidirectional``) and SwiGLU MLP,
    each with a residual connection. ``__call__`` (B, L, d) → (B, L, d) for training; ``init_cache`` /
    ``prefill`` / ``step`` for decoding."""

    def __init__(self, cfg: LMConfig, bidirectional: bool, *, rngs: nnx.Rngs):
        d, heads = cfg.hidden_size, cfg.num_heads
        if d % heads:
            raise ValueError(f"hidden_size {d} is not divisible by num_heads {heads}")
        width = round(cfg.mlp_expansion * d)
        dtype, param_dtype = DTYPES[cfg.compute_dtype], DTYPES[cfg.param_dtype]
        lin = lambda i, o: dense(cfg, i, o, rngs, bias=False)  # noqa: E731
        # no rngs: this norm never drew a key (unlike the recurrent LMs' flax one), so seeded inits hold
        norm = lambda: RMSNorm(d, cfg.norm_eps, param_dtype=param_dtype, dtype=dtype)  # noqa: E731
        self.attn_norm = norm()
        self.query, self.key, self.value, self.out = lin(d, d), lin(d, d), lin(d, d), lin(d, d)
        self.mlp_norm = norm()
        self.gate, self.up, self.down = lin(d, width), lin(d, width), lin(width, d)
        self.bidirectional = bidirectional
        self.num_heads = heads
        self.head_size = d // heads
        self.rope_base = cfg.rope_base
        self.dtype = dtype
        self.attention = cfg.attention

    # -- pieces ---------------------------------------------------------------------------------------
    def qkv(self, x, positions):
        """Normalised x (..., L, d) → q, k, v (..., L, H, d_h), q and k rotated by RoPE at ``positions``."""
        h = self.attn_norm(x)
        split = lambda t: t.reshape(*t.shape[:-1], self.num_heads, self.head_size)  # noqa: E731
        q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
        return rope(q, positions, self.rope_base), rope(k, positions, self.rope_base), v

    def finish(self, x, a):
        """x + W_o a, then the SwiGLU residual: the block's output from its input and attention values."""
        x = x + self.out(a.reshape(*a.shape[:-2], -1)).astype(x.dtype)
        h = self.mlp_norm(x)
        return x + self.down(jax.nn.silu(self.gate(h)) * self.up(h)).astype(x.dtype)

    # -- training -------------------------------------------------------------------------------------
    def self_attention(self, x, ctx: Context):
        """The masked self-attention values (B, L, H, d_h) of a packed row x (B, L, d), and its keys/values."""
        q, k, v = self.qkv(x, ctx.positions)
        return segment_attention(q, k, v, ctx, self.bidirectional, self.attention), k, v

    def __call__(self, x, ctx: Context):
        return self.finish(x, self.self_attention(x, ctx)[0])

    # -- decoding -------------------------------------------------------------------------------------
    def init_cache(self, batch: int, max_len: int) -> dict:
        """Empty KV cache: k, v (B, max_len, H, d_h) in the compute dtype and ``lengths`` (B,) int32, the
        number of filled slots per row."""
        shape = (batch, max_len, self.num_heads, self.head_size)
        zeros = jnp.zeros(shape, self.dtype)
        return {"k": zeros, "v": zeros, "lengths": jnp.zeros((batch,), jnp.int32)}

    def prefill(self, x, ctx: Context, cache: dict):
        """Run a prompt (B, P, d), one sample per row, with the training mask (its prefix bidirectional when
        the block is), and store its keys/values in slots 0..P-1. ``lengths`` becomes the number of
        non-padding tokens per row (P for an unpadded prompt; padding, if any, must be at the end)."""
        a, k, v = self.self_attention(x, ctx)
        out = self.finish(x, a)
        p = x.shape[1]
        cache = {
            "k": cache["k"].at[:, :p].set(k.astype(cache["k"].dtype)),
            "v": cache["v"].at[:, :p].set(v.astype(cache["v"].dtype)),
            "lengths": jnp.sum(ctx.segment_ids != 0, axis=1).astype(jnp.int32),
        }
        return out, cache

    def step(self, x, cache: dict, pos):
        """One new causal token per row: x (B, d) at RoPE positions ``pos`` (B,) int32. Its key/value go to
        slot ``lengths``; it attends to slots 0..lengths (the cached keys and itself)."""
        q, k, v = self.qkv(x[:, None], pos[:, None])  # (B, 1, H, d_h)
        n = cache["lengths"]
        # write one slot per row in place (a where over the whole cache rewrites all max_len slots every step)
        put = jax.vmap(lambda c, new, i: jax.lax.dynamic_update_slice(c, new, (i, 0, 0)))
        keys = put(cache["k"], k.astype(cache["k"].dtype), n)
        values = put(cache["v"], v.astype(cache["v"].dtype), n)
        a = attend_cache(q[:, 0], keys, values, n)  # slots 0..n: the cached keys and its own
        out = self.finish(x[:, None], a[:, None])[:, 0]
        return out, {"k": keys, "v": values, "lengths": n + 1}


def transformer_params(cfg: LMConfig) -> int:
    """norm, W_q W_k W_v W_o (no bias), SwiGLU MLP."""
    d = cfg.hidden_size
    return d + 4 * d * d + mlp_params(cfg)


# a prefix LM in every layer (the paper: "equivalent to the Prefix LM architecture")
ARCHS = {
    "transformer_lm": LMBlock(
        name="Transformer LM (Birdie)",
        block=TransformerBlock,
        per_layer_params=transformer_params,
        mixing_flops=attention_flops,
        prefix_every_layer=True,
        describe=lambda cfg: [f"{cfg.num_heads} heads", mlp_text(cfg), f"RoPE {cfg.rope_base:g}"],
    )
}
MODELS = dict.fromkeys(ARCHS, LanguageModel)
