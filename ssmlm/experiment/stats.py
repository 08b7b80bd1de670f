"""Intervals over seeds: a Student t interval for the mean (n < 5), a percentile bootstrap (n >= 5), and the
paired difference to a reference arm (paired by seed) with its t interval. The t quantile is scipy's (a
dependency of ssmlm already: ssmlm.evaluate.metrics).

An interval from fewer than MIN_N values, or from values that are all the same, is computed all the same but
marked not estimable, with the reason: two seeds give one degree of freedom (a t quantile of 12.7), and equal
values give a zero-width interval that says nothing about the spread the next seed would show."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

LEVEL = 0.95
BOOTSTRAP_FROM = 5  # seeds; fewer: the t interval (a bootstrap of 2-4 values has almost no distinct resamples)
BOOTSTRAP_RESAMPLES = 10_000
MIN_N = 3  # fewer values (seeds, or pairs of seeds): the interval is not estimable


@dataclasses.dataclass(frozen=True)
class Interval:
    n: int
    mean: float
    low: float | None  # None: no interval (one value)
    high: float | None
    method: str  # "t", "bootstrap" or "" (n = 1)
    estimable: bool = True  # False: low and high say nothing (see reason); the mean stands
    reason: str | None = None  # why not estimable: "n=2 < 3", "zero spread"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def judged(iv: Interval, values) -> Interval:
    """``iv`` marked not estimable when it has fewer than MIN_N values or they have no spread."""
    x = np.asarray(values, dtype=float)
    reasons = [f"n={iv.n} < {MIN_N}"] if iv.n < MIN_N else []
    # equal up to rounding (differences of accuracies that are equal fractions can differ in the last bit)
    if iv.n >= 2 and float(np.ptp(x)) <= 1e-12 * max(1.0, float(np.abs(x).max())):
        reasons.append("zero spread")
    return dataclasses.replace(iv, estimable=False, reason="; ".join(reasons)) if reasons else iv


def t_interval(values, level: float = LEVEL) -> Interval:
    """mean ± t_{(1+level)/2, n-1} · s / √n (s with n - 1 degrees of freedom)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    n, mean = len(x), float(x.mean())
    if n < 2:
        return judged(Interval(n, mean, None, None, ""), x)
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    return judged(Interval(n, mean, mean - half, mean + half, "t"), x)


def bootstrap_interval(values, level: float = LEVEL, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Interval:
    """The percentile bootstrap of the mean: the (1-level)/2 and (1+level)/2 quantiles of ``resamples`` means of
    n values drawn with replacement (a fixed generator: the same values give the same interval)."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return judged(Interval(len(x), float(x.mean()), float(lo), float(hi), "bootstrap"), x)


def mean_interval(values, level: float = LEVEL) -> Interval:
    """The arm's interval: percentile bootstrap from BOOTSTRAP_FROM values, else Student t."""
    return bootstrap_interval(values, level) if len(values) >= BOOTSTRAP_FROM else t_interval(values, level)


def paired_difference(values: dict, reference: dict, level: float = LEVEL) -> Interval | None:
    """arm − reference over the seeds both have (seed -> value), with the t interval of the differences."""
    seeds = [s for s in values if s in reference]
    if not seeds:
        return None
    return t_interval([values[s] - reference[s] for s in seeds], level)


def spread(values) -> dict:
    """{"mean", "std" (n - 1 degrees of freedom; 0 for one value), "values"}: a metric over seeds as
    `ssmlm finetune --seeds` records it (RUN-seeds.json)."""
    x = np.asarray(values, dtype=float)
    std = float(x.std(ddof=1)) if len(x) > 1 else 0.0
    return {"mean": float(x.mean()), "std": std, "values": x.tolist()}


def over_seeds(summaries: list[dict], seeds: list[int]) -> dict:
    """The spread over the seeds' runs of each final and best validation metric (the first run's float fields)."""
    out = {"seeds": seeds, "final": {}, "best": {}}
    getters = {"final": lambda s: s.get("validation") or {}, "best": lambda s: s.get("best_validation") or {}}
    for kind, get in getters.items():
        for k, v in get(summaries[0]).items():
            if isinstance(v, float):
                out[kind][k] = spread([get(s)[k] for s in summaries])
    return out


def cut(iv: dict | None, bounds, difference: bool = False) -> dict | None:
    """The interval cut at the metric's bounds (a difference's at ±their span): a t-interval from few seeds can
    reach past what the metric can be, e.g. an accuracy of 1.3. ``cut`` is set when it was."""
    if not iv or iv["low"] is None or not bounds:
        return iv
    lo, hi = bounds if not difference else (bounds[0] - bounds[1], bounds[1] - bounds[0])
    low, high = max(iv["low"], lo), min(iv["high"], hi)
    return {**iv, "low": low, "high": high, "cut": (low, high) != (iv["low"], iv["high"])}
