"""The finetuning task as `ssmlm finetune` is given it: the recipe's task section with the command line's
options, the checks made of it before the slow imports (jax), and its name in the run's name."""

from __future__ import annotations

import dataclasses

from ssmlm.data.lm_tasks import LM_TASKS, finetuning_tasks
from ssmlm.data.sources import check_inputs
from ssmlm.errors import UserError


def with_task_options(
    r, task, train_file, validation_file, text_fields, label_field, num_labels, data_dir=None, no_header=False
):
    """The recipe ``r`` with the task options given on the command line (those not given keep the recipe's)."""
    changes = {
        "header": False if no_header else None,
        "name": task,
        "data_dir": data_dir,
        "train_file": train_file,
        "validation_file": validation_file,
        "text_fields": text_fields.split(",") if text_fields else None,
        "label_field": label_field,
        "num_labels": num_labels,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    return dataclasses.replace(r, task=dataclasses.replace(r.task, **changes))


def task_name(task) -> str:
    """The task's name in its run's name: --task, else the training file's (polarity-train.csv: polarity)."""
    if task.name or not task.train_file:
        return task.name or "task"
    from ssmlm.data.tasks import local_task_name

    return local_task_name(task.train_file)


def check_encoder_task(r) -> int:
    """An encoder's task: its files exist and its name is known, a local task's files and labels are read and checked
    (before the slow imports); its label count."""
    check_inputs(r, data=False)  # the corpus and tokenizer are the source run's
    from ssmlm.data.tasks import TASKS, get_task

    if r.task.name in finetuning_tasks():  # a language model's task asked of an encoder: say what would work
        raise UserError(
            f"--task {r.task.name!r} is for language models, and the --ckpt run is an encoder: pretrain "
            "a language model (e.g. `ssmlm pretrain birdie_gated_ssm`; `ssmlm recipes` lists them) and "
            "finetune that"
        )
    if r.task.train_file and r.task.name not in TASKS:  # a local task: its files, columns and labels, before jax
        from ssmlm.data.tasks import load_task

        return load_task(r.task, r.train.seed).definition.num_labels
    if r.task.name:
        get_task(r.task.name)
    return r.task.num_labels or (get_task(r.task.name).num_labels if r.task.name else 2)


def check_lm_task(r, ckpt: str) -> int:
    """A language model's task: one it finetunes on, with its files (0: no label count)."""
    # the language models' tasks, by their declarations (ssmlm.data.lm_tasks: no import of the training code)
    if r.task.name not in finetuning_tasks():
        raise UserError(
            f"--task {r.task.name!r}: {ckpt} is a language model; it finetunes on {', '.join(finetuning_tasks())}"
        )
    check_train_file(r.task)
    return 0


def check_train_file(task) -> None:
    """A language model's task whose pairs come from task.train_file (instruct) is given one: checked by the CLI
    before the slow imports, and by the reader itself for a recipe that reaches it another way (an experiment)."""
    if LM_TASKS[task.name].needs_train_file and not task.train_file:
        raise UserError(f"--task {task.name} needs --train-file: a prompt/response JSONL, or flan / openhermes (hub)")
