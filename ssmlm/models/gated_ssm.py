"""The Gated SSM of the Birdie paper (3.4, A.16.1; birdie_official.md §4.2) and Gated SSM+.

Gated SSM, one fused block (SSM and MLP in one, as in GSS/Mamba: no separate MLP), with u = RMSNorm(x):

    i_t = σ(W_i u_t)      z_t = W_z u_t      o_t = GeLU(W_o u_t)      f_t = σ(W_f u_t)      all ∈ ℝᴺ
    h_t = f_t ⊙ h_{t−1} + i_t ⊙ z_t
    x_t ← x_t + W_out(o_t ⊙ h_t)                                                             N → d

Every Dense has a bias (A.16.1 shows flax Dense layers): 5·d·N + 4·N + d parameters, plus the norm's d. The
pre-RMSNorm and the residual are our choice: the paper does not specify them; the author's quick_ssm layer uses
exactly this layout. Gates depend on the input only, so the recurrence is one linear scan (ssmlm.models.scan),
run in float32; in a bidirectional layer the state's second half is scanned right to left over the prefix.

Gated SSM+ (GatedSSMPlusBlock) is an ASSUMPTION: the paper names it but never defines it (notes §4.4). Here it is
the same recurrence inside a Hawk-style layout: the recurrence input z is passed through a causal depthwise
Conv1D of width conv_width (taps masked at sample boundaries) before the recurrence, and the block is followed by
a separate pre-norm gated MLP residual block of width round(mlp_expansion·d).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models.config import LMConfig
from ssmlm.models.layers import DTYPES, gelu
from ssmlm.models.lm import CausalConv1D, GatedMLP, linear, rms_norm
from ssmlm.models.lm_context import Context
from ssmlm.models.scan import bidirectional_scan, bidirectional_step, halves


class GatedSSMBlock(nnx.Module):
    def __init__(self, cfg: LMConfig, bidirectional: bool, *, rngs: nnx.Rngs):
        d, n = cfg.hidden_size, cfg.state_size
        halves(n, bidirectional)  # an odd state cannot be split: refuse at construction
        self.bidirectional = bidirectional
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
        h = bidirectional_scan(f, i * z, ctx, self.bidirectional)
        return x + self.w_out(o * h.astype(o.dtype)), h, None

    def __call__(self, x, ctx: Context):
        return self.mix(x, ctx)[0]

    def init_cache(self, batch: int, max_len: int) -> dict:
        return {"h": jnp.zeros((batch, self.state_size), jnp.float32)}

    def prefill(self, x, ctx: Context, cache: dict):
        y, h, _ = self.mix(x, ctx)
        # the forward half's last state is the memory; the reverse half is reset at every causal token anyway
        return y, {"h": h[:, -1]}

    def step(self, x, cache: dict, pos):
        f, z, i, o = self.gates(x)
        h = bidirectional_step(f, i * z, cache["h"], self.bidirectional)
        return x + self.w_out(o * h.astype(o.dtype)), {"h": h}


class GatedSSMPlusBlock(nnx.Module):
    """Gated SSM+ (an assumption, see the module docstring): z_t = Conv1D(W_z u)_t, then the MLP block."""

    def __init__(self, cfg: LMConfig, bidirectional: bool, *, rngs: nnx.Rngs):
        self.ssm = GatedSSMBlock(cfg, bidirectional, rngs=rngs)
        self.conv = CausalConv1D(cfg, cfg.state_size, rngs=rngs)
        self.mlp = GatedMLP(cfg, rngs=rngs)

    def mix(self, x, ctx: Context):
        s = self.ssm
        f, z_in, i, o = s.gates(x)
        z = self.conv(z_in, ctx.segment_ids)
        h = bidirectional_scan(f, i * z, ctx, s.bidirectional)
        return x + s.w_out(o * h.astype(o.dtype)), h, z_in

    def __call__(self, x, ctx: Context):
        return self.mlp(self.mix(x, ctx)[0])

    def init_cache(self, batch: int, max_len: int) -> dict:
        s = self.ssm
        conv = jnp.zeros((batch, self.conv.width - 1, s.state_size), s.compute_dtype)
        return {"h": jnp.zeros((batch, s.state_size), jnp.float32), "conv": conv}

    def prefill(self, x, ctx: Context, cache: dict):
        y, h, z_in = self.mix(x, ctx)
        return self.mlp(y), {"h": h[:, -1], "conv": self.conv.tail(z_in).astype(cache["conv"].dtype)}

    def step(self, x, cache: dict, pos):
        s = self.ssm
        f, z_in, i, o = s.gates(x)
        z, tail = self.conv.step(z_in.astype(cache["conv"].dtype), cache["conv"])
        h = bidirectional_step(f, i * z, cache["h"], s.bidirectional)
        y = x + s.w_out(o * h.astype(o.dtype))
        return self.mlp(y), {"h": h, "conv": tail}
