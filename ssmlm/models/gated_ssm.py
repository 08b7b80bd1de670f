"""The Gated SSM of the Birdie paper (3.4, A.16.1; docs/faithfulness.md#birdie-models) and Gated SSM+.

Gated SSM, one fused block (SSM and MLP in one, as in GSS/Mamba: no separate MLP), with u = RMSNorm(x):

    i_t = σ(W_i u_t)      z_t = W_z u_t      o_t = GeLU(W_o u_t)      f_t = σ(W_f u_t)      all ∈ ℝᴺ
    h_t = f_t ⊙ h_{t−1} + i_t ⊙ z_t
    x_t ← x_t + W_out(o_t ⊙ h_t)                                                             N → d

Every Dense has a bias (A.16.1 shows flax Dense layers): 5·d·N + 4·N + d parameters, plus the norm's d. The
pre-RMSNorm and the residual are our choice: the paper does not specify them; the author's quick_ssm layer uses
exactly this layout. Gates depend on the input only, so the recurrence is one linear scan (ssmlm.models.scan),
run in float32; in a bidirectional layer the state's second half is scanned right to left over the prefix.

Gated SSM+, the model of the paper's main results (§3.4, footnote 4 -> Appendix E.2, "Gated SSM Implementation"),
with u = RMSNorm(x):

    o_t  = GeLU(W_out_gate u_t)                       from the block input, before the convolution     d → N
    u'   = Conv1D(u)                                  causal, kernel conv_width = 4, taps masked per sample
    f_t  = σ(W_f u'_t)      z_t = (W_z u'_t) ⊙ σ(W_z_gate u'_t)                                       → N
    h_t  = f_t ⊙ h_{t−1} + z_t
    x_t ← x_t + W_out(o_t ⊙ h_t)                                                                       N → d

then "a separate MLP block" (§3.4): x ← x + MLP(RMSNorm(x)), ssmlm.models.lm.GatedMLP of width mlp_expansion·d.
Unlike the Gated SSM there is no input gate i_t: z carries its own sigmoid gate, as the listing writes it.

How the listing's ambiguities are read:
- Which width the convolution runs at. The listing convolves the block input x (width d) with
  ``Conv(features=state_size, kernel_size=4)``. §3.4 says the convolution processes the inputs "as in prior
  work" (Hyena, Mamba, Griffin), all of which use a short *depthwise* convolution; a depthwise convolution of x
  keeps width d, so W_f, W_z and W_z_gate map d → N (``model.plus_conv: depthwise``, the default, 4·d + d
  parameters). Read literally, flax's Conv with features=N on a d-wide input is a *dense* convolution d → N
  (4·d·N + N parameters, more than any projection of the block) followed by N → N projections: that reading is
  ``model.plus_conv: dense``.
- Causality and padding: flax's Conv pads 'SAME' by default, which would let a token see three later ones in an
  LM; the convolution here is causal (as in every cited model) and a tap never crosses a sample boundary.
- Norms, residuals, biases: the listing shows only the mixing layer. As for the Gated SSM, a pre-RMSNorm and a
  residual wrap it, and its Dense layers keep flax's default bias. GeLU is ``model.gelu`` (the listing imports
  jax.nn.gelu, whose default is the tanh approximation: the Birdie recipes set ``gelu: tanh``).
- Bidirectional layers split the state in halves exactly as the Gated SSM does (the listing is causal).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models.config import LMConfig
from ssmlm.models.layers import DTYPES, gelu
from ssmlm.models.lm import (  # noqa: F401  the family interface
    CausalConv1D,
    Config,
    GatedMLP,
    LanguageModel,
    LMBlock,
    at_last,
    linear,
    mixing_flops,
    mlp_params,
    mlp_text,
    param_rules,
    prompt_lengths,
    recurrence_flops,
    rms_norm,
)
from ssmlm.models.lm_context import Context
from ssmlm.models.scan import bidirectional_scan, bidirectional_step, halves


class GatedSSMBlock(nnx.Module):
    def __init__(self, cfg: LMConfig, bidirectional: bool, *, rngs: nnx.Rngs):
        d, n = cfg.hidden_size, cfg.state_size
        halves(n, bidirectional)  # an odd state cannot be split: refuse at construction
        self.bidirectional = bidirectional
        self.scan_impl = cfg.scan_impl
        self.state_size = n
        self.compute_dtype = DTYPES[cfg.compute_dtype]
        self.norm = rms_norm(cfg, d, rngs)
        self.w_i = linear(cfg, d, n, rngs)
        self.w_z = linear(cfg, d, n, rngs)
        self.w_o = linear(cfg, d, n, rngs)
        self.w_f = linear(cfg, d, n, rngs)
        self.w_out = linear(cfg, n, d, rngs)
        self.act = gelu(cfg)

    def gates(self, x):
        """(f, z, i, o) of the normalised input, any leading shape."""
        u = self.norm(x)
        return jax.nn.sigmoid(self.w_f(u)), self.w_z(u), jax.nn.sigmoid(self.w_i(u)), self.act(self.w_o(u))

    def mix(self, x, ctx: Context):
        """(residual output, all states (B, L, N) float32, conv input or None)."""
        f, z, i, o = self.gates(x)
        h = bidirectional_scan(f, i * z, ctx, self.bidirectional, self.scan_impl)
        return x + self.w_out(o * h.astype(o.dtype)), h, None

    def __call__(self, x, ctx: Context):
        return self.mix(x, ctx)[0]

    def init_cache(self, batch: int, max_len: int) -> dict:
        return {"h": jnp.zeros((batch, self.state_size), jnp.float32)}

    def prefill(self, x, ctx: Context, cache: dict):
        y, h, _ = self.mix(x, ctx)
        # the forward half's last state is the memory; the reverse half is reset at every causal token anyway
        return y, {"h": at_last(h, ctx)}

    def step(self, x, cache: dict, pos):
        f, z, i, o = self.gates(x)
        h = bidirectional_step(f, i * z, cache["h"], self.bidirectional)
        return x + self.w_out(o * h.astype(o.dtype)), {"h": h}


class GatedSSMPlusBlock(nnx.Module):
    """Gated SSM+ (Appendix E.2, see the module docstring), then the separate MLP block."""

    def __init__(self, cfg: LMConfig, bidirectional: bool, *, rngs: nnx.Rngs):
        d, n = cfg.hidden_size, cfg.state_size
        halves(n, bidirectional)
        self.bidirectional = bidirectional
        self.scan_impl = cfg.scan_impl
        self.state_size = n
        self.compute_dtype = DTYPES[cfg.compute_dtype]
        self.norm = rms_norm(cfg, d, rngs)
        self.w_out_gate = linear(cfg, d, n, rngs)
        dense = cfg.plus_conv == "dense"
        self.conv = CausalConv1D(cfg, d, features=n if dense else None, rngs=rngs)
        c = n if dense else d  # width of the convolved input u'
        self.w_f = linear(cfg, c, n, rngs)
        self.w_z = linear(cfg, c, n, rngs)
        self.w_z_gate = linear(cfg, c, n, rngs)
        self.w_out = linear(cfg, n, d, rngs)
        self.mlp = GatedMLP(cfg, rngs=rngs)
        self.act = gelu(cfg)

    def gates(self, u, uc):
        """(f, z, o) from the normalised input u and its convolution uc."""
        z = self.w_z(uc) * jax.nn.sigmoid(self.w_z_gate(uc))
        return jax.nn.sigmoid(self.w_f(uc)), z, self.act(self.w_out_gate(u))

    def mix(self, x, ctx: Context):
        """(residual output before the MLP, all states (B, L, N) float32, the convolution's input u)."""
        u = self.norm(x)
        f, z, o = self.gates(u, self.conv(u, ctx.segment_ids))
        h = bidirectional_scan(f, z, ctx, self.bidirectional, self.scan_impl)
        return x + self.w_out(o * h.astype(o.dtype)), h, u

    def __call__(self, x, ctx: Context):
        return self.mlp(self.mix(x, ctx)[0])

    def init_cache(self, batch: int, max_len: int) -> dict:
        conv = jnp.zeros((batch, self.conv.width - 1, self.conv.kernel.shape[1]), self.compute_dtype)
        return {"h": jnp.zeros((batch, self.state_size), jnp.float32), "conv": conv}

    def prefill(self, x, ctx: Context, cache: dict):
        y, h, u = self.mix(x, ctx)
        tail = self.conv.tail(u, prompt_lengths(ctx)).astype(cache["conv"].dtype)
        return self.mlp(y), {"h": at_last(h, ctx), "conv": tail}

    def step(self, x, cache: dict, pos):
        u = self.norm(x)
        uc, tail = self.conv.step(u.astype(cache["conv"].dtype), cache["conv"])
        f, z, o = self.gates(u, uc)
        h = bidirectional_step(f, z, cache["h"], self.bidirectional)
        y = x + self.w_out(o * h.astype(o.dtype))
        return self.mlp(y), {"h": h, "conv": tail}


def gated_ssm_params(cfg: LMConfig) -> int:
    """norm, W_i W_z W_o W_f (d→N, bias), W_out (N→d, bias)."""
    d, n = cfg.hidden_size, cfg.state_size
    return d + 5 * d * n + 4 * n + d


def gated_ssm_plus_params(cfg: LMConfig) -> int:
    """norm, W_out_gate (d→N), conv, W_f W_z W_z_gate (c→N), W_out (N→d), MLP."""
    d, n, w = cfg.hidden_size, cfg.state_size, cfg.conv_width
    c, conv = (d, w * d + d) if cfg.plus_conv == "depthwise" else (n, w * d * n + n)
    return d + (d * n + n) + conv + 3 * (c * n + n) + (n * d + d) + mlp_params(cfg)


W_F = r"(^|/)w_f/(kernel|bias)$"  # the forget gate W_f: no weight decay on the recurrence's decay (paper A.8)
ARCHS = {
    "gated_ssm": LMBlock(
        name="gated SSM (Birdie)",
        block=GatedSSMBlock,
        per_layer_params=gated_ssm_params,
        mixing_flops=recurrence_flops,
        no_decay=W_F,
        describe=lambda cfg: [f"state={cfg.state_size}", "fused, no MLP"],
    ),
    "gated_ssm_plus": LMBlock(
        name="gated SSM+ (Birdie)",
        block=GatedSSMPlusBlock,
        per_layer_params=gated_ssm_plus_params,
        mixing_flops=recurrence_flops,
        no_decay=W_F,
        describe=lambda cfg: [f"state={cfg.state_size}", f"conv {cfg.conv_width} {cfg.plus_conv}", mlp_text(cfg)],
    ),
}
MODELS = dict.fromkeys(ARCHS, LanguageModel)
