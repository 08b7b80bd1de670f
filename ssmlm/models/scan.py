"""Linear recurrences h_t = f_t ⊙ h_{t−1} + x_t for the Birdie language models (docs/faithfulness.md#birdie-scan).

The whole-sequence form has two implementations of one function (``impl``, model.scan_impl):

- associative: ``jax.lax.associative_scan`` with the operator (a₁, b₁) ∘ (a₂, b₂) = (a₁·a₂, a₂·b₁ + b₂) on pairs
  (f_t, x_t), composing "multiply by a₁, add b₁" then "multiply by a₂, add b₂": O(log L) depth, the choice
  where parallel hardware has idle lanes (GPU, TPU);
- sequential: one ``jax.lax.scan`` step per token. On CPU it is the faster of the two both to run (the
  associative form does ~2 log₂ L passes over the state instead of one) and to compile (one loop body instead
  of O(log L) strided slices and concatenations per scan, per layer): measured by benchmarks/scan_impl.py.

``auto`` (the default) is sequential on CPU and associative elsewhere, deciding by the platform the step is
compiled for (ssmlm.models.platform.backend: a TPU or GPU target compiled from a CPU host gets the associative
form), not by the host. ``scan_choice`` says which and why, for reports. Both agree to float32 rounding.

A reset zeroes f at its position, so nothing before it reaches h_t (and, reversed, nothing after it). Scans
always run in float32, whatever the compute dtype: the paper keeps recurrences out of bfloat16 (A.8).

Bidirectional split (paper 3.1, A.3): the state's first half is scanned left to right with ``fwd_reset`` (reset at
each sample's first token), the second half right to left with ``rev_reset`` (reset everywhere outside the
prefix and at a sample's last token). In the causal region the reverse half is therefore h^r_t = x^r_t, which
depends on no later token; in the prefix it accumulates the prefix from the right (plus START, a constant).
Same parameters and FLOPs as a causal scan.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ssmlm.models import platform


def _combine(left, right):
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


def _step(h, fx):
    f_t, x_t = fx
    h = f_t * h + x_t
    return h, h


def scan_choice(impl: str) -> tuple[str, str]:
    """(the implementation model.scan_impl ``impl`` stands for, why): auto resolved for the platform being
    compiled for (ssmlm.models.platform.backend)."""
    if impl not in ("auto", "associative", "sequential"):
        raise ValueError(f"scan_impl {impl!r}: expected auto, associative or sequential")
    if impl != "auto":
        return impl, "model.scan_impl"
    target = platform.backend()
    if target == "cpu":
        return "sequential", "auto for cpu: one loop step per token runs and compiles faster on a CPU"
    return "associative", f"auto for {target}: O(log L) depth fills the parallel hardware"


def resolve(impl: str) -> str:
    """model.scan_impl with auto resolved for the platform being compiled for (``scan_choice``)."""
    return scan_choice(impl)[0]


def linear_scan(f, x, reset, reverse: bool = False, impl: str = "auto") -> jax.Array:
    """h over axis 1 of (B, L, N) ``f``, ``x``: h_t = f_t h_{t−1} + x_t (``reverse``: h_t = f_t h_{t+1} + x_t),
    float32. ``reset`` (B, L) or (B, L, N) bool: f is taken as 0 there, so h_t = x_t."""
    f = jnp.asarray(f, jnp.float32)
    x = jnp.asarray(x, jnp.float32)
    if reset.ndim == 2:
        reset = reset[..., None]
    f = jnp.where(reset, 0.0, f)
    if resolve(impl) == "associative":
        _, h = jax.lax.associative_scan(_combine, (f, x), axis=1, reverse=reverse)
        return h
    time_major = (jnp.moveaxis(f, 1, 0), jnp.moveaxis(x, 1, 0))
    _, h = jax.lax.scan(_step, jnp.zeros_like(x[:, 0]), time_major, reverse=reverse)
    return jnp.moveaxis(h, 0, 1)


def halves(n: int, bidir: bool) -> int:
    """Width of the forward half of an n-wide state (all of it in a causal layer)."""
    if bidir and n % 2:
        raise ValueError(f"a bidirectional layer splits its state in halves: state width {n} is odd")
    return n // 2 if bidir else n


def channel_resets(ctx, n: int, bidir: bool) -> jax.Array:
    """(B, L, n) bool: where each state channel resets in its own scan direction (forward half: fwd_reset,
    reverse half: rev_reset). Hawk needs it beyond the scan: its input normaliser is 1 at a reset."""
    k = halves(n, bidir)
    b, length = ctx.fwd_reset.shape
    fwd = jnp.broadcast_to(ctx.fwd_reset[..., None], (b, length, k))
    if not bidir:
        return fwd
    rev = jnp.broadcast_to(ctx.rev_reset[..., None], (b, length, n - k))
    return jnp.concatenate([fwd, rev], axis=-1)


def bidirectional_scan(f, x, ctx, bidir: bool, impl: str = "auto") -> jax.Array:
    """(B, L, N) float32 states of a layer: all forward, or [forward half ‖ reverse half] when ``bidir``."""
    k = halves(f.shape[-1], bidir)
    if not bidir:
        return linear_scan(f, x, ctx.fwd_reset, impl=impl)
    h_f = linear_scan(f[..., :k], x[..., :k], ctx.fwd_reset, impl=impl)
    h_r = linear_scan(f[..., k:], x[..., k:], ctx.rev_reset, reverse=True, impl=impl)
    return jnp.concatenate([h_f, h_r], axis=-1)


def step_resets(batch: int, n: int, bidir: bool) -> jax.Array:
    """(B, n) bool resets of one decoded (causal, not sample-first) token: the reverse half only."""
    k = halves(n, bidir)
    return jnp.broadcast_to(jnp.arange(n) >= k, (batch, n))


def bidirectional_step(f, x, h, bidir: bool) -> jax.Array:
    """One causal token: (B, N) gates and inputs, previous state ``h`` (B, N) float32 -> the new state, which is
    also the layer's state output. The forward half carries memory; the reverse half is x^r_t (rev_reset
    holds everywhere in the causal region), whatever ``h`` holds there."""
    reset = step_resets(f.shape[0], f.shape[-1], bidir)
    f = jnp.where(reset, 0.0, jnp.asarray(f, jnp.float32))
    return f * h + jnp.asarray(x, jnp.float32)
