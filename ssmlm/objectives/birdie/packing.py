"""Pack samples into one row in the paper's START layout (paper A.4; docs/faithfulness.md#birdie-layout).

A sample with prefix x_1..x_N and target y_1..y_M occupies N + M slots:

    tokens       x_1 … x_N   START  y_1 … y_{M−1}
    targets      –  …  –     y_1    y_2 … y_M        (loss_weights 1 only here)
    token_types  1  …  1     3      3  …  3          (1 bidirectional prefix, 3 causal, 0 padding)
    segment_ids  k  …  k     k      k  …  k          (k = 1, 2, … per sample; 0 padding)
    positions    0, 1, …, N+M−1 within the sample

Padding: token 0, target 0 with weight 0, segment 0, type 0, position 0. ``spacing`` pad slots go between
consecutive samples (paper A.11: kernel − 1 slots so a causal conv never sees the previous sample).
"""

from __future__ import annotations

import numpy as np

FIELDS = ("tokens", "targets", "loss_weights", "segment_ids", "token_types", "positions")


def empty_row(length: int) -> dict[str, np.ndarray]:
    row = {k: np.zeros(length, np.int32) for k in FIELDS}
    row["loss_weights"] = np.zeros(length, np.float32)
    return row


def packed_size(samples, spacing: int = 0) -> int:
    return sum(len(p) + len(t) for p, t in samples) + spacing * max(0, len(samples) - 1)


def pack(samples, length: int, start: int, spacing: int = 0) -> dict[str, np.ndarray]:
    """``samples``: [(prefix, target)] (or objects with .prefix/.target). Raises ValueError if they do not fit
    or a target is empty."""
    samples = [(s.prefix, s.target) if hasattr(s, "prefix") else s for s in samples]
    need = packed_size(samples, spacing)
    if need > length:
        raise ValueError(f"samples need {need} slots, the row has {length}")
    row = empty_row(length)
    at = 0
    for k, (prefix, target) in enumerate(samples, start=1):
        n, m = len(prefix), len(target)
        if m == 0:
            raise ValueError(f"sample {k} has an empty target")
        end = at + n + m
        row["tokens"][at:end] = np.concatenate([prefix, [start], target[:-1]])
        row["targets"][at + n : end] = target
        row["loss_weights"][at + n : end] = 1.0
        row["segment_ids"][at:end] = k
        row["token_types"][at : at + n] = 1
        row["token_types"][at + n : end] = 3
        row["positions"][at:end] = np.arange(n + m)
        at = end + spacing
    return row


def ready(remaining: int, min_space: int) -> bool:
    """A row is emitted once its remaining space falls below ``min_space``."""
    return remaining < min_space
