"""The language models' tasks, each declared once in LM_TASKS: what it is, its default finetuning recipe, the
function that reads its prompt/response pairs for finetuning and the one that evaluates a run on it.

Plain data (no jax), so that the CLI and experiment files check a task name before any seconds-long import; the
functions are named "module:function" and imported on use. A new task is its functions plus one entry here:

    reader(recipe, tokenizer, seq_len, quiet) -> (training pairs, validation pairs)   dicts with prompt, response
    evaluation(run, generator, request) -> metrics and records      request: ssmlm.checkpoint_eval.lm.EvalRequest
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class LMTask:
    about: str  # one line: what the task is (`ssmlm finetune --help`, errors)
    recipe: str | None = None  # the default recipe of `ssmlm finetune --task NAME` (None: lm_finetune)
    reader: str | None = None  # "module:function" reading its prompt/response pairs; None: not a finetuning task
    evaluation: str | None = None  # "module:function" evaluating a run on it (`ssmlm evaluate --task NAME`)
    needs_train_file: bool = False  # its pairs come from task.train_file (refused without one)
    keeps_validation: bool = False  # a finetuned run keeps its validation pairs (NAME-validation.jsonl)
    encoder_hint: str = ""  # appended when an encoder run is asked for it: how to make a run that can do it
    # how a run finetuned on it describes its data (reports), from its task section; None: its files
    data_line: Callable[[Any], str] | None = None


def _phone_books(task) -> str:
    pb = task.phonebook
    return (
        f"generated phone books: {pb.train_books:,} for training, {pb.validation_books:,} for validation; "
        f"{pb.entries[0]}–{pb.entries[1]} entries, {pb.queries[0]}–{pb.queries[1]} numbers asked each"
    )


LM_TASKS: dict[str, LMTask] = {
    "phonebook": LMTask(
        "Birdie phone-book retrieval: generated books, the numbers of the queried names (finetune, evaluate)",
        recipe="phonebook_finetune",
        reader="ssmlm.train.parts.prompts:phonebook_pairs",
        evaluation="ssmlm.checkpoint_eval.lm:phonebook",
        keeps_validation=True,
        data_line=_phone_books,
        encoder_hint=", finetune it with `--task phonebook --recipe phonebook_tiny`",
    ),
    "instruct": LMTask(
        "instruction tuning on prompt/response pairs: --train-file JSONL, or flan / openhermes from the hub",
        recipe="instruct_finetune",
        reader="ssmlm.train.parts.prompts:instruct_pairs",
        needs_train_file=True,
    ),
    "squad_v2": LMTask(
        "answerable SQuAD v2 questions (Birdie §4.4): contains-label and F1 by context length (evaluate)",
        evaluation="ssmlm.checkpoint_eval.lm:squad_v2",
    ),
    "infilling": LMTask(
        "story infilling (Birdie §4.5): multiple choice by target-length-normalised loss, a local JSONL (evaluate)",
        evaluation="ssmlm.checkpoint_eval.lm:infilling",
    ),
}


def finetuning_tasks() -> list[str]:
    """The tasks a language model finetunes on (`ssmlm finetune --task`): those with a reader."""
    return [name for name, t in LM_TASKS.items() if t.reader]


def default_recipe(name: str) -> str:
    """The recipe `ssmlm finetune --task NAME` starts from for a language model (lm_finetune if none is declared)."""
    task = LM_TASKS.get(name)
    return (task.recipe if task else None) or "lm_finetune"


def evaluation_tasks() -> list[str]:
    """The tasks `ssmlm evaluate --task` decodes a language model on (besides lm-eval:TASKS)."""
    return [name for name, t in LM_TASKS.items() if t.evaluation]
