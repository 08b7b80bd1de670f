"""Task metrics (the GLUE set): accuracy, F1, Matthews correlation, Pearson and Spearman.

Every metric returns a finite float and never raises on degenerate input. Where a score is undefined
(no examples, a single class, constant gold or constant predictions) it is 0.0: nothing was shown to be
right, and no relation between predictions and gold can be shown. A NaN would otherwise poison the
best-validation choice, seed means and the result tables.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def accuracy(pred: np.ndarray, gold: np.ndarray) -> float:
    """Fraction of exact matches; 0.0 for no examples."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    return float(np.mean(pred == gold)) if gold.size else 0.0


def f1(pred: np.ndarray, gold: np.ndarray, positive: int = 1) -> float:
    """F1 of the ``positive`` class; 0.0 when there is no true positive (including no positives at all
    and no examples), where precision or recall is 0 or undefined."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    tp = np.sum((pred == positive) & (gold == positive))
    fp = np.sum((pred == positive) & (gold != positive))
    fn = np.sum((pred != positive) & (gold == positive))
    return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0


def matthews(pred: np.ndarray, gold: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin), equal to the binary formula for two classes.

    0.0 when it is undefined: no examples, or gold or predictions all of one class (the denominator is 0).
    """
    pred, gold = np.asarray(pred).ravel(), np.asarray(gold).ravel()
    if gold.size == 0:
        return 0.0
    classes = np.union1d(pred, gold)
    c = np.array([[np.sum((gold == a) & (pred == b)) for b in classes] for a in classes], dtype=np.float64)
    t, p, n = c.sum(1), c.sum(0), c.sum()
    num = np.trace(c) * n - t @ p
    den = np.sqrt((n**2 - p @ p) * (n**2 - t @ t))
    return float(num / den) if den else 0.0


def _correlation(fn, pred: np.ndarray, gold: np.ndarray) -> float:
    """``fn`` (a scipy correlation) when it is defined, else 0.0.

    Undefined: fewer than 2 examples, constant predictions or constant gold (a zero variance), or
    non-finite values (e.g. a diverged regression head). Constancy is tested by equality, not by the
    standard deviation, which can be a rounding error above 0 for identical values.
    """
    pred = np.asarray(pred, dtype=np.float64).ravel()
    gold = np.asarray(gold, dtype=np.float64).ravel()
    if pred.shape != gold.shape:
        raise ValueError(f"{pred.size} predictions for {gold.size} gold values")
    if pred.size < 2 or not (np.isfinite(pred).all() and np.isfinite(gold).all()):
        return 0.0
    if (pred == pred[0]).all() or (gold == gold[0]).all():
        return 0.0
    r = float(fn(pred, gold)[0])
    return r if np.isfinite(r) else 0.0


def pearson(pred: np.ndarray, gold: np.ndarray) -> float:
    """Pearson's r; 0.0 where undefined (fewer than 2 examples, constant predictions or gold)."""
    return _correlation(stats.pearsonr, pred, gold)


def spearman(pred: np.ndarray, gold: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); 0.0 where undefined, as for `pearson`."""
    return _correlation(stats.spearmanr, pred, gold)


METRICS = {"accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson, "spearman": spearman}


def score(names: tuple[str, ...], logits: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Predictions from logits (argmax, or the score itself for regression) scored by each metric."""
    pred = logits[:, 0] if logits.shape[1] == 1 else logits.argmax(-1)
    return {n: METRICS[n](pred, gold) for n in names}
