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
dropout. No dropout inside the layers. Every dense layer has a bias (the paper's equations omit them; the
official code has them).

Two departures from the official code, each an option whose `false` is the official behaviour (measurements:
docs/faithfulness.md#bigs-final-norm):
  final_norm=True: a LayerNorm after the last layer. Without it the product U1 ⊗ Flip(U2) of two linear SSM
  read-outs lets one layer's branch grow quadratically; the MLM head normalises, so MLM never notices, but the
  pooler's tanh saturates and finetuning learns nothing.
  mask_padding=True: F and B are zeroed at padded positions before the SSMs, so padding never enters the
  convolutions and a sentence's prediction does not depend on its batch's padding.
And one option that departs from the paper's block, off by default, on in recipes/default.yaml
(docs/faithfulness.md#bigs-gate-norm):
  gate_norm=True: U = σ(W_u LayerNorm(U1 ⊗ Flip(U2))). The final norm only hides the growth from the heads:
  the grown branch still drowns every earlier layer's contribution to the residual stream. Normalising the
  product removes the quadratic path. 2d parameters per layer.

Differences from the official Flax code, as options of ModelConfig:
  gelu="exact" (paper, default) vs "tanh" (official layers use the tanh approximation);
  a_init="hippo" (official default) vs "lin" / "inv"; the kernel is evaluated at the input length
  (the official code asserts input length == max_position_embeddings; padding to that length is the
  data pipeline's job here).
Ablation (paper Table 1, "gated/att"): GatedAttentionLayer keeps V, U and O and replaces the SSM routing
(W_f, W_b, SSM_f, SSM_b, W_u1, W_u2: 4d² parameters) by bidirectional multi-head self-attention (Q, K, V,
O: 4d²), U = σ(W_u Attn(X)). The paper gives no code for it; this reading keeps the ≈13d² per layer of
its parameter accounting. Option ssm_kernels="per_channel" gives every channel its own S4D (standard S4D)
instead of the paper's shared kernel.
Names of the official parameters: W_v=dv, W_f=du_forward, W_b=du_backward, W_u1=duc_forward,
W_u2=duc_backward, W_u=dol, W_o=do, SSM_f=fs4, SSM_b=bs4.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models import s4d
from ssmlm.models.config import ArchFacts, BiGSConfig, ModelConfig
from ssmlm.models.layers import DTYPES, Encoder, MultiHeadAttention, dense, dropout, gelu, layer_norm, padding_mask
from ssmlm.models.rules import ParamRule, common_rules, ssm_rule

__all__ = ["DTYPES", "dense", "dropout", "gelu", "layer_norm", "SSM", "GatedLayer", "BiGSEncoder"]


def flip(x: jax.Array) -> jax.Array:
    return jnp.flip(x, axis=1)  # sequence axis of (B, L, H)


class SSM(nnx.Module):
    """S4D with B = 1: A_re, A_im (N,), C (N, 2), D (1,), log_step (1,) — 4N+2 parameters shared by all
    channels (paper), or the same per channel with a leading H axis (ssm_kernels="per_channel")."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        n = cfg.num_ssm
        lead = (cfg.hidden_size,) if cfg.ssm_kernels == "per_channel" else ()
        a_re, a_im = s4d.init_a(n, cfg.a_init)
        self.A_re = nnx.Param(jnp.broadcast_to(jnp.asarray(a_re), (*lead, n)))
        self.A_im = nnx.Param(jnp.broadcast_to(jnp.asarray(a_im), (*lead, n)))
        self.C = nnx.Param(jax.random.normal(rngs.params(), (*lead, n, 2)) * jnp.sqrt(0.5))
        self.D = nnx.Param(jnp.ones(lead or (1,)))
        self.log_step = nnx.Param(
            jax.random.uniform(rngs.params(), (*lead, 1), minval=jnp.log(0.01), maxval=jnp.log(1.0))
        )

    def kernel(self, length: int) -> jax.Array:
        """(L,) for a shared kernel, (H, L) per channel."""
        fn = lambda a_re, a_im, c, log_step: s4d.s4d_kernel(a_re, a_im, c, log_step, length)  # noqa: E731
        args = (self.A_re[...], self.A_im[...], self.C[...], self.log_step[...])
        return jax.vmap(fn)(*args) if args[0].ndim == 2 else fn(*args)

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
        self.mask_padding = cfg.mask_padding
        self.gate_norm = layer_norm(cfg, d, rngs) if cfg.gate_norm else None

    def __call__(self, x_i: jax.Array, mask=None, rng=None, *, intermediates: bool = False):
        # rng: uniform block interface (no dropout inside the layer). mask: padded positions are zeroed before
        # the SSMs (mask_padding), else the backward SSM would carry padding into every real position.
        # intermediates: also return both SSM kernels, (L,) each, or (d, L) per channel.
        σ = self.act
        x = self.norm(x_i)
        v = σ(self.w_v(x))
        f = padding_mask(σ(self.w_f(x)), mask, self.mask_padding)
        b = flip(padding_mask(σ(self.w_b(x)), mask, self.mask_padding))  # = σ(W_b Flip(X)), padding zeroed
        u1 = self.w_u1(self.ssm_f(f))
        u2 = self.w_u2(self.ssm_b(b))
        gate = u1 * flip(u2)
        if self.gate_norm is not None:
            gate = self.gate_norm(gate)
        u = σ(self.w_u(gate))
        o = self.w_o(u * v)
        if not intermediates:
            return x_i + o
        n = x_i.shape[1]
        return x_i + o, {"ssm_kernel_forward": self.ssm_f.kernel(n), "ssm_kernel_backward": self.ssm_b.kernel(n)}


class GatedAttentionLayer(nnx.Module):
    """gated/att: the gated block with attention routing (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, d3 = cfg.hidden_size, cfg.intermediate_size
        self.norm = layer_norm(cfg, d, rngs)
        self.w_v = dense(cfg, d, d3, rngs)
        self.attention = MultiHeadAttention(cfg, rngs=rngs)
        self.w_u = dense(cfg, d, d3, rngs)
        self.w_o = dense(cfg, d3, d, rngs)
        self.act = gelu(cfg)

    def __call__(self, x_i: jax.Array, mask=None, rng=None, *, intermediates: bool = False):
        # intermediates: also return the attention probabilities (B, heads, L, L)
        σ = self.act
        x = self.norm(x_i)
        v = σ(self.w_v(x))
        a, probs = self.attention(x, mask, rng, probs=True)
        u = σ(self.w_u(a))
        out = x_i + self.w_o(u * v)
        return (out, {"attention": probs}) if intermediates else out


class BiGSEncoder(Encoder):
    """Embeddings and the stack of gated SSM layers; returns hidden states (B, L, d)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, GatedLayer, rngs=rngs)

    def kernels(self, length: int) -> tuple[jax.Array, jax.Array]:
        """Forward and backward kernels of every layer, each (num_layers, L) — for `analyze kernels`.
        With per-channel kernels the mean over channels is returned."""
        return layer_kernels(self.layers, length, lambda layer: (layer.ssm_f, layer.ssm_b))


def layer_kernels(layers, length: int, ssms) -> tuple[jax.Array, jax.Array]:
    """Forward and backward kernels (num_layers, L) of ``ssms(layer)`` for every layer, in either layout;
    per-channel kernels are averaged over channels."""
    k = lambda ssm: ssm.kernel(length) if ssm.A_re.ndim == 1 else ssm.kernel(length).mean(0)  # noqa: E731
    pairs = [tuple(k(s) for s in ssms(layer)) for layer in layers]
    return jnp.stack([f for f, _ in pairs]), jnp.stack([b for _, b in pairs])


class GatedAttentionEncoder(Encoder):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, GatedAttentionLayer, rngs=rngs)


def param_rules(cfg: ModelConfig) -> list[ParamRule]:
    """Optimizer rules of bigs and gated/att (ssmlm.models.rules): the S4D parameters in their own rule and the
    ``ssm`` group (the recipe's SSM learning rate and decay), no decay on biases and LayerNorm scales."""
    return ([ssm_rule()] if cfg.arch == "bigs" else []) + common_rules()


def param_count_formula(cfg: ModelConfig) -> dict[str, int]:
    """Closed-form parameter count of BiGS (docs/faithfulness.md#bigs-param-counts), used by tests and dry runs."""
    h, i, v, n = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_ssm
    per_layer = 3 * h * i + 4 * h * h + 2 * i + 7 * h + 2 * (4 * n + 2) + (2 * h if cfg.gate_norm else 0)
    embeddings = v * h + cfg.max_seq_length * h + cfg.type_vocab_size * h + 2 * h
    mlm_head = h * h + h + 2 * h + v
    final_norm = 2 * h if cfg.final_norm else 0
    return {
        "per_layer": per_layer,
        "encoder": per_layer * cfg.num_layers + final_norm,
        "embeddings": embeddings,
        "mlm_total": per_layer * cfg.num_layers + final_norm + embeddings + mlm_head,
    }


Config = BiGSConfig  # this family's `model:` fields (ssmlm.models.config)
MODELS = {"bigs": BiGSEncoder, "gated_att": GatedAttentionEncoder}
ARCHS = {  # what the reports and analyses ask of each arch (ssmlm.models.config.ArchFacts)
    "bigs": ArchFacts(name="BiGS", ssm_kernels=True, table6="BiGS"),
    "gated_att": ArchFacts(name="BiGS gated attention (ablation)", table6="BiGS", pad_blind=True),
}


def mixing_flops(cfg: BiGSConfig, seq_len: int) -> float:
    """Training FLOPs per token beyond 6 per dense parameter (ssmlm.models.flops): gated/att's attention
    scores and mixing (12·L·d per layer), or two S4D FFT convolutions per gated layer (≈30·log2(2L) per
    channel each, forward + backward)."""
    if cfg.arch == "gated_att":
        return 12.0 * seq_len * cfg.hidden_size * cfg.num_layers
    return 2 * cfg.num_layers * 30.0 * math.log2(2 * seq_len) * cfg.hidden_size
