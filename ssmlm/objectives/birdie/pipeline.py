"""Rows of packed objective samples, each a pure function of an integer key (docs/faithfulness.md#birdie-layout).

Per row: repeatedly draw a config ~ Categorical(probs); take the previous sample's leftover of the same
document if there is one (v2 semantics: a long document is sliced across consecutive samples, possibly
under different objectives), else a new start token chosen uniformly over the whole corpus (so a document
is picked in proportion to its length, and the sample starts at that token); give the objective the row's
remaining space. A None (nothing fits) drops any leftover and counts as a failure; after ``max_failures``
consecutive failures, or once fewer than ``min_space`` slots remain, the row is packed and returned (every
sample takes >= 1 slot, so a row always ends).

``docs``: anything with ``len(docs)`` and ``docs[i] -> int array`` (``ssmlm.data.shards.TokenDocuments``).
Its cumulative lengths are computed once and cached (an object's ``lengths`` attribute, if present, is used).
"""

from __future__ import annotations

import numpy as np

import ssmlm.objectives.birdie.functions as F
from ssmlm.objectives.birdie.packing import pack

_CUMULATIVE: dict[int, tuple[object, np.ndarray]] = {}


def cumulative_lengths(docs) -> np.ndarray:
    """(len(docs)+1,) int64 token offsets of the documents as if concatenated (cached per object)."""
    hit = _CUMULATIVE.get(id(docs))
    if hit is not None and hit[0] is docs:
        return hit[1]
    lengths = getattr(docs, "lengths", None)
    if lengths is None:
        lengths = [len(docs[i]) for i in range(len(docs))]
    cum = np.concatenate([[0], np.cumsum(np.asarray(lengths, np.int64))])
    if cum[-1] == 0:
        raise ValueError("the documents hold no tokens")
    _CUMULATIVE[id(docs)] = (docs, cum)  # keeps docs alive so its id is never reused
    return cum


def _pick(docs, cum, rng) -> np.ndarray:
    token = int(rng.integers(0, cum[-1]))
    d = int(np.searchsorted(cum, token, side="right") - 1)
    return np.asarray(docs[d][token - cum[d] :], np.int32)


def make_row(
    docs,
    configs,
    probs,
    length: int,
    key: int,
    ids: F.Ids,
    paradigm: str = "start",
    spacing: int = 0,
    min_space: int = 32,
    max_failures: int = 4,
) -> dict[str, np.ndarray]:
    """One packed row (the ``packing.pack`` arrays) plus ``config``: (length,) int32 index into ``configs`` of
    each slot's sample (−1 on padding/spacing), and ``sample_configs``: the samples' config indices in order.
    Deterministic from ``key`` (``np.random.default_rng(key)``)."""
    rng = np.random.default_rng(key)
    cum = cumulative_lengths(docs)
    probs = np.asarray(probs, float)
    cdf = np.cumsum(probs / probs.sum())
    samples, chosen = [], []
    remaining, failures, leftover = length, 0, None
    while remaining >= min_space and failures < max_failures:
        c = min(int(np.searchsorted(cdf, rng.random(), side="right")), len(configs) - 1)
        cfg = configs[c]
        src = leftover if leftover is not None and len(leftover) else _pick(docs, cum, rng)
        space = remaining - (spacing if samples else 0)
        s = F.sample(cfg.kind, cfg.cls, src, space, rng, ids, paradigm, **cfg.params) if space > 0 else None
        if s is None:
            failures += 1
            leftover = None
            continue
        failures = 0
        samples.append(s)
        chosen.append(c)
        leftover = src[s.used :]
        remaining = space - s.size
    row = pack(samples, length, ids.start, spacing)
    config = np.full(length, -1, np.int32)
    seg = row["segment_ids"]
    config[seg > 0] = np.asarray(chosen, np.int32)[seg[seg > 0] - 1]
    row["config"] = config
    row["sample_configs"] = np.asarray(chosen, np.int32)
    return row


def make_batch_rows(
    docs,
    configs,
    probs,
    length: int,
    keys,
    ids: F.Ids,
    paradigm: str = "start",
    spacing: int = 0,
    min_space: int = 32,
    max_failures: int = 4,
) -> dict:
    """Rows for ``keys`` stacked to (B, length) arrays; ``sample_configs`` stays a list of per-row arrays."""
    rows = [
        make_row(docs, configs, probs, length, int(k), ids, paradigm, spacing, min_space, max_failures)
        for k in np.asarray(keys).ravel()
    ]
    out = {k: np.stack([r[k] for r in rows]) for k in rows[0] if k != "sample_configs"}
    out["sample_configs"] = [r["sample_configs"] for r in rows]
    return out
