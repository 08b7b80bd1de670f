"""`ssmlm evaluate --ckpt LM_RUN --task …`: the Birdie paper's evaluations of a language model.

    phonebook      generated phone books (§4.3, A.9): exact retrieval per queried number, greedy decoding
    squad_v2       answerable SQuAD v2 questions (§4.4): contains-label and F1 by context length
    infilling      story infilling (§4.5): multiple choice by target-length-normalised loss (a local JSONL)
    lm-eval:T1,T2  EleutherAI lm-evaluation-harness tasks through ssmlm's adapter (optional extra)

Each returns the result dict `ssmlm evaluate` writes to RUN/eval/TASK-SPLIT.json: run, task, split, step,
metrics (numbers only, printed as the table), and the per-item records / bins the analyses plot.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ssmlm import staging
from ssmlm.data.lm_tasks import LM_TASKS, evaluation_tasks
from ssmlm.errors import UserError
from ssmlm.runs import Run
from ssmlm.schema import named

EVAL_SEED = 2_000_003  # evaluation books/items come from their own seed stream (never a training one)


@dataclasses.dataclass(frozen=True)
class EvalRequest:
    """What `ssmlm evaluate` passes a task's evaluation (ssmlm.data.lm_tasks) besides the run and its generator."""

    data_dir: str | None = None
    validation_file: str | None = None
    limit: int | None = None
    batch_size: int = 8
    split: str = "validation"
    entries: tuple[int, int] | None = None  # phone books of this many entries (None: the finetuning books')


def evaluate_lm_task(
    run: Run,
    task: str,
    data_dir: str | None = None,
    validation_file: str | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    split: str = "validation",
    entries: tuple[int, int] | None = None,
    trust_task_code: bool = False,
) -> dict[str, Any]:
    if task.startswith("lm-eval:"):
        return _harness(run, task, data_dir, limit, batch_size, trust_task_code)
    if task not in evaluation_tasks():
        known = ", ".join(evaluation_tasks())
        raise UserError(f"--task {task!r}: a language model is evaluated on {known} or lm-eval:TASKS")
    if task == "phonebook":
        from ssmlm.data.phonebook import split_seed

        split_seed(split)  # a split without books fails before the model is loaded
    from ssmlm.progress import activity
    from ssmlm.runs.generate import load_generator

    with activity(f"loading {run.dir}"):
        gen = load_generator(run.dir)
    request = EvalRequest(data_dir, validation_file, limit, batch_size, split, entries)
    out = named(LM_TASKS[task].evaluation)(run, gen, request)
    return {"run": staging.location(run.dir), "task": task, "split": split, "step": gen.step, "limit": limit, **out}


def phonebook(run: Run, gen, request: EvalRequest) -> dict:
    """Books like the run's finetuning validation books (its task.phonebook and length), from the split's own
    seed (ssmlm.data.phonebook.SPLIT_SEEDS); ``request.entries``: of that many entries instead (e.g. larger books
    than it was finetuned on)."""
    from ssmlm.checkpoint_eval.phonebook import evaluate_phonebook
    from ssmlm.data.phonebook import phonebook_books, split_seed

    offset = split_seed(request.split)
    task = run.recipe.task
    settings = task.phonebook
    if request.entries is not None:
        settings = dataclasses.replace(settings, entries=list(request.entries))
    seq_len = task.max_seq_length or run.recipe.model.max_seq_length
    n = request.limit or settings.validation_books

    items = phonebook_books(settings, gen.tokenizer, seq_len, n, run.recipe.train.seed + offset, "drawing books")
    return {**evaluate_phonebook(gen, items), "entries": list(settings.entries)}


def squad_v2(run: Run, gen, request: EvalRequest) -> dict:
    from ssmlm.checkpoint_eval.squad_gen import evaluate_squad
    from ssmlm.data.qa import load_answerable
    from ssmlm.progress import activity

    with activity(f"reading SQuAD v2 ({request.split})"):
        items = load_answerable(request.data_dir, split=request.split, limit=request.limit, seed=EVAL_SEED)
    return evaluate_squad(gen, items)


def infilling(run: Run, gen, request: EvalRequest) -> dict:
    from ssmlm.checkpoint_eval.infilling import evaluate_infilling
    from ssmlm.data.infilling import read_jsonl

    data_dir, validation_file, limit = request.data_dir, request.validation_file, request.limit
    path = Path(validation_file) if validation_file else (Path(data_dir) / "infilling.jsonl" if data_dir else None)
    if path is None:
        raise UserError(
            "--task infilling reads a local JSONL of stories (the paper's set is not public): pass "
            "--validation-file FILE or --data-dir DIR with infilling.jsonl (format: ssmlm.data.infilling)"
        )
    items = read_jsonl(path)
    return evaluate_infilling(gen, items[:limit] if limit else items, batch_size=request.batch_size)


def _harness(run: Run, task: str, include_path: str | None, limit: int | None, batch_size: int, trusted: bool) -> dict:
    from ssmlm.checkpoint_eval.harness import run_harness

    names = [t for t in task.removeprefix("lm-eval:").split(",") if t]
    if not names:
        raise UserError("--task lm-eval:TASKS: name at least one harness task, e.g. lm-eval:hellaswag,arc_easy")
    results = run_harness(
        str(run.dir), names, limit=limit, include_path=include_path, batch_size=batch_size, trust_task_code=trusted
    )
    metrics = {}
    for name, values in results.get("results", {}).items():
        for k, v in values.items():  # metrics are "name,filter" keys (e.g. "acc,none"); skip stderr and counts
            if "," in k and "stderr" not in k and isinstance(v, int | float) and not isinstance(v, bool):
                metrics[f"{name}/{k.split(',')[0]}"] = float(v)
    step = int(run.load_model()[1]["step"])
    return {
        "run": staging.location(run.dir),
        "task": "lm-eval",
        "split": "harness",
        "step": step,
        "limit": limit,
        "metrics": metrics,
        "harness": results.get("results", {}),
    }
