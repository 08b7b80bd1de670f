"""BiGS: Bidirectional Gated SSM (Wang et al., "Pretraining Without Attention", arXiv 2212.10544), Section 4.

One gated layer, with X_i ∈ R^{L×d} the layer input and σ = GELU:

    X  = LayerNorm(X_i)
    V  = σ(W_v X)                          L × 3d
    F  = σ(W_f X)                          L × d
    B  = σ(W_b Flip(X))                    L × d
    U1 = W_u1 SSM_f(F)                     L × d
    U2 = W_u2 SSM_b(B)                     L × d
    U  = σ(W_u (U1 ⊗ Flip(U2)))            L × 3d
    O  = W_o (U ⊗ V)                       L × d
    X_{i+1} = O + X_i

SSM_f and SSM_b are S4D convolutions (ssmlm.models.s4d), each one kernel shared by all d channels.
Because B is built from the flipped sequence and U2 is flipped back, U2 at position t sees tokens t..L-1;
U1 sees 0..t; their product is what makes the layer bidirectional.

Embeddings follow the official code: word + learned absolute position + token type, LayerNorm (eps 1e-12),
dropout. No dropout inside the layers and no final LayerNorm (the MLM head's LayerNorm plays that role).
Every dense layer has a bias (the paper's equations omit them; the official code has them).

Differences from the official Flax code, as options of ModelConfig:
  gelu="exact" (paper, default) vs "tanh" (official layers use the tanh approximation);
  a_init="hippo" (official default) vs "lin" / "inv"; the kernel is evaluated at the input length
  (the official code asserts input length == max_position_embeddings; padding to that length is the
  data pipeline's job here).
Names of the official parameters: W_v=dv, W_f=du_forward, W_b=du_backward, W_u1=duc_forward,
W_u2=duc_backward, W_u=dol, W_o=do, SSM_f=fs4, SSM_b=bs4.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models import s4d
from ssmlm.recipe import ModelConfig

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def dense(cfg: ModelConfig, d_in: int, d_out: int, rngs: nnx.Rngs, init=None) -> nnx.Linear:
    return nnx.Linear(
        d_in,
        d_out,
        kernel_init=init or nnx.initializers.normal(cfg.initializer_range),
        bias_init=nnx.initializers.zeros,
        dtype=DTYPES[cfg.compute_dtype],
        param_dtype=DTYPES[cfg.param_dtype],
        rngs=rngs,
    )


def layer_norm(cfg: ModelConfig, dim: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(dim, epsilon=cfg.layer_norm_eps, param_dtype=DTYPES[cfg.param_dtype], rngs=rngs)


def gelu(cfg: ModelConfig):
    return functools.partial(jax.nn.gelu, approximate=cfg.gelu == "tanh")


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    """Inverted dropout with an explicit key; rng=None means deterministic (evaluation)."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def flip(x: jax.Array) -> jax.Array:
    return jnp.flip(x, axis=1)  # sequence axis of (B, L, H)


class SSM(nnx.Module):
    """One S4D kernel shared across channels: A_re, A_im (N,), C (N, 2), D (1,), log_step (1,) — 4N+2 params."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        n = cfg.num_ssm
        a_re, a_im = s4d.init_a(n, cfg.a_init)
        self.A_re = nnx.Param(jnp.asarray(a_re))
        self.A_im = nnx.Param(jnp.asarray(a_im))
        self.C = nnx.Param(jax.random.normal(rngs.params(), (n, 2)) * jnp.sqrt(0.5))
        self.D = nnx.Param(jnp.ones((1,)))
        self.log_step = nnx.Param(
            jax.random.uniform(rngs.params(), (1,), minval=jnp.log(0.01), maxval=jnp.log(1.0))
        )

    def kernel(self, length: int) -> jax.Array:
        return s4d.s4d_kernel(self.A_re[...], self.A_im[...], self.C[...], self.log_step[...], length)

    def __call__(self, u: jax.Array) -> jax.Array:
        return s4d.causal_conv(u, self.kernel(u.shape[1]), self.D[...])


class GatedLayer(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, d3 = cfg.hidden_size, cfg.intermediate_size
        self.norm = layer_norm(cfg, d, rngs)
        self.w_v = dense(cfg, d, d3, rngs)
        self.w_f = dense(cfg, d, d, rngs)
        self.w_b = dense(cfg, d, d, rngs)
        self.ssm_f = SSM(cfg, rngs=rngs)
        self.ssm_b = SSM(cfg, rngs=rngs)
        self.w_u1 = dense(cfg, d, d, rngs)
        self.w_u2 = dense(cfg, d, d, rngs)
        self.w_u = dense(cfg, d, d3, rngs)
        self.w_o = dense(cfg, d3, d, rngs)
        self.act = gelu(cfg)

    def __call__(self, x_i: jax.Array) -> jax.Array:
        σ = self.act
        x = self.norm(x_i)
        v = σ(self.w_v(x))
        f = σ(self.w_f(x))
        b = σ(self.w_b(flip(x)))
        u1 = self.w_u1(self.ssm_f(f))
        u2 = self.w_u2(self.ssm_b(b))
        u = σ(self.w_u(u1 * flip(u2)))
        o = self.w_o(u * v)
        return x_i + o


class Embeddings(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        init = nnx.initializers.normal(cfg.initializer_range)
        kw = dict(embedding_init=init, param_dtype=DTYPES[cfg.param_dtype], rngs=rngs)
        self.word = nnx.Embed(cfg.vocab_size, cfg.hidden_size, **kw)
        self.position = nnx.Embed(cfg.max_seq_length, cfg.hidden_size, **kw)
        self.token_type = nnx.Embed(cfg.type_vocab_size, cfg.hidden_size, **kw)
        self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
        self.rate = cfg.dropout

    def __call__(self, input_ids, token_type_ids, rng) -> jax.Array:
        length = input_ids.shape[1]
        if length > self.position.num_embeddings:
            raise ValueError(
                f"input length {length} exceeds max_seq_length {self.position.num_embeddings}; "
                "use extend-length to train a longer model"
            )
        h = self.word(input_ids) + self.token_type(token_type_ids) + self.position(jnp.arange(length))[None]
        return dropout(self.norm(h), self.rate, rng)


class BiGSEncoder(nnx.Module):
    """Embeddings and the stack of gated layers; returns hidden states (B, L, d)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embeddings = Embeddings(cfg, rngs=rngs)
        self.layers = nnx.List([GatedLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])

    def word_embeddings(self) -> jax.Array:
        return self.embeddings.word.embedding[...]

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None, *, rng=None) -> jax.Array:
        # attention_mask is accepted for a uniform encoder interface; like the paper's model, the SSM
        # routing does not mask padding (inputs are right-padded; only the pooler uses the mask).
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        h = self.embeddings(input_ids, token_type_ids, rng)
        for layer in self.layers:
            h = layer(h)
        return h

    def kernels(self, length: int) -> tuple[jax.Array, jax.Array]:
        """Forward and backward kernels of every layer, each (num_layers, L) — for `analyze kernels`."""
        fwd = jnp.stack([layer.ssm_f.kernel(length) for layer in self.layers])
        bwd = jnp.stack([layer.ssm_b.kernel(length) for layer in self.layers])
        return fwd, bwd


def param_count_formula(cfg: ModelConfig) -> dict[str, int]:
    """Closed-form parameter count (bigs_official.md §6.1), used by tests and dry runs."""
    h, i, v, n = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_ssm
    per_layer = 3 * h * i + 4 * h * h + 2 * i + 7 * h + 2 * (4 * n + 2)
    embeddings = v * h + cfg.max_seq_length * h + cfg.type_vocab_size * h + 2 * h
    mlm_head = h * h + h + 2 * h + v
    return {
        "per_layer": per_layer,
        "encoder": per_layer * cfg.num_layers,
        "embeddings": embeddings,
        "mlm_total": per_layer * cfg.num_layers + embeddings + mlm_head,
    }
