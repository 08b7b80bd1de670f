"""Comparing two float32 computations of one function, with a tolerance scaled by the magnitudes involved.

Two float32 computations that sum in different orders (scan vs unrolled loop, remat vs not, decoding vs the full
forward pass, another CPU's vector width) differ by rounding. For a sum s = Σ tᵢ that error is bounded by
~n·ε·Σ|tᵢ|: it is relative to the size of the *terms*, not of the result. A fixed ``atol`` (or an elementwise
``rtol``) gets this wrong both ways: an entry where terms of size 50 cancel to 0.02 differs by ~1e-5 between two
correct computations and fails ``atol=1e-5`` on some CPUs (a gradient row of 1.5–48 in test_scan did), while
entries of size 50 pass an ``rtol`` far looser than their rounding.

The terms are not visible after the fact, so ``assert_close_scaled`` takes a lower bound for their size: the
largest magnitude along ``axis`` (a row: one position's logits, one gradient row, which the same reductions over the
same activations produce), and at least ``floor`` (for values that cancel to ~0 over a whole row: their terms are
the size of the neighbouring values, which the caller knows). The test is then |actual − expected| ≤ rtol · scale,
with ``rtol`` a multiple of float32 ε (``EPS32``) that each caller justifies: a small multiple of ε times how much
the computation can amplify rounding, far below the relative size of the errors a bug makes (≥ 1e-3).

The other principled option, comparing against a float64 evaluation of the same function, is used where the
reference is plain numpy (e.g. test_bigs_model's ref_mlm, test_lm_models' reference_scan). The models themselves
cannot run in float64 (their compute dtype is float32 or bfloat16 and heads cast to float32), so comparisons of
two model code paths scale by magnitude instead.
"""

from __future__ import annotations

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23 ≈ 1.19e-7


def row_scale(*arrays, axis=-1, floor: float = 0.0) -> np.ndarray:
    """max(|a|) over ``axis`` (kept for broadcasting; None: the whole array) across ``arrays``, at least ``floor``."""
    mags = np.maximum.reduce([np.nan_to_num(np.abs(np.asarray(a, np.float64)), nan=0.0) for a in arrays])
    if mags.ndim == 0 or axis is None:
        return np.maximum(np.full(mags.shape, mags.max() if mags.size else 0.0), floor)
    return np.maximum(mags.max(axis=axis, keepdims=True), floor)


def assert_close_scaled(actual, expected, *, rtol: float, axis=-1, floor: float = 0.0, name: str = "") -> None:
    """Assert |actual − expected| ≤ rtol · scale elementwise, scale = ``row_scale(actual, expected, axis, floor)``.

    ``axis``: the axis (or tuple of axes; None for the whole array) a scale is taken over. ``floor``: a least
    scale, in the units of the values. On failure the message names ``name``, how many entries are off, and for the
    worst one its index, both values, the difference, the scale and the difference in units of ε·scale.
    """
    a = np.asarray(actual, np.float64)
    b = np.asarray(expected, np.float64)
    assert a.shape == b.shape, f"{name or 'arrays'}: shapes differ, {a.shape} vs {b.shape}"
    if a.size == 0:
        return
    scale = np.broadcast_to(row_scale(a, b, axis=axis, floor=floor), a.shape)
    diff = np.abs(a - b)
    tol = rtol * scale
    bad = ~(diff <= tol)  # a NaN or an infinity anywhere counts as a difference
    if not bad.any():
        return
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(bad, diff / tol, 0.0)
    worst = np.unravel_index(int(np.nanargmax(np.where(np.isnan(excess), np.inf, excess))), a.shape)
    raise AssertionError(
        f"{name or 'arrays'}: {int(bad.sum())} of {a.size} entries differ by more than rtol·scale "
        f"(rtol={rtol:.3g} = {rtol / EPS32:.0f}ε, scale = max |value| over axis={axis}, at least {floor:.3g}); "
        f"worst at {tuple(int(i) for i in worst)}: actual {a[worst]:.8g}, expected {b[worst]:.8g}, "
        f"|diff| {diff[worst]:.3g}, scale {scale[worst]:.3g}, |diff| = {diff[worst] / scale[worst] / EPS32:.1f}ε·scale"
    )
