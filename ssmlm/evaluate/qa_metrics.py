"""Scores for free-form answers to extractive questions (Birdie §4.4 / App. B: SQuAD v2 by generation).

A generated response is scored against the gold answer strings:

- Answer Contains Label: 1 if any gold answer appears verbatim in the response, else 0. The paper's headline
  metric: its models are not trained for brevity, so a correct answer inside a sentence counts in full.
- its normalised variant: the same test after SQuAD normalisation of both sides (lowercase, no punctuation, no
  articles, single spaces). The paper does not say whether it normalised; we report both.
- token F1: the official SQuAD token-overlap F1, the best over the golds. It penalises verbosity.

Per item the scores are in [0, 1]; summaries (`summarize`, `by_length`) are percentages, as the paper reports.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ssmlm.evaluate.squad_metrics import f1, normalize_answer

# Context-length bin edges in tokens. Birdie Figure 2 plots the SQuAD v2 scores against context length, but
# neither its text nor its caption gives the edges; SQuAD v2 dev contexts run from ~30 to ~800 tokens (mostly
# 100-300), so fixed 128-token bins with an open last bin cover every context with enough items per bin.
DEFAULT_BINS = (0, 128, 256, 384, 512, 640, math.inf)

METRICS = ("contains", "contains_normalized", "f1")


def _golds(golds: Iterable[str]) -> list[str]:
    # an empty gold would be "contained" in every response
    return [g for g in golds if g.strip()]


def contains_label(pred: str, golds: Sequence[str]) -> float:
    """1.0 when some gold answer is a literal substring of the response (case and punctuation as given)."""
    return float(any(g in pred for g in _golds(golds)))


def contains_label_normalized(pred: str, golds: Sequence[str]) -> float:
    """`contains_label` after SQuAD normalisation of the response and of each gold."""
    p = normalize_answer(pred)
    return float(any(g in p for g in (normalize_answer(g) for g in golds) if g))


def token_f1(pred: str, golds: Sequence[str]) -> float:
    """The SQuAD v2 token F1 of the response, the best over the gold answers (in [0, 1]).

    As the official v2.0 script does, golds that normalise to nothing are dropped (none left: only an empty
    response scores).
    """
    kept = [g for g in golds if normalize_answer(g)] or [""]
    return max(f1(pred, g, version_2=True) for g in kept)


def score(pred: str, golds: Sequence[str]) -> dict[str, float]:
    """All three per-item scores, keyed as in `METRICS`."""
    return {
        "contains": contains_label(pred, golds),
        "contains_normalized": contains_label_normalized(pred, golds),
        "f1": token_f1(pred, golds),
    }


def summarize(records: Sequence[dict]) -> dict[str, float]:
    """Mean of each per-item score over ``records`` (dicts holding the `METRICS` keys), in percent."""
    n = len(records)
    return {m: 100.0 * sum(r[m] for r in records) / n if n else 0.0 for m in METRICS}


def bin_label(lo: float, hi: float) -> str:
    return f"{lo:g}+" if math.isinf(hi) else f"{lo:g}-{hi:g}"


def by_length(records: Sequence[dict], bins: Sequence[float] = DEFAULT_BINS, key: str = "context_tokens") -> list[dict]:
    """Records grouped by context length: bin i holds lengths in [bins[i], bins[i+1]).

    One row per non-empty bin, in order: {bin, lo, hi, n, contains, contains_normalized, f1} (scores in percent).
    A record shorter than the first edge or not below the last is an error: the bins must cover every record.
    """
    edges = list(bins)
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"bins {edges}: need at least two strictly increasing edges")
    groups: list[list[dict]] = [[] for _ in edges[:-1]]
    for r in records:
        length = r[key]
        if not edges[0] <= length < edges[-1]:
            raise ValueError(f"{key}={length} lies outside the bins [{edges[0]}, {edges[-1]})")
        i = max(j for j, lo in enumerate(edges[:-1]) if lo <= length)
        groups[i].append(r)
    return [
        {"bin": bin_label(lo, hi), "lo": lo, "hi": None if math.isinf(hi) else hi, "n": len(g), **summarize(g)}
        for lo, hi, g in zip(edges[:-1], edges[1:], groups, strict=True)
        if g
    ]
