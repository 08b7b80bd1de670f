"""The one evaluation runner: a model's outputs on a set of host batches, and what they score.

Training (every evaluation of a run), `ssmlm evaluate` and the analyses all run their evaluations through
``run_eval``, so a checkpoint is scored the same way wherever it is scored; there is no training stage
involved. ``make_eval_step`` compiles an evaluation function once; callers that evaluate many times (the
training loop) build it once and pass it as ``eval_step``. ``predict`` is ``run_eval`` scored by
``predictions``: the class (or regression score) per real example.

May import: jax, flax, numpy, ssmlm.progress. Imported by the training loop (ssmlm.train.loop), `ssmlm evaluate`
(ssmlm.checkpoint_eval.run) and the analyses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from flax import nnx

from ssmlm.progress import progress_bar

Batches = Iterable | Callable[[], Iterable]  # host batches, or () -> host batches (a Stage's eval_data)


def make_eval_step(eval_fn: Callable, graphdef):
    """The jitted evaluation step (params, batch) -> outputs. Build it once per run: every evaluation reuses
    the compiled function (evaluation batches all have one shape; the last one is padded)."""
    return jax.jit(lambda p, batch: eval_fn(nnx.merge(graphdef, p), batch))


def run_eval(
    eval_fn: Callable,
    params_or_model,
    batches: Batches,
    score: Callable[[list[dict], list], Any] | None = None,
    *,
    graphdef=None,
    eval_step: Callable | None = None,
    progress: str | None = None,
):
    """Run ``eval_fn`` (model, batch) -> dict of arrays on every batch and return ``score(outputs, batches)``
    ({} when there were no batches), or ``(outputs, batches)`` when ``score`` is None.

    ``params_or_model`` is an nnx model, or its nnx.Param state together with ``graphdef``. ``eval_step`` is a
    step from ``make_eval_step`` compiled already (it then runs instead of ``eval_fn``). ``progress``: a label
    for a progress bar (count of batches done), None for none (e.g. inside the training loop's own bar).
    """
    if isinstance(params_or_model, nnx.Module):
        graphdef, params = nnx.split(params_or_model, nnx.Param)
    elif graphdef is None and eval_step is None:
        raise ValueError("run_eval: give graphdef with parameters (or a model, or a compiled eval_step)")
    else:
        params = params_or_model
    eval_step = eval_step or make_eval_step(eval_fn, graphdef)
    source = batches() if callable(batches) else batches
    total = len(source) if hasattr(source, "__len__") else None
    outputs, seen = [], []
    with progress_bar(progress is None) as bar:
        task = bar.add_task(progress or "evaluating", total=total)
        for batch in source:
            outputs.append(jax.device_get(eval_step(params, batch)))
            seen.append(batch)
            bar.advance(task)
    if score is None:
        return outputs, seen
    return score(outputs, seen) if outputs else {}


def predictions(outputs: list[dict], batches: list) -> np.ndarray:
    """Predicted class (or score, for a one-output regression head) per real example (weight > 0), in order,
    from a classifier's ``{"logits": ...}`` outputs; submission files and the analyses use these."""
    if not outputs:
        return np.zeros(0, np.int64)
    logits = np.concatenate([o["logits"] for o in outputs])
    keep = np.concatenate([b.loss_weights for b in batches]) > 0
    logits = logits[keep]
    return logits[:, 0] if logits.shape[1] == 1 else logits.argmax(-1)


def predict(
    eval_fn: Callable, params_or_model, batches: Batches, *, graphdef=None, eval_step=None, progress: str | None = None
) -> np.ndarray:
    """``predictions`` of a classifier on ``batches`` (see ``run_eval`` for the arguments)."""
    outputs, seen = run_eval(
        eval_fn, params_or_model, batches, graphdef=graphdef, eval_step=eval_step, progress=progress
    )
    return predictions(outputs, seen)
