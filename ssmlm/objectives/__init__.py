"""Objectives: how token rows become training examples, and the losses, evaluations and scores that go
with them. An objective is small and pure: its batches are a function of (seed, step, rows) and, for the
mixtures to come, of a controller's state — never of hidden generator state — so a resumed run sees exactly
the batches an uninterrupted one would.

    batch.py       the typed Batch every objective produces and every loss reads
    losses.py      cross-entropy and token-prediction loss / eval / score
    mlm.py         masked LM, static (offline-style copies) or dynamic masking
    next_token.py  next-token prediction (a plumbing check for non-MLM objectives)
    birdie/        Birdie's LM objectives, config grid and mixtures, START-layout packing, keyed rows
    lm.py          LMObjective: packed Birdie rows from a document split (not yet in OBJECTIVES: it
                   takes documents, not rows)
    tasks.py       finetuning heads: classification, regression, spans, multiple choice

May import: ssmlm.errors, ssmlm.models, ssmlm.data, ssmlm.evaluate.metrics (scorers). Never train/analyze/cli.
"""

from __future__ import annotations

from ssmlm.objectives.batch import Batch, make_batch
from ssmlm.objectives.mlm import MLM, max_predictions
from ssmlm.objectives.next_token import NextToken

# objective.kind -> class(cfg, special_ids, vocab_size, seq_len, seed)
OBJECTIVES = {"mlm": MLM, "next_token": NextToken}


def build(cfg, special_ids: dict[str, int], vocab_size: int, seq_len: int, default_seed: int):
    """The objective of a recipe's ``objective:`` section for data of ``seq_len``-token rows."""
    seed = cfg.seed if cfg.seed is not None else default_seed
    return OBJECTIVES[cfg.kind](cfg, special_ids, vocab_size, seq_len, seed)


def predictions_per_row(cfg, seq_len: int) -> int:
    """Scored positions per row (for FLOPs estimates before any data exists)."""
    if cfg.kind == "mlm":
        return max_predictions(cfg.masked_lm_prob, cfg.max_predictions, seq_len)
    return seq_len - 1


__all__ = ["Batch", "OBJECTIVES", "build", "make_batch"]
