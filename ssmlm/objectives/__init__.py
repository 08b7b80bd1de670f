"""Objectives: how token rows become training examples, and the losses, evaluations and scores that go
with them. An objective is small and pure: its batches are a function of (seed, step, rows) and, for the
Birdie mixtures, of a controller's state — never of hidden generator state — so a resumed run sees exactly
the batches an uninterrupted one would.

    config.py      the recipe's objective: section (Birdie's controller settings included) and its ranges
    batch.py       the typed Batch every objective produces and every loss reads
    losses.py      cross-entropy and token-prediction loss / eval / score
    mlm.py         masked LM, static (offline-style copies) or dynamic masking
    next_token.py  next-token prediction (a plumbing check for non-MLM objectives)
    birdie/        Birdie's LM objectives, config grid and mixtures, START-layout packing, keyed rows
    lm.py          LMObjective: packed Birdie rows from a document split (``build_lm``: it takes
                   documents, not rows)
    tasks.py       finetuning heads: classification, regression, spans, multiple choice

May import: ssmlm.errors, ssmlm.schema, ssmlm.models, ssmlm.data, ssmlm.evaluate.metrics (scorers). Never
train/analyze/cli.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ssmlm.objectives.batch import Batch, make_batch
    from ssmlm.objectives.mlm import MLM, max_predictions
    from ssmlm.objectives.next_token import NextToken

from ssmlm.objectives.config import OBJECTIVES  # objective.kind -> "module:class", imported on use (jax)
from ssmlm.schema import named

# names this package offers, from the module that defines them (imported when first used)
_LAZY = {
    "Batch": "ssmlm.objectives.batch",
    "make_batch": "ssmlm.objectives.batch",
    "MLM": "ssmlm.objectives.mlm",
    "max_predictions": "ssmlm.objectives.mlm",
    "NextToken": "ssmlm.objectives.next_token",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def objective_class(kind: str):
    cls = OBJECTIVES[kind]
    return named(cls) if isinstance(cls, str) else cls


def build(cfg, special_ids: dict[str, int], vocab_size: int, seq_len: int, default_seed: int):
    """The objective of a recipe's ``objective:`` section for data of ``seq_len``-token rows."""
    seed = cfg.seed if cfg.seed is not None else default_seed
    return objective_class(cfg.kind)(cfg, special_ids, vocab_size, seq_len, seed)


def build_lm(
    cfg,
    reserved: dict[str, int],
    docs_train,
    docs_val,
    seq_len: int,
    default_seed: int,
    *,
    batch_size: int,
    rows: tuple[int, int] | None = None,
):
    """The ``lm`` objective of a recipe's ``objective:`` section over document splits; a dynamic mixture also
    evaluates ``cfg.controller.validation_rows`` rows per configuration (what its controller learns from)."""
    from ssmlm.objectives.birdie.mixtures import DYNAMIC

    seed = cfg.seed if cfg.seed is not None else default_seed
    config_rows = cfg.controller.validation_rows if cfg.mixture in DYNAMIC else 0
    return objective_class("lm")(
        cfg,
        reserved,
        docs_train,
        docs_val,
        seq_len,
        seed,
        batch_size=batch_size,
        min_space=cfg.min_sample_space,
        rows=rows,
        config_rows=config_rows,
    )


def predictions_per_row(cfg, seq_len: int) -> int:
    """Scored positions per row (for FLOPs estimates before any data exists)."""
    if cfg.kind == "mlm":
        from ssmlm.objectives.mlm import max_predictions

        return max_predictions(cfg.masked_lm_prob, cfg.max_predictions, seq_len)
    return seq_len - 1


__all__ = [
    "MLM",
    "OBJECTIVES",
    "Batch",
    "NextToken",
    "build",
    "build_lm",
    "make_batch",
    "max_predictions",
    "objective_class",
    "predictions_per_row",
]
