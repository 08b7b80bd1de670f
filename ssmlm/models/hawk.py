"""Hawk (De et al., Griffin paper) as trained in Birdie (2.1, A.16.2; docs/faithfulness.md#birdie-models): a
recurrent block built on the RG-LRU, then a gated MLP block.

Recurrent block, with u = RMSNorm(x) and N the state width:

    g   = GeLU(W_gate u)                                  side gate, d → N, no bias
    ξ   = Conv1D(W_input u)                               d → N, no bias; causal depthwise conv, width 4
    r_t = σ(W_a ξ_t)      i_t = σ(W_x ξ_t)                N → N, with bias (the paper: full Dense;
                                                          Griffin: block-diagonal)
    log a_t = −c · r_t · softplus(Λ)                      c = rg_lru_c = 8; a_t = exp(log a_t) = σ(−Λ)^(c·r_t)
    β_t = sqrt_bound_derivative(1 − a_t², 1000)           √(1 − a²), gradient capped (A.16.2)
    h_t = a_t ⊙ h_{t−1} + β_t ⊙ (i_t ⊙ ξ_t)               at a reset: a = 0, β = 1 (RecurrentGemma)
    x_t ← x_t + W_output(g_t ⊙ h_t)                       N → d, no bias

then x ← x + MLP(RMSNorm(x)) (ssmlm.models.lm.GatedMLP, expansion mlp_expansion = 8/3).

The paper's listing computes a_t twice, once with a sign error; this is the consistent log-space reading,
RecurrentGemma's.

Λ's initialisation, ``model.rg_lru_init`` (a = σ(−Λ) = exp(−softplus(Λ)) is the base decay, a^c the decay at r = 1;
at init the gate is r ≈ σ(0) = 1/2, so a_t ≈ a^(c/2); a decay a keeps ~1/(1 − a) tokens):

    paper           (default) a^c uniform in [0.9, 0.999], as the Griffin paper's text says: a_t at init has
                    median ≈ 0.974 (memory ~39 tokens, range ~19-2000); at r = 1 median 0.95 (~20 tokens).
    recurrentgemma  DeepMind's recurrentgemma (the Griffin authors' code, ``rnn_real_param_init``): the base a
                    uniform in ring area on [0.9, 0.999], i.e. a² uniform in [0.81, 0.998], softplus(Λ) = −log a
                    (c does not enter), so a^c spans 0.43-0.99 (median 0.67, ~3 tokens) and a_t at init has median
                    ≈ 0.82 (~5.5 tokens, range ~3-250): much shorter memories at the start of training.
                    (recurrentgemma computes log(exp(y) − 1) with an ε of 1e-8 under its log; ssmlm's expm1 gives
                    the same distribution, more exactly for a near 1.)

The RG-LRU's parameters live under ``rg_lru/`` (``a_param`` = Λ, ``w_a``, ``w_x``) so one parameter rule keeps
them out of weight decay (A.8: "no weight decay on RG-LRU parameters or biases").
"""

from __future__ import annotations

import functools

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
from ssmlm.models.scan import bidirectional_scan, bidirectional_step, channel_resets, halves, step_resets

MAX_GRADIENT = 1000.0
A_RANGE = (0.9, 0.999)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def sqrt_bound_derivative(x, max_gradient: float = MAX_GRADIENT):
    """√x whose derivative is capped at ``max_gradient``: √x′ = 1/(2√x) is infinite at x = 0, which a = 1 − tiny
    (a slow decay) reaches; the paper found Hawk untrainable without the cap, gradient clipping being too late."""
    return jnp.sqrt(x)


def _sqrt_fwd(x, max_gradient):
    return jnp.sqrt(x), x


def _sqrt_bwd(max_gradient, x, g):
    floor = 1.0 / (4.0 * max_gradient**2)  # 1/(2√floor) = max_gradient
    return (g / (2.0 * jnp.sqrt(jnp.maximum(x, floor))),)


sqrt_bound_derivative.defvjp(_sqrt_fwd, _sqrt_bwd)


def init_lambda(key, shape, dtype=jnp.float32, c: float = 8.0, rule: str = "paper"):
    """Λ = softplus⁻¹(y) = log(expm1(y)) for y = softplus(Λ) = −log(a^c)/c drawn by ``rule`` (module docstring):
    paper: a^c uniform in A_RANGE; recurrentgemma: a² uniform in [lo², hi²] of A_RANGE, y = −log(a)."""
    u = jax.random.uniform(key, shape, jnp.float32)
    lo, hi = A_RANGE
    if rule == "paper":
        y = -jnp.log(lo + u * (hi - lo)) / c
    elif rule == "recurrentgemma":
        y = -0.5 * jnp.log(lo**2 + u * (hi**2 - lo**2))
    else:
        raise ValueError(f"rg_lru_init must be paper or recurrentgemma, not {rule!r}")
    return jnp.log(jnp.expm1(y)).astype(dtype)


class RGLRU(nnx.Module):
    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        n = cfg.state_size
        self.c = cfg.rg_lru_c
        self.w_a = linear(cfg, n, n, rngs)
        self.w_x = linear(cfg, n, n, rngs)
        lam = init_lambda(rngs.params(), (n,), DTYPES[cfg.param_dtype], cfg.rg_lru_c, cfg.rg_lru_init)
        self.a_param = nnx.Param(lam)

    def coefficients(self, xi, reset):
        """(a, β ⊙ i ⊙ ξ) in float32 for inputs ξ; ``reset`` (…, N) bool: a = 0, β = 1 there."""
        r = jax.nn.sigmoid(self.w_a(xi).astype(jnp.float32))
        i = jax.nn.sigmoid(self.w_x(xi).astype(jnp.float32))
        log_a = -self.c * r * jax.nn.softplus(self.a_param[...].astype(jnp.float32))
        a = jnp.exp(log_a)
        beta = sqrt_bound_derivative(1.0 - jnp.exp(2.0 * log_a), MAX_GRADIENT)
        beta = jnp.where(reset, 1.0, beta)
        return jnp.where(reset, 0.0, a), beta * i * xi.astype(jnp.float32)


class HawkBlock(nnx.Module):
    def __init__(self, cfg: LMConfig, bidirectional: bool, *, rngs: nnx.Rngs):
        d, n = cfg.hidden_size, cfg.state_size
        halves(n, bidirectional)
        self.bidirectional = bidirectional
        self.scan_impl = cfg.scan_impl
        self.state_size = n
        self.compute_dtype = DTYPES[cfg.compute_dtype]
        self.norm = rms_norm(cfg, d, rngs)
        self.w_gate = linear(cfg, d, n, rngs, bias=False)
        self.w_input = linear(cfg, d, n, rngs, bias=False)
        self.conv = CausalConv1D(cfg, n, rngs=rngs)
        self.rg_lru = RGLRU(cfg, rngs=rngs)
        self.w_output = linear(cfg, n, d, rngs, bias=False)
        self.mlp = GatedMLP(cfg, rngs=rngs)
        self.act = gelu(cfg)

    def mix(self, x, ctx: Context):
        u = self.norm(x)
        g = self.act(self.w_gate(u))
        v = self.w_input(u)
        xi = self.conv(v, ctx.segment_ids)
        a, b = self.rg_lru.coefficients(xi, channel_resets(ctx, self.state_size, self.bidirectional))
        h = bidirectional_scan(a, b, ctx, self.bidirectional, self.scan_impl)
        return x + self.w_output(g * h.astype(g.dtype)), h, v

    def __call__(self, x, ctx: Context):
        return self.mlp(self.mix(x, ctx)[0])

    def init_cache(self, batch: int, max_len: int) -> dict:
        conv = jnp.zeros((batch, self.conv.width - 1, self.state_size), self.compute_dtype)
        return {"h": jnp.zeros((batch, self.state_size), jnp.float32), "conv": conv}

    def prefill(self, x, ctx: Context, cache: dict):
        y, h, v = self.mix(x, ctx)
        tail = self.conv.tail(v, prompt_lengths(ctx)).astype(cache["conv"].dtype)
        return self.mlp(y), {"h": at_last(h, ctx), "conv": tail}

    def step(self, x, cache: dict, pos):
        u = self.norm(x)
        g = self.act(self.w_gate(u))
        xi, tail = self.conv.step(self.w_input(u).astype(cache["conv"].dtype), cache["conv"])
        a, b = self.rg_lru.coefficients(xi, step_resets(x.shape[0], self.state_size, self.bidirectional))
        h = bidirectional_step(a, b, cache["h"], self.bidirectional)
        y = x + self.w_output(g * h.astype(g.dtype))
        return self.mlp(y), {"h": h, "conv": tail}


def hawk_params(cfg: LMConfig) -> int:
    """norm, W_gate W_input W_output (no bias), conv, W_a W_x (N→N, bias), Λ, MLP."""
    d, n, w = cfg.hidden_size, cfg.state_size, cfg.conv_width
    return d + 3 * d * n + w * n + n + 2 * (n * n + n) + n + mlp_params(cfg)


# the RG-LRU's parameters (Λ, W_a, W_x) keep out of weight decay (A.8)
ARCHS = {
    "hawk": LMBlock(
        name="Hawk (Birdie)",
        block=HawkBlock,
        per_layer_params=hawk_params,
        mixing_flops=recurrence_flops,
        no_decay=r"(^|/)rg_lru/",
        describe=lambda cfg: [
            f"state={cfg.state_size}",
            f"conv {cfg.conv_width}",
            mlp_text(cfg),
            f"Λ init {cfg.rg_lru_init}",
        ],
    )
}
MODELS = dict.fromkeys(ARCHS, LanguageModel)
