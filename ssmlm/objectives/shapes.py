"""The shapes and device dtypes of a training batch, known before any data exists: what the step is compiled for
(`--dry-run --target`, ssmlm.train.aot). tests/test_aot.py holds each against a batch the objective really makes."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ssmlm.objectives.batch import Batch

# the batch layout of each kind of work: which fields a loss reads, and the targets' shape after the batch axis
LAYOUTS = ("mlm", "lm", "classification", "regression", "span")


def batch_shapes(layout: str, batch_size: int, seq_len: int, predictions: int | None = None) -> Batch:
    """A Batch of ShapeDtypeStructs (device dtypes: int32 ids, float32 weights) for ``batch_size`` rows of
    ``seq_len`` tokens. ``layout``: mlm (``predictions`` masked slots per row), lm (a target at every position,
    prompt/response finetuning too), classification, regression (one label per row) or span (start and end)."""
    if layout not in LAYOUTS:
        raise ValueError(f"batch layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    rows = (batch_size, seq_len)
    ids = lambda shape: jax.ShapeDtypeStruct(shape, jnp.int32)  # noqa: E731
    weights = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    common = {"tokens": ids(rows), "segment_ids": ids(rows), "positions": ids(rows)}
    if layout == "mlm":
        if not predictions:
            raise ValueError("an mlm batch needs its predictions per row")
        slots = (batch_size, predictions)
        return Batch(**common, targets=ids(slots), loss_weights=weights(slots), target_positions=ids(slots))
    if layout == "lm":
        return Batch(**common, targets=ids(rows), loss_weights=weights(rows), token_types=ids(rows))
    targets = {
        "classification": ids((batch_size,)),
        "regression": weights((batch_size,)),
        "span": ids((batch_size, 2)),
    }[layout]
    return Batch(**common, targets=targets, loss_weights=weights((batch_size,)), token_types=ids(rows))
