"""Finetuning a language model on prompt/response pairs: `ssmlm finetune --ckpt LM_RUN --task phonebook|instruct`.

The prompt is the bidirectional prefix and the response the causal target (closed by END), several pairs
packed per row in the START layout the model was pretrained on (``ssmlm.objectives.prompts``); the whole
model is copied from the source run and trained through the one loop. Validation reports the target-token
loss and the share of responses the model reproduces exactly under teacher forcing (which is what greedy
decoding would generate); `ssmlm evaluate --task phonebook` then decodes for real.

Tasks: ``phonebook`` (Birdie §4.3, A.9: generated books, ``task.phonebook``) and ``instruct`` (App. A.12:
``task.train_file`` = a local JSONL of prompt/response pairs or a hub alias, ``ssmlm.data.instruct``).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import jax

from ssmlm.data.phonebook import phonebook_books
from ssmlm.errors import UserError
from ssmlm.progress import console
from ssmlm.recipe import Recipe
from ssmlm.runs import Run, atomic_write, open_run, prepare_run_dir, removed_on_failure, sha256
from ssmlm.train import loop
from ssmlm.train.mesh import barrier, maybe_initialize_distributed

LM_TASKS = {
    "phonebook": "Birdie phone-book retrieval: generated books, the numbers of the queried names (finetune, evaluate)",
    "instruct": "instruction tuning on prompt/response pairs: --train-file JSONL, or flan / openhermes from the hub",
}
EVAL_ONLY = {
    "squad_v2": "SQuAD v2 answerable questions, greedy answers: contains-label and F1 by context length",
    "infilling": "story infilling: multiple choice by length-normalised loss (--validation-file JSONL)",
    "lm-eval:TASKS": "EleutherAI lm-evaluation-harness tasks (pip install 'ssmlm[harness]')",
}


def is_lm_run(run: Run) -> bool:
    return run.recipe.objective.kind == "lm"


def prompt_pairs(recipe: Recipe, tokenizer, seq_len: int) -> tuple[list[dict], list[dict]]:
    """(training, validation) prompt/response pairs of the recipe's task."""
    task = recipe.task
    seed = recipe.train.seed
    if task.name == "phonebook":
        pb = task.phonebook
        # validation books come from another seed stream than the training books (never the same book)
        train = phonebook_books(pb, tokenizer, seq_len, pb.train_books, seed)
        val = phonebook_books(pb, tokenizer, seq_len, pb.validation_books, seed + 1_000_003)
        return [b.to_dict() for b in train], [b.to_dict() for b in val]
    if task.name == "instruct":
        from ssmlm.data.instruct import load_pairs

        if not task.train_file:
            raise UserError("--task instruct needs --train-file: a prompt/response JSONL, or flan / openhermes")
        train = load_pairs(task.train_file, "train", seed=seed)
        if task.validation_file:
            return train, load_pairs(task.validation_file, "validation", seed=seed)
        k = min(task.validation_examples, len(train) // 10)  # a held-out tail: a tenth at most
        return (train[:-k], train[-k:]) if k else (train, [])
    known = ", ".join(LM_TASKS)
    raise UserError(f"--task {task.name!r}: a language model finetunes on {known}")


def finetune_lm(
    recipe: Recipe, run_dir: Path, quiet: bool = False, stop_after: int | None = None, hooks: list | None = None
) -> dict[str, Any]:
    """Finetune a language-model run on a prompt/response task (see the module doc)."""
    from ssmlm.data.reserved import END
    from ssmlm.models import build_pretraining_model
    from ssmlm.objectives.prompts import PromptResponseObjective
    from ssmlm.train.stages import _process_shard, _source_weights, best_validation, check_layout

    maybe_initialize_distributed()
    source = open_run(recipe.train.init_from)
    tok = source.tokenizer()
    if tok.token_to_id(END) is None:
        raise UserError(f"{source.dir}: its tokenizer predates the END token; pretrain it again with this ssmlm")
    seq_len = recipe.task.max_seq_length or source.recipe.model.max_seq_length
    # the recurrences have no position table, so finetuning may use longer rows than pretraining did
    model_cfg = dataclasses.replace(source.recipe.model, dropout=recipe.model.dropout,
                                    max_seq_length=max(seq_len, source.recipe.model.max_seq_length))  # fmt: skip
    recipe = dataclasses.replace(recipe, model=model_cfg, data=source.recipe.data, objective=source.recipe.objective,
                                 task=dataclasses.replace(recipe.task, max_seq_length=seq_len))  # fmt: skip
    train, val = prompt_pairs(recipe, tok, seq_len)
    if not train:
        raise UserError(f"task {recipe.task.name}: no training pairs")
    process, processes = _process_shard()
    local = recipe.train.batch_size // processes
    objective = PromptResponseObjective(train, val, tok, seq_len, recipe.train.batch_size, recipe.train.seed,
                                        # end_half runs saw it at the start half the time: lead with it
                                        paradigm="none" if source.recipe.objective.paradigm == "none" else "start",
                                        rows=(process * local, (process + 1) * local))  # fmt: skip
    epochs = recipe.train.epochs
    total = int(objective.steps_per_epoch * epochs) if epochs else recipe.train.steps
    if total < 1:
        raise UserError(f"train.epochs = {epochs}: gives no training step ({objective.steps_per_epoch} per epoch)")
    model = build_pretraining_model(recipe.model, seed=recipe.train.seed)
    _source_weights(model, source)
    check_layout(recipe)
    info = {"kind": "finetune", "source": str(source.dir), "task": recipe.task.name, "head": "lm",
            "metrics": ["exact_match", "loss", "token_accuracy"]}  # fmt: skip
    if not quiet:
        console.print(f"{recipe.task.name}: {len(train):,} training pairs in {objective.steps_per_epoch:,} steps "
                      f"per epoch, {len(val):,} validation pairs, rows of {seq_len} tokens")  # fmt: skip

    with removed_on_failure(run_dir):
        if jax.process_index() == 0:
            prepare_run_dir(run_dir, recipe, info)
            shutil.copyfile(source.dir / "tokenizer.json", run_dir / "tokenizer.json")
            if recipe.task.name == "phonebook":  # what was trained and validated on, for the record
                atomic_write(run_dir / "phonebook-validation.jsonl", "".join(json.dumps(p) + "\n" for p in val))
        barrier("run-dir")
        stage = loop.Stage(
            kind="finetune",
            model=model,
            loss_fn=objective.loss,
            batches=objective.train_batch,
            total_steps=total,
            tokens_per_step=recipe.train.batch_size * seq_len,
            eval_fn=objective.eval if val else None,
            eval_data=objective.eval_batches if val else None,
            score=objective.score,
            meta={
                "task": recipe.task.name,
                "tokenizer_sha256": sha256(run_dir / "tokenizer.json"),
                "steps_per_epoch": objective.steps_per_epoch,
            },  # fmt: skip
            hooks=list(hooks or []),
        )
        summary = loop.run(stage, recipe, run_dir, quiet=quiet, stop_after=stop_after)
    if jax.process_index() == 0:
        summary["best_validation"] = best_validation(run_dir / "metrics.jsonl", "exact_match")
        atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
