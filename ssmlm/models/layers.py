"""Building blocks shared by every model family — the one layer toolkit of the encoders, the Birdie LMs and the
reward model: the dense-layer builder, LayerNorm, the float32-accumulating RMSNorm, the attention softmax with
its one mask constant, explicit-key dropout, BERT-style embeddings, bidirectional multi-head attention, and the
generic encoder stack."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models.config import ModelConfig, layers_scanned

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# The value a disallowed attention score is replaced by before the softmax, in every attention (encoders, aMLP's
# tiny attention, the Transformer LM). Scores are float32 when it is applied (attention_weights). Finite, so a
# row with no allowed key stays finite (uniform weights, never the NaN of −inf). Far below any real score:
# exp(MASK_VALUE − max) underflows to exactly 0 in float32, so wherever a row has an allowed key the weights are
# those of −1e9 or −inf. Far above float32's minimum (−3.4e38), so subtracting a row maximum or adding a bias
# cannot overflow to −inf; and representable in bfloat16 (max 3.39e38), should scores ever be kept in bf16.
MASK_VALUE = -1e30


def dense(
    cfg: ModelConfig | None, d_in: int, d_out: int, rngs: nnx.Rngs, init=None, *, bias: bool = True
) -> nnx.Linear:
    """The dense layer of every family. Bias (if ``bias``) initialised to 0.

    With a model config: kernel N(0, cfg.initializer_range²) unless ``init`` is given, parameters in
    cfg.param_dtype, computing in cfg.compute_dtype. With ``cfg=None`` (the reward model, which has no model
    config): flax's defaults — LeCun-normal kernel unless ``init``, float32 parameters, computing in the
    input's dtype."""
    if cfg is None:
        kernel_init, dtype, param_dtype = init or nnx.initializers.lecun_normal(), None, jnp.float32
    else:
        kernel_init = init or nnx.initializers.normal(cfg.initializer_range)
        dtype, param_dtype = DTYPES[cfg.compute_dtype], DTYPES[cfg.param_dtype]
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=bias,
        kernel_init=kernel_init,
        bias_init=nnx.initializers.zeros,
        dtype=dtype,
        param_dtype=param_dtype,
        rngs=rngs,
    )


class RMSNorm(nnx.Module):
    """x / √(mean(x²) + eps) ⊙ scale over the last axis; ``scale`` (dim,) initialised to 1. The one RMSNorm of
    the package (the Birdie LMs' blocks and final norm, the Transformer LM).

    Accumulates in float32 whatever the compute dtype: x is cast to float32, the mean of squares, the rsqrt and
    the scale product are float32 (the scale read in float32 from its param dtype), and only the result is cast
    to ``dtype`` (default: the input's dtype). In float32 this equals flax's ``nnx.RMSNorm`` to rounding
    (relative 1e-6: flax multiplies x by rsqrt·scale, here (x·rsqrt)·scale). In bfloat16 compute flax's
    statistics were float32 too, but it first rounds the scale (float32 parameters) and the input to bfloat16;
    here nothing is rounded before the final cast (within ½ bf16 ulp of exact), so outputs differ from flax's
    by at most one bf16 ulp for a bf16 input, two for a float32 one, and not at all with bf16 parameters and
    input (tests/test_layers.py).

    ``rngs``: flax's nnx.RMSNorm draws one (unused) params key; passing ``rngs`` draws it too, so a model whose
    norms were flax's initialises every later parameter of a given seed exactly as before."""

    def __init__(
        self, dim: int, eps: float = 1e-6, *, param_dtype=jnp.float32, dtype=None, rngs: nnx.Rngs | None = None
    ):
        if rngs is not None:
            rngs.params()
        self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(self.dtype or x.dtype)


def attention_weights(q, k, allowed):
    """softmax(q kᵀ/√d_h) over the allowed keys, (B, H, Lq, Lk) float32, for q (B, Lq, H, d_h), k (B, Lk, H, d_h)
    and ``allowed`` bool broadcastable to (B, H, Lq, Lk). Scores (cast after the product in the compute dtype)
    and softmax in float32; disallowed scores become MASK_VALUE, so a row with no allowed key is uniform."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(q.shape[-1]).astype(jnp.float32)
    return jax.nn.softmax(jnp.where(allowed, s, MASK_VALUE), axis=-1)


def attend(q, k, v, allowed):
    """softmax(q kᵀ/√d_h) v over the allowed keys: q (B, Lq, H, d_h), k, v (B, Lk, H, d_h), allowed (B, Lq, Lk)
    -> (B, Lq, H, d_h) in v's dtype. A query with no allowed key gets 0 (its weights are zeroed)."""
    mask = allowed[:, None]
    p = attention_weights(q, k, mask) * mask
    return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)


def layer_norm(cfg: ModelConfig, dim: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(dim, epsilon=cfg.layer_norm_eps, param_dtype=DTYPES[cfg.param_dtype], rngs=rngs)


def gelu_exact(x):
    return jax.nn.gelu(x, approximate=False)


def gelu_tanh(x):
    return jax.nn.gelu(x, approximate=True)


def gelu(cfg: ModelConfig):
    # module-level functions (not partials) so two models of one config have equal graph definitions
    return gelu_tanh if cfg.gelu == "tanh" else gelu_exact


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout with an explicit key; rng=None means deterministic (evaluation)."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def fold(rng: jax.Array | None, i: int) -> jax.Array | None:
    return None if rng is None else jax.random.fold_in(rng, i)


class Embeddings(nnx.Module):
    """word + token type (+ learned absolute position) embeddings → LayerNorm → dropout."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, positions: bool = True):
        init = nnx.initializers.normal(cfg.initializer_range)
        kw = dict(embedding_init=init, param_dtype=DTYPES[cfg.param_dtype], rngs=rngs)
        self.word = nnx.Embed(cfg.vocab_size, cfg.hidden_size, **kw)
        self.position = nnx.Embed(cfg.max_seq_length, cfg.hidden_size, **kw) if positions else None
        self.token_type = nnx.Embed(cfg.type_vocab_size, cfg.hidden_size, **kw)
        self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
        self.rate = cfg.dropout
        self.max_len = cfg.max_seq_length

    def __call__(self, input_ids, token_type_ids, rng) -> jax.Array:
        length = input_ids.shape[1]
        if length > self.max_len:
            raise ValueError(
                f"input length {length} exceeds max_seq_length {self.max_len}; "
                "use extend-length to train a longer model"
            )
        h = self.word(input_ids) + self.token_type(token_type_ids)
        if self.position is not None:
            h = h + self.position(jnp.arange(length))[None]
        return dropout(self.norm(h), self.rate, rng)


class MultiHeadAttention(nnx.Module):
    """softmax(QKᵀ/√d_head) V over all positions (bidirectional); padded keys get no weight (attention_weights)."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        d_in: int | None = None,
        d_attn: int | None = None,
        d_out: int | None = None,
        num_heads: int | None = None,
    ):
        d_in = d_in or cfg.hidden_size
        self.d_attn = d_attn or cfg.hidden_size
        self.num_heads = num_heads or cfg.num_heads
        if self.d_attn % self.num_heads:
            raise ValueError(f"attention width {self.d_attn} is not divisible by num_heads {self.num_heads}")
        self.query = dense(cfg, d_in, self.d_attn, rngs)
        self.key = dense(cfg, d_in, self.d_attn, rngs)
        self.value = dense(cfg, d_in, self.d_attn, rngs)
        self.out = dense(cfg, self.d_attn, d_out or cfg.hidden_size, rngs)
        self.rate = cfg.dropout

    def __call__(self, x, mask=None, rng=None, causal: bool = False, *, probs: bool = False):
        """(B, L, d_out); with ``probs`` also the attention probabilities (B, heads, L, L) before dropout."""
        b, n, _ = x.shape
        split = lambda t: t.reshape(b, n, self.num_heads, -1)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        allowed = jnp.ones((b, 1, n, n), bool)
        if mask is not None:
            allowed = allowed & (mask[:, None, None, :] > 0)
        if causal:
            allowed = allowed & jnp.tril(jnp.ones((n, n), bool))[None, None]
        p = attention_weights(q, k, allowed).astype(x.dtype)  # a fully padded row: uniform, as always
        out = self.out(jnp.einsum("bhqk,bkhd->bqhd", dropout(p, self.rate, rng), v).reshape(b, n, self.d_attn))
        return (out, p) if probs else out


def padding_mask(x: jax.Array, mask: jax.Array | None, enabled: bool) -> jax.Array:
    """x (B, L, C) with padded positions zeroed: what token mixing (SSM convolutions, gMLP's spatial
    weights) reads, so an example's output does not depend on how much padding its batch has."""
    if not enabled or mask is None:
        return x
    return x * mask[..., None].astype(x.dtype)


class LayerStack(nnx.Module):
    """``num_layers`` blocks of one class held as one block whose parameters carry a leading layer axis
    (the scanned layout, ssmlm.models.layout), so the forward pass is one ``jax.lax.scan`` and XLA compiles
    the block once whatever the depth.

    Built from the unrolled blocks, so a scanned model initialised with seed s has exactly the parameters
    of the unrolled one with seed s. ``stack[i]`` is a copy of block i (for reading: kernels, tests);
    ``stack[i] = block`` writes one back.
    """

    def __init__(self, blocks: list[nnx.Module]):
        graphdef, *states = (nnx.split(blocks[0])[0], *(nnx.split(b)[1] for b in blocks))
        self.block = nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))
        self.num = len(blocks)

    def __len__(self) -> int:
        return self.num

    def __getitem__(self, i: int) -> nnx.Module:
        if not -self.num <= i < self.num:
            raise IndexError(f"layer {i} of {self.num}")
        graphdef, state = nnx.split(self.block)
        return nnx.merge(graphdef, jax.tree.map(lambda x: x[i], state))

    def __setitem__(self, i: int, block: nnx.Module) -> None:
        _, state = nnx.split(self.block)
        nnx.update(self.block, jax.tree.map(lambda s, x: s.at[i].set(x), state, nnx.split(block)[1]))

    def __iter__(self):
        return (self[i] for i in range(self.num))


def run_block(graphdef, state, h, mask, rng, intermediates: bool):
    """One block ``layer(h, mask, rng)`` from its graph definition and state: a pure function of arrays,
    so the unrolled loop and the scan (and jax.checkpoint around either) call the block the same way.
    Returns (h, aux) with aux the block's named intermediates plus its output as ``hidden``, or (h, None)."""
    out = nnx.merge(graphdef, state)(h, mask, rng, intermediates=intermediates)
    if not intermediates:
        return out, None
    h, aux = out
    return h, {**aux, "hidden": h}


def stack_aux(per_layer: list[dict]) -> dict[str, jax.Array]:
    return {k: jnp.stack([a[k] for a in per_layer]) for k in per_layer[0]}


class Encoder(nnx.Module):
    """Embeddings, then ``num_layers`` blocks ``layer(h, mask, rng) -> h``, then a final LayerNorm for
    pre-norm blocks (``pre_norm``) unless ``cfg.final_norm`` is off.

    Pre-norm blocks add unnormalised branch outputs to the residual stream, so its scale is free; the MLM head
    normalises, so pretraining never bounds it, and a finetuning head that reads the raw stream (pooler,
    span logits) saturates. The final norm is the pre-LN Transformer's answer (ln_f); post-LN blocks end
    in a LayerNorm already. With ``cfg.remat`` each block's activations are recomputed in the backward pass.

    ``cfg.scan_layers`` (resolved by layers_scanned: auto by depth) holds the blocks stacked (LayerStack) and
    runs them under ``jax.lax.scan``; off, they are a list run by a Python loop. Both compute the same function
    of the same parameters: block i gets dropout key fold(rng, i + 1) either way. A plain ``jax.lax.scan`` over
    the split state rather than ``nnx.scan``: the keys and the intermediates are then ordinary scan inputs and outputs.

    ``intermediates=True`` returns ``(h, aux)``: aux maps a name to an array with a leading layer axis —
    ``hidden`` (num_layers, B, L, d), every block's output (the last one is h before the final norm), and
    what the family's blocks expose (see their ``__call__``).
    """

    def __init__(self, cfg: ModelConfig, layer_cls, *, rngs: nnx.Rngs, positions: bool = True, pre_norm: bool = True):
        self.cfg = cfg
        self.embeddings = Embeddings(cfg, rngs=rngs, positions=positions)
        blocks = [layer_cls(cfg, rngs=rngs) for _ in range(cfg.num_layers)]
        self.layers = LayerStack(blocks) if layers_scanned(cfg) else nnx.List(blocks)
        self.final_norm = layer_norm(cfg, cfg.hidden_size, rngs) if pre_norm and cfg.final_norm else None

    def word_embeddings(self) -> jax.Array:
        return self.embeddings.word.embedding[...]

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, *, rng=None, intermediates=False):
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        h = self.embeddings(input_ids, token_type_ids, fold(rng, 0))
        block = lambda g, s, h, r: run_block(g, s, h, attention_mask, r, intermediates)  # noqa: E731
        if self.cfg.remat:
            block = jax.checkpoint(block, static_argnums=(0,))
        if isinstance(self.layers, LayerStack):
            graphdef, state = nnx.split(self.layers.block)
            n = len(self.layers)
            keys = None if rng is None else jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(1, n + 1))
            h, aux = jax.lax.scan(lambda h, xs: block(graphdef, xs[0], h, xs[1]), h, (state, keys))
        else:
            per_layer = []
            for i, layer in enumerate(self.layers):
                h, a = block(*nnx.split(layer), h, fold(rng, i + 1))
                per_layer.append(a)
            aux = stack_aux(per_layer) if intermediates else None
        h = self.final_norm(h) if self.final_norm is not None else h
        return (h, aux) if intermediates else h
