"""Encoder finetuning (`ssmlm finetune --ckpt RUN --task NAME`): classification, regression, span extraction or
multiple choice from a pretrained (or finetuned, e.g. MNLI) run. The encoder is copied; the pooler and classifier
too when the source has them with the same shapes (the paper's MNLI initialisation for RTE, MRPC and STS-B)."""

from __future__ import annotations

import dataclasses

import numpy as np

from ssmlm import staging
from ssmlm.data.loader import ArrayTable, Batches, eval_batches
from ssmlm.errors import UserError
from ssmlm.objectives.tasks import HEADS, Prepared, task_batch
from ssmlm.objectives.tasks import prepare as prepare_task
from ssmlm.progress import console
from ssmlm.recipe import Recipe
from ssmlm.runs import Run
from ssmlm.train import loop
from ssmlm.train.parts import Work, process_shard, source_weights, total_steps


def resolve(recipe: Recipe, source: Run, prep: Prepared) -> Recipe:
    """The source's architecture (this recipe's dropout), data section and tokenizer; the task's length
    (default: the source's), label count and columns."""
    model = dataclasses.replace(source.recipe.model, dropout=recipe.model.dropout)
    td = prep.definition
    task = dataclasses.replace(
        recipe.task,
        max_seq_length=recipe.task.max_seq_length or model.max_seq_length,
        num_labels=td.num_labels,
        text_fields=list(td.text_fields),
        label_field=td.label_field,
    )
    return dataclasses.replace(recipe, model=model, data=source.recipe.data, task=task)


def task_eval_data(arrays: dict[str, np.ndarray], batch_size: int):
    pad = {k: np.zeros_like(v[0]) for k, v in arrays.items()}  # weight-0 rows fill the last batch
    return lambda: (task_batch(rows) for rows in eval_batches(ArrayTable(arrays), batch_size, None, pad))


def check_padding(cfg, padding: str) -> None:
    """`task.padding: longest` pads each split to its longest example, so an example's padding depends on its
    split; refuse it where padding changes predictions (official unmasked SSM / spatial mixing, or a pooler
    that averages the pads)."""
    from ssmlm.models.config import facts
    from ssmlm.models.heads import pooler_kind

    mixes_pads = not facts(cfg.arch).pad_blind and not cfg.mask_padding
    if padding == "longest" and (mixes_pads or pooler_kind(cfg) == "mean"):
        why = "model.pooler = 'mean' averages the pads" if not mixes_pads else "model.mask_padding = false"
        raise UserError(
            f"task.padding = 'longest': with {why} predictions would depend on the padding; "
            "use task.padding = 'max_length' (the official setting)"
        )


def prepare(recipe: Recipe, kind: str, source: Run, quiet: bool) -> Work:
    max_len = recipe.task.max_seq_length or source.recipe.model.max_seq_length
    if max_len > source.recipe.model.max_seq_length:
        raise UserError(
            f"task.max_seq_length = {max_len} exceeds the checkpoint's max_seq_length "
            f"{source.recipe.model.max_seq_length}; run extend-length first"
        )
    check_padding(source.recipe.model, recipe.task.padding)
    prep = prepare_task(recipe.task, source.tokenizer(), max_len, seed=recipe.train.seed)
    td = prep.definition
    if not quiet:
        for note in prep.notes:  # the label map and balance, a held-out validation split
            console.print(note, soft_wrap=True, markup=False, highlight=False)
    recipe = resolve(recipe, source, prep)
    head = HEADS[td.head]
    model = head.build(recipe.model, td.num_labels, recipe.train.seed)
    init_step = source_weights(model, source, step=recipe.train.init_step)
    arrays = prep.arrays
    t = recipe.train
    rows = Batches(ArrayTable(arrays["train"]), t.batch_size, t.seed, process_shard())
    stage = loop.Stage(
        kind="finetune",
        model=model,
        loss_fn=head.loss,
        batches=lambda step, state=None: task_batch(rows(step)),
        total_steps=total_steps(t, rows.steps_per_epoch),
        tokens_per_step=t.batch_size * max_len,
        eval_fn=head.eval,
        eval_data=task_eval_data(arrays["validation"], t.batch_size) if "validation" in arrays else None,
        score=prep.scorers.get("validation"),
        meta={"task": td.name, "steps_per_epoch": rows.steps_per_epoch},
        eval_also_every=rows.steps_per_epoch if t.epochs else 0,  # every N steps and at every epoch end
    )
    info = {
        "kind": "finetune",
        "source": staging.location(source.dir),
        "init_step": init_step,  # the source's checkpoint loaded (None: no weights, init random)
        "task": td.name,
        "head": td.head,
        "num_labels": td.num_labels,
        "label_names": prep.label_names,
        "metrics": list(td.metrics),
    }
    return Work(recipe, stage, info, source.dir / "tokenizer.json", selection=td.selection)
