"""Objectives: how token rows become training examples, and the losses, evaluations and scores that go
with them. An objective is small and pure: its batches are a function of (seed, step, rows) and, for the
Birdie mixtures, of a controller's state — never of hidden generator state — so a resumed run sees exactly
the batches an uninterrupted one would.

    batch.py       the typed Batch every objective produces and every loss reads
    losses.py      cross-entropy and token-prediction loss / eval / score
    mlm.py         masked LM, static (offline-style copies) or dynamic masking
    next_token.py  next-token prediction (a plumbing check for non-MLM objectives)
    birdie/        Birdie's LM objectives, config grid and mixtures, START-layout packing, keyed rows
    lm.py          LMObjective: packed Birdie rows from a document split (``build_lm``: it takes
                   documents, not rows)
    tasks.py       finetuning heads: classification, regression, spans, multiple choice

May import: ssmlm.errors, ssmlm.models, ssmlm.data, ssmlm.evaluate.metrics (scorers). Never train/analyze/cli.
"""

from __future__ import annotations

from ssmlm.objectives.batch import Batch, make_batch
from ssmlm.objectives.mlm import MLM, max_predictions
from ssmlm.objectives.next_token import NextToken

# objective.kind -> class; mlm and next_token: class(cfg, special_ids, vocab_size, seq_len, seed) over token
# rows (``build``); lm: class(cfg, reserved_ids, train documents, validation documents, seq_len, seed, …)
# over documents (``build_lm``), imported on use (it brings the Birdie objectives with it)
OBJECTIVES = {"mlm": MLM, "next_token": NextToken, "lm": "ssmlm.objectives.lm:LMObjective"}


def objective_class(kind: str):
    cls = OBJECTIVES[kind]
    if isinstance(cls, str):
        import importlib

        module, name = cls.split(":")
        cls = getattr(importlib.import_module(module), name)
    return cls


def build(cfg, special_ids: dict[str, int], vocab_size: int, seq_len: int, default_seed: int):
    """The objective of a recipe's ``objective:`` section for data of ``seq_len``-token rows."""
    seed = cfg.seed if cfg.seed is not None else default_seed
    return objective_class(cfg.kind)(cfg, special_ids, vocab_size, seq_len, seed)


def build_lm(cfg, reserved: dict[str, int], docs_train, docs_val, seq_len: int, default_seed: int, *,
             batch_size: int, rows: tuple[int, int] | None = None):  # fmt: skip
    """The ``lm`` objective of a recipe's ``objective:`` section over document splits; a dynamic mixture also
    evaluates ``cfg.controller.validation_rows`` rows per configuration (what its controller learns from)."""
    from ssmlm.objectives.birdie.mixtures import DYNAMIC

    seed = cfg.seed if cfg.seed is not None else default_seed
    config_rows = cfg.controller.validation_rows if cfg.mixture in DYNAMIC else 0
    return objective_class("lm")(cfg, reserved, docs_train, docs_val, seq_len, seed, batch_size=batch_size,
                                 min_space=cfg.min_sample_space, rows=rows, config_rows=config_rows)  # fmt: skip


def predictions_per_row(cfg, seq_len: int) -> int:
    """Scored positions per row (for FLOPs estimates before any data exists)."""
    if cfg.kind == "mlm":
        return max_predictions(cfg.masked_lm_prob, cfg.max_predictions, seq_len)
    return seq_len - 1


__all__ = ["Batch", "OBJECTIVES", "build", "build_lm", "make_batch", "objective_class"]
