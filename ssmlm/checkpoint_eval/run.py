"""`ssmlm evaluate`: metrics of a run's newest checkpoint on its own objective's held-out data or its
finetuning task, through the one evaluation runner (``ssmlm.evaluate.runner``) the training loop uses."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ssmlm import objectives, staging
from ssmlm.data.preprocess import FORMAT_VERSION, preprocess, read_metadata
from ssmlm.errors import UserError
from ssmlm.evaluate.runner import predictions, run_eval
from ssmlm.objectives.tasks import HEADS, prepare
from ssmlm.progress import activity
from ssmlm.runs import Run
from ssmlm.train.parts.lm import lm_eval_data, lm_objective
from ssmlm.train.parts.mlm import token_eval_data
from ssmlm.train.parts.task import task_eval_data


def check_task(run: Run, task) -> None:
    """An encoder run asked for a task it cannot do refuses at once, before its model is loaded, with advice that
    works: a language-model task names the recipes that make a language model; a task it has not been
    finetuned on, the command that finetunes it."""
    from ssmlm.data.lm_tasks import LM_TASKS, evaluation_tasks
    from ssmlm.data.tasks import TASKS
    from ssmlm.models import is_lm

    name = task.name if task is not None else None
    if not name or is_lm(run.recipe.model.arch):
        return
    if name.startswith("lm-eval:") or (name in evaluation_tasks() and name not in TASKS):
        then = LM_TASKS[name].encoder_hint if name in LM_TASKS else ""
        raise UserError(
            f"--task {name!r} is for language models, and {run.dir} is an encoder ({run.recipe.model.arch}): "
            "pretrain a language model (e.g. `ssmlm pretrain birdie_gated_ssm` or clm_gated_ssm; `ssmlm recipes` "
            f"lists them){then}, then evaluate that run"
        )
    if run.kind == "finetune":
        return
    if name not in TASKS and not (task.validation_file or task.data_dir):
        raise UserError(f"--task {name!r}: unknown task (known: {', '.join(TASKS)})")
    raise UserError(
        f"{run.dir} is a pretraining run; finetune it on '{name}' first (`ssmlm finetune --ckpt {run.dir} "
        f"--task {name}`), then evaluate the finetuned run"
    )


def evaluate_run(
    run: Run,
    task: str | None = None,
    *,
    split: str = "validation",
    batch_size: int = 32,
    data_dir: str | None = None,
    validation_file: str | None = None,
    limit: int | None = None,
    submission: Path | None = None,
    predictions_file: Path | None = None,
    entries: tuple[int, int] | None = None,
    trust_task_code: bool = False,
) -> dict[str, Any]:
    """What `ssmlm evaluate` (and an experiment's evaluate stage) runs: a language model asked for a task decodes
    it (phone books, SQuAD, infilling, lm-eval:TASKS); anything else is scored on its own objective or task.
    ``entries`` (lo, hi): task phonebook's books of that many entries instead of the finetuning books';
    ``trust_task_code``: run the Python an lm-eval task folder (``data_dir``) names (ssmlm.data.task_code)."""
    if entries is not None and task != "phonebook":
        asked = f"task {task}" if task else "the run's own task"
        raise UserError(f"entries {entries[0]}-{entries[1]}: phone books are task phonebook's, not {asked}")
    if run.recipe.objective.kind == "lm" and task:
        from ssmlm.checkpoint_eval.lm import evaluate_lm_task

        return evaluate_lm_task(
            run, task, data_dir, validation_file, limit, min(batch_size, 8), split, entries, trust_task_code
        )
    task_cfg = None
    if task or validation_file or data_dir:
        from ssmlm.data.config import TaskConfig

        base = run.recipe.task if run.kind == "finetune" else TaskConfig()
        task_cfg = dataclasses.replace(
            base,
            name=task or base.name,
            validation_file=validation_file or base.validation_file,
            data_dir=data_dir or base.data_dir,
        )
    return evaluate(
        run, task_cfg, split=split, batch_size=batch_size, submission=submission, predictions_file=predictions_file
    )


def evaluate(
    run: Run,
    recipe_task=None,
    split: str = "validation",
    batch_size: int = 32,
    submission: Path | None = None,
    predictions_file: Path | None = None,
) -> dict[str, Any]:
    """Metrics of a run's newest checkpoint: MLM on its held-out data, or its finetuning task.

    With ``submission``, the split's predictions are also written in the GLUE leaderboard format; with
    ``predictions_file``, one per example in the task's own label values (see `write_predictions`).
    """
    check_task(run, recipe_task)
    if predictions_file is not None and (run.kind != "finetune" or run.info.get("head", "classify") == "span"):
        what = f"a {run.kind} run" if run.kind != "finetune" else f"finetuned on {run.info.get('task')} (spans)"
        raise UserError(
            f"--predictions: {run.dir} is {what}; predictions are written for a classification or "
            "regression task's finetuned run"
        )
    with activity(f"loading {run.dir}"):
        model, meta = run.load_model()
    result = {"run": staging.location(run.dir), "arch": run.recipe.model.arch, "split": split, "step": meta["step"]}
    if run.kind == "finetune":
        base = run.recipe.task
        task = recipe_task or base
        if task.name and task.name not in (base.name, run.info.get("task")):
            raise UserError(f"{run.dir} was finetuned on '{run.info['task']}', not '{task.name}'")
        task = dataclasses.replace(task, name=base.name, max_seq_length=base.max_seq_length)
        # a local task's labels are mapped by the run's own map (its training file's when it was finetuned)
        names = run.info.get("label_names") if base.train_file else None
        with activity(f"reading and tokenizing {run.info.get('task') or 'the task'}"):
            prep = prepare(task, run.tokenizer(), task.max_seq_length, seed=run.recipe.train.seed, label_names=names)
        if split not in prep.arrays:
            raise UserError(f"task {prep.definition.name} has no '{split}' split (has {list(prep.arrays)})")
        head = HEADS[run.info.get("head", "classify")]
        result["task"] = prep.definition.name
        # one pass: the same outputs give the metrics and (with a submission) the predictions
        outputs, batches = run_eval(
            head.eval, model, task_eval_data(prep.arrays[split], batch_size), progress=f"evaluating {result['task']}"
        )
        result["metrics"] = prep.scorers[split](outputs, batches) if outputs else {}
        preds = predictions(outputs, batches) if submission or predictions_file else None
        if predictions_file is not None:
            names = run.info.get("label_names") if run.info.get("num_labels") != 1 else None
            result["predictions"] = str(write_predictions(predictions_file, preds, names))
        if submission is not None:
            from ssmlm.data.glue import write_glue_submission

            name = prep.definition.name
            name = "mnli-mm" if name == "mnli" and split.endswith("mismatched") else name
            path = write_glue_submission(name, preds.tolist(), submission, label_names=run.info.get("label_names"))
            result["submission"] = str(path)
    else:
        if not run.info.get("data_dir"):
            raise UserError(
                f"{run.dir}: has no MLM data of its own (imported from {run.info.get('source')}); "
                "finetune it or evaluate a task"
            )
        data_dir = Path(run.info["data_dir"])
        meta = read_metadata(data_dir)
        if run.recipe.objective.kind == "lm":  # the fixed validation rows the training evaluations used
            objective = lm_objective(run.recipe, data_dir)
            ev = lm_eval_data(run.recipe, objective)
            if ev is None:
                raise UserError(f"{data_dir}: has no validation documents to evaluate on")
            result["task"] = f"lm-{objective.mixture}"
        elif meta.get("format_version", 0) < FORMAT_VERSION:
            # written by an older ssmlm (masked copies, no token shards): tokenise the run's corpus again with
            # the run's own tokenizer, so the ids mean what they meant (cached like any preprocessing)
            data = dataclasses.replace(run.recipe.data, tokenizer=str(run.dir / "tokenizer.json"))
            data_dir = preprocess(data, meta["max_seq_length"])
            meta = read_metadata(data_dir)
        if run.recipe.objective.kind != "lm":
            objective = objectives.build(
                run.recipe.objective,
                meta["special_ids"],
                meta["vocab_size"],
                meta["max_seq_length"],
                run.recipe.data.seed,
            )
            ev = token_eval_data(data_dir, objective, batch_size, None)
            if ev is None:
                raise UserError(f"{data_dir}: has no validation sequences to evaluate on")
            result["task"] = objective.name
        result["metrics"] = run_eval(
            objective.eval, model, ev, objective.score, progress=f"evaluating {result['task']}"
        )
    return result


def write_predictions(path: Path, preds, label_names: list | None) -> Path:
    """One prediction per example of the split, in file order: ``index`` and ``prediction``, the predicted label
    as the task's files spell it (its label map, e.g. -1 / 1 or 'pos' / 'neg'), a class id where the task has
    none (GLUE), a number for regression. .jsonl: JSON lines; .tsv: tab-separated; otherwise csv."""
    import csv
    import json

    values = [label_names[int(p)] if label_names else p.item() for p in preds]
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        if path.suffix == ".jsonl":
            f.writelines(json.dumps({"index": i, "prediction": v}) + "\n" for i, v in enumerate(values))
        else:
            w = csv.writer(f, delimiter="\t" if path.suffix == ".tsv" else ",", lineterminator="\n")
            w.writerow(["index", "prediction"])
            w.writerows(enumerate(values))
    return path
