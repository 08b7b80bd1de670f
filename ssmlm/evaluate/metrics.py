"""Task metrics (the GLUE set): accuracy, F1, Matthews correlation, Pearson and Spearman."""

from __future__ import annotations

import numpy as np
from scipy import stats


def accuracy(pred: np.ndarray, gold: np.ndarray) -> float:
    return float(np.mean(pred == gold))


def f1(pred: np.ndarray, gold: np.ndarray, positive: int = 1) -> float:
    tp = np.sum((pred == positive) & (gold == positive))
    fp = np.sum((pred == positive) & (gold != positive))
    fn = np.sum((pred != positive) & (gold == positive))
    return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0


def matthews(pred: np.ndarray, gold: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin), equal to the binary formula for two classes."""
    classes = np.union1d(pred, gold)
    c = np.array([[np.sum((gold == a) & (pred == b)) for b in classes] for a in classes], dtype=np.float64)
    t, p, n = c.sum(1), c.sum(0), c.sum()
    num = np.trace(c) * n - t @ p
    den = np.sqrt((n**2 - p @ p) * (n**2 - t @ t))
    return float(num / den) if den else 0.0


def pearson(pred: np.ndarray, gold: np.ndarray) -> float:
    return float(stats.pearsonr(pred, gold)[0]) if np.std(pred) > 0 else 0.0


def spearman(pred: np.ndarray, gold: np.ndarray) -> float:
    return float(stats.spearmanr(pred, gold)[0]) if np.std(pred) > 0 else 0.0


METRICS = {"accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson, "spearman": spearman}


def score(names: tuple[str, ...], logits: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Predictions from logits (argmax, or the score itself for regression) scored by each metric."""
    pred = logits[:, 0] if logits.shape[1] == 1 else logits.argmax(-1)
    return {n: METRICS[n](pred, gold) for n in names}
