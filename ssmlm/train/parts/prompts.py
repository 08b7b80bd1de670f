"""Language-model finetuning on prompt/response pairs: `ssmlm finetune --ckpt LM_RUN --task phonebook|instruct`.

The prompt is the bidirectional prefix and the response the causal target (closed by END), several pairs
packed per row in the START layout the model was pretrained on (``ssmlm.objectives.prompts``); the whole
model is copied from the source run. Validation reports the target-token loss and the share of responses the
model reproduces exactly under teacher forcing (which is what greedy decoding would generate); `ssmlm evaluate
--task phonebook` then decodes for real.

Tasks: those whose declaration (ssmlm.data.lm_tasks) names a reader: ``phonebook`` (Birdie §4.3, A.9: generated
books, ``task.phonebook``) and ``instruct`` (App. A.12: ``task.train_file`` = a local JSONL of prompt/response
pairs or a hub alias, ``ssmlm.data.instruct``).
"""

from __future__ import annotations

import dataclasses
import json

from ssmlm import staging
from ssmlm.data.finetune_task import check_train_file
from ssmlm.data.lm_tasks import LM_TASKS, finetuning_tasks
from ssmlm.errors import UserError
from ssmlm.progress import activity, console
from ssmlm.recipe import Recipe
from ssmlm.runs import Run
from ssmlm.schema import named
from ssmlm.train import loop
from ssmlm.train.parts import Work, local_rows, source_weights, total_steps


def prompt_pairs(recipe: Recipe, tokenizer, seq_len: int, quiet: bool = False) -> tuple[list[dict], list[dict]]:
    """(training, validation) prompt/response pairs of the recipe's task (``quiet``: no progress bars), read by
    the reader its declaration names (ssmlm.data.lm_tasks)."""
    task = recipe.task
    declared = LM_TASKS.get(task.name)
    if declared is None or declared.reader is None:
        known = ", ".join(finetuning_tasks())
        raise UserError(f"--task {task.name!r}: a language model finetunes on {known}")
    check_train_file(task)
    return named(declared.reader)(recipe, tokenizer, seq_len, quiet)


def phonebook_pairs(recipe: Recipe, tokenizer, seq_len: int, quiet: bool) -> tuple[list[dict], list[dict]]:
    """Generated phone books (task.phonebook); the validation books from another seed stream than the training
    books (never the same book)."""
    from ssmlm.data.phonebook import phonebook_books

    pb, seed = recipe.task.phonebook, recipe.train.seed
    label = lambda which: None if quiet else f"{which} phone books"  # noqa: E731
    train = phonebook_books(pb, tokenizer, seq_len, pb.train_books, seed, progress=label("training"))
    val = phonebook_books(pb, tokenizer, seq_len, pb.validation_books, seed + 1_000_003, label("validation"))
    return [b.to_dict() for b in train], [b.to_dict() for b in val]


def instruct_pairs(recipe: Recipe, tokenizer, seq_len: int, quiet: bool) -> tuple[list[dict], list[dict]]:
    """task.train_file's pairs (a JSONL or a hub alias); validation: task.validation_file's, else a held-out tail."""
    from ssmlm.data.instruct import load_pairs

    task, seed = recipe.task, recipe.train.seed
    train = load_pairs(task.train_file, "train", seed=seed)
    if task.validation_file:
        return train, load_pairs(task.validation_file, "validation", seed=seed)
    k = min(task.validation_examples, len(train) // 10)  # a held-out tail: a tenth at most
    return (train[:-k], train[-k:]) if k else (train, [])


def resolve(recipe: Recipe, source: Run, seq_len: int) -> Recipe:
    """The source's model (this recipe's dropout; the recurrences have no position table, so finetuning may
    use longer rows than pretraining did), data and objective sections; the task's row length."""
    src = source.recipe
    model = dataclasses.replace(
        src.model, dropout=recipe.model.dropout, max_seq_length=max(seq_len, src.model.max_seq_length)
    )
    task = dataclasses.replace(recipe.task, max_seq_length=seq_len)
    return dataclasses.replace(recipe, model=model, data=src.data, objective=src.objective, task=task)


def prepare(recipe: Recipe, kind: str, source: Run, quiet: bool) -> Work:
    from ssmlm.data.reserved import END
    from ssmlm.models import build_lm
    from ssmlm.objectives.prompts import PromptResponseObjective

    tok = source.tokenizer()
    if tok.token_to_id(END) is None:
        raise UserError(f"{source.dir}: its tokenizer predates the END token; pretrain it again with this ssmlm")
    seq_len = recipe.task.max_seq_length or source.recipe.model.max_seq_length
    recipe = resolve(recipe, source, seq_len)
    train, val = prompt_pairs(recipe, tok, seq_len, quiet)
    if not train:
        raise UserError(f"task {recipe.task.name}: no training pairs")
    t = recipe.train
    with activity(f"tokenizing {len(train) + len(val):,} pairs, loading {source.dir}", quiet):
        objective = PromptResponseObjective(
            train,
            val,
            tok,
            seq_len,
            t.batch_size,
            t.seed,
            # end_half runs saw it at the start half the time: lead with it
            paradigm="none" if recipe.objective.paradigm == "none" else "start",
            rows=local_rows(t.batch_size),
        )
        model = build_lm(recipe.model, seed=t.seed)
        init_step = source_weights(model, source, step=recipe.train.init_step)
    if not quiet:
        console.print(
            f"{recipe.task.name}: {len(train):,} training pairs in {objective.steps_per_epoch:,} steps "
            f"per epoch, {len(val):,} validation pairs, rows of {seq_len} tokens"
        )
    stage = loop.Stage(
        kind="finetune",
        model=model,
        loss_fn=objective.loss,
        batches=objective.train_batch,
        total_steps=total_steps(t, objective.steps_per_epoch),
        tokens_per_step=t.batch_size * seq_len,
        eval_fn=objective.eval if val else None,
        eval_data=objective.eval_batches if val else None,
        score=objective.score,
        meta={"task": recipe.task.name, "steps_per_epoch": objective.steps_per_epoch},
    )
    info = {
        "kind": "finetune",
        "source": staging.location(source.dir),
        "init_step": init_step,  # the source's checkpoint loaded (None: no weights, init random)
        "task": recipe.task.name,
        "head": "lm",
        "metrics": ["exact_match", "loss", "token_accuracy"],
    }
    files = {}
    if LM_TASKS[recipe.task.name].keeps_validation:  # what was validated on, for the record
        files[f"{recipe.task.name}-validation.jsonl"] = "".join(json.dumps(p) + "\n" for p in val)
    return Work(recipe, stage, info, source.dir / "tokenizer.json", files, selection="exact_match")
