"""Birdie's reward model (critic), v1 = paper (paper 3.3; docs/faithfulness.md#birdie-controller).

A sequence model over evaluation steps. Row t is [loss vector ℓ_t (n) ‖ action a_t (n)] (v1's loss-first order);
the output at t is the predicted per-configuration reward r̂_t ∈ ℝⁿ of taking a_t at losses ℓ_t:

    x = Linear_{2n→w}(RMSSplit(row))
    x ← x + y_t  (CriticBlock, residual included)            (layers times)
    r̂ = Linear_{w→n}(RMSSplit(x))                           no output nonlinearity (v1)

CriticBlock (v1 ``gated_ssm_agent.py``), with z = RMSSplit(x), width w, state N:

    K_t = σ(W_K z_t)                    [u_t, gi_t, go_t] = W_ugg z_t          all ∈ ℝᴺ
    u_t ← u_t ⊙ σ(gi_t) ⊙ (1 − K_t)
    h_0 = u_0,   h_t = K_{t−1} ⊙ h_{t−1} + u_t
    y_t = W_out(h_t ⊙ σ(go_t))                                                  N → w

No biases anywhere. The recurrence runs in float32 through ``ssmlm.models.scan.linear_scan``.
``score_last`` evaluates many candidate next rows after one shared history: the history is scanned once and each
candidate costs one recurrent step from the shared state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models.layers import dense
from ssmlm.models.scan import linear_scan


def _linear(d_in: int, d_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    """The shared dense builder without a model config: LeCun-normal kernel, no bias, float32 (v1's Dense)."""
    return dense(None, d_in, d_out, rngs, bias=False)


class RMSSplit(nnx.Module):
    """RMS-normalise the two halves of the last dim separately (learned scale, init 1, eps 1e-8), concatenate,
    then multiply by a learned vector initialised to 0.1 (v1 ``RMS_split``).

    Not ssmlm.models.layers.RMSNorm, on purpose: v1's norm adds eps to the RMS (x / (‖x‖/√d + eps)), not to the
    mean square under the root, normalises two halves with separate scales and has the extra output scale; the
    critic reproduces v1, so it keeps v1's formula (float32 throughout, as the whole critic)."""

    def __init__(self, width: int, eps: float = 1e-8):
        if width % 2:
            raise ValueError(f"RMSSplit splits its input in two halves: width {width} is odd")
        self.half = width // 2
        self.eps = eps
        self.scale_a = nnx.Param(jnp.ones((self.half,), jnp.float32))
        self.scale_b = nnx.Param(jnp.ones((self.half,), jnp.float32))
        self.out_scale = nnx.Param(jnp.full((width,), 0.1, jnp.float32))

    def _norm(self, x, scale):
        ss = jnp.sum(x * x, axis=-1, keepdims=True)
        # ‖x‖/√d, with a finite gradient at x = 0 (a zero-padded history row): sqrt' is infinite there
        norm = jnp.where(ss > 0, jnp.sqrt(jnp.where(ss > 0, ss, 1.0)), 0.0)
        return scale[...] * x / (norm / jnp.sqrt(x.shape[-1]) + self.eps)

    def __call__(self, x):
        a, b = x[..., : self.half], x[..., self.half :]
        normed = jnp.concatenate([self._norm(a, self.scale_a), self._norm(b, self.scale_b)], axis=-1)
        return normed * self.out_scale[...]


class CriticBlock(nnx.Module):
    """One pre-norm Gated-SSM residual block of the critic (module docstring)."""

    def __init__(self, width: int, state: int, *, rngs: nnx.Rngs):
        self.state = state
        self.norm = RMSSplit(width)
        self.w_k = _linear(width, state, rngs)
        self.w_ugg = _linear(width, 3 * state, rngs)
        self.w_out = _linear(state, width, rngs)

    def gates(self, x):
        """(K, gated input u, output gate σ(go)) of any leading shape."""
        z = self.norm(x)
        k = jax.nn.sigmoid(self.w_k(z))
        u, g_in, g_out = jnp.split(self.w_ugg(z), 3, axis=-1)
        return k, u * jax.nn.sigmoid(g_in) * (1.0 - k), jax.nn.sigmoid(g_out)

    def scan(self, x):
        """(B, T, w) -> (output (B, T, w), states h (B, T, N), forget gates K (B, T, N))."""
        k, u, g_out = self.gates(x)
        # v1 applies the PREVIOUS step's K to h_{t−1} (a clean version would use K_t): shift K right by one;
        # the reset at t = 0 gives h_0 = u_0.
        k_prev = jnp.concatenate([jnp.zeros_like(k[:, :1]), k[:, :-1]], axis=1)
        reset = jnp.zeros(x.shape[:2], bool).at[:, 0].set(True)
        h = linear_scan(k_prev, u, reset)
        return x + self.w_out(h * g_out), h, k

    def __call__(self, x):
        return self.scan(x)[0]

    def step(self, x, h_prev, k_prev):
        """One row (P, w) after the state (h_{t−1}, K_{t−1}) (each (P, N) or broadcastable) -> (y, h_t, K_t)."""
        k, u, g_out = self.gates(x)
        h = k_prev * h_prev + u
        return x + self.w_out(h * g_out), h, k


class RewardModel(nnx.Module):
    """The v1/paper critic: (B, T, 2n) rows [loss ‖ action] -> (B, T, n) predicted per-configuration rewards."""

    def __init__(self, n: int, width: int = 256, state: int = 512, layers: int = 4, *, rngs: nnx.Rngs):
        self.n = n
        self.in_norm = RMSSplit(2 * n)
        self.w_in = _linear(2 * n, width, rngs)
        self.blocks = nnx.List([CriticBlock(width, state, rngs=rngs) for _ in range(layers)])
        self.out_norm = RMSSplit(width)
        self.w_out = _linear(width, n, rngs)

    def _embed(self, rows):
        return self.w_in(self.in_norm(jnp.asarray(rows, jnp.float32)))

    def _head(self, x):
        return self.w_out(self.out_norm(x))

    def __call__(self, x):
        if x.shape[-1] != 2 * self.n:
            raise ValueError(f"reward model rows: expected width 2n = {2 * self.n}, got {x.shape[-1]}")
        x = self._embed(x)
        for block in self.blocks:
            x = block(x)
        return self._head(x)

    def score_last(self, history, candidates, length=None):
        """(P, n): the output at the last position of ``history ‖ candidate`` for each candidate row.

        ``history`` (T, 2n) (T may be 0) is scanned once; each of the (P, 2n) ``candidates`` then takes one
        recurrent step from the shared final state. With ``length`` (an int or a traced int scalar) the history is
        padded and only its first ``length`` rows count (a fixed shape for jit); rows past it are ignored since
        the model is causal."""
        t_max = history.shape[0]
        x = self._embed(history)[None]
        carries = []
        for block in self.blocks:
            n_state = block.state
            if t_max == 0:
                h = k = jnp.zeros((1, n_state), jnp.float32)
            else:
                y, hs, ks = block.scan(x)
                last = t_max - 1 if length is None else length - 1
                idx = jnp.clip(last, 0, t_max - 1)
                seen = jnp.asarray(last >= 0, jnp.float32)  # empty history: zero state, so h_0 = u_0
                h, k = hs[:, idx] * seen, ks[:, idx] * seen
                x = y
            carries.append((h, k))
        z = self._embed(candidates)
        for block, (h, k) in zip(self.blocks, carries, strict=True):
            z, _, _ = block.step(z, h, k)
        return self._head(z)
