"""The typed batch: what every objective produces and every loss reads.

One row of ``tokens`` may hold several packed samples: ``segment_ids`` numbers them (1, 2, …; 0 is
padding) and ``positions`` counts from 0 within each. ``targets``/``loss_weights`` are what the loss
predicts and how much each counts (0: no loss): token ids at ``target_positions`` (MLM's masked slots, a
language model's next tokens), or one label per example (classification: (B,); span extraction: (B, 2)
start/end). Arrays are numpy on the host and jax on the device; the dataclass is a pytree, so it passes
through ``jax.jit``, ``device_put`` and ``tree.map`` whole.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    tokens: Any  # (B, L) int32 ids, 0 = padding ((B, C, L) for multiple choice)
    segment_ids: Any  # like tokens: 0 = padding, k = the row's k-th packed sample
    positions: Any  # like tokens: position within the token's own sample
    targets: Any  # (B, T) token ids, or per-example labels (B,) / spans (B, 2)
    loss_weights: Any  # targets' leading shape: (B, T) or (B,); 0 = no loss
    token_types: Any = None  # like tokens: BERT's segment A/B ids (sentence-pair tasks)
    target_positions: Any = None  # (B, T): where in the row each target is predicted

    @property
    def attention_mask(self):
        """1 on real tokens, 0 on padding (what the encoders take)."""
        return (self.segment_ids > 0).astype(np.int32)

    def __len__(self) -> int:
        return len(self.tokens)


def make_batch(
    tokens, targets, loss_weights, *, segment_ids=None, positions=None, token_types=None, target_positions=None
) -> Batch:
    """Build a host batch and check that its arrays agree (one place, so a wrong shape fails here and not
    inside a compiled step). Missing ``segment_ids``: one sample per row (every non-pad token is segment
    1); missing ``positions``: 0, 1, 2, … along each row."""
    tokens = np.asarray(tokens, np.int32)
    if segment_ids is None:
        segment_ids = (tokens != 0).astype(np.int32)
    if positions is None:
        positions = np.broadcast_to(np.arange(tokens.shape[-1], dtype=np.int32), tokens.shape)
    batch = Batch(
        tokens=tokens,
        segment_ids=np.asarray(segment_ids, np.int32),
        positions=np.asarray(positions, np.int32),
        targets=np.asarray(targets),
        loss_weights=np.asarray(loss_weights, np.float32),
        token_types=None if token_types is None else np.asarray(token_types, np.int32),
        target_positions=None if target_positions is None else np.asarray(target_positions, np.int32),
    )
    check(batch)
    return batch


def check(batch: Batch) -> None:
    t = batch.tokens.shape
    if len(t) not in (2, 3):
        raise ValueError(f"batch.tokens: expected (batch, length) or (batch, choices, length), got {t}")
    for name in ("segment_ids", "positions", "token_types"):
        a = getattr(batch, name)
        if a is not None and a.shape != t:
            raise ValueError(f"batch.{name}: shape {a.shape}, expected the tokens' {t}")
    if batch.targets.shape[:1] != t[:1] or batch.loss_weights.shape != batch.targets.shape[: batch.loss_weights.ndim]:
        raise ValueError(
            f"batch.targets {batch.targets.shape} / loss_weights {batch.loss_weights.shape} do not match "
            f"the tokens' batch of {t[0]}"
        )
    if batch.target_positions is not None and batch.target_positions.shape != batch.targets.shape:
        raise ValueError(
            f"batch.target_positions {batch.target_positions.shape}: expected the targets' {batch.targets.shape}"
        )
