"""Encoder pretraining (`ssmlm pretrain`) and length extension (`ssmlm extend-length --from RUN`): the
recipe's objective (masked LM by default, from ``ssmlm.objectives.OBJECTIVES``) on preprocessed token rows.
extend-length keeps the source's architecture at the new ``model.max_seq_length``, its tokenizer and its
weights (SSM kernels evaluated at the new length, position rows tiled), with a fresh optimizer and schedule."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from ssmlm import objectives, staging
from ssmlm.data.loader import Batches, TokenRows, eval_batches
from ssmlm.data.preprocess import packing_note, read_metadata
from ssmlm.errors import UserError
from ssmlm.recipe import DataConfig, Recipe
from ssmlm.runs import Run
from ssmlm.train import loop
from ssmlm.train.parts import Work, preprocessed, process_shard, recorded, source_weights


def extend_data(recipe: Recipe, source: Run) -> DataConfig:
    """extend-length's data: this recipe's corpus, tokenised with the source run's tokenizer (the ids must
    mean what they meant)."""
    return dataclasses.replace(recipe.data, tokenizer=str((source.dir / "tokenizer.json").resolve()))


def check_source(recipe: Recipe, source: Run) -> None:
    if source.kind == "finetune":
        raise UserError(f"{source.dir}: is a finetuning run; extend-length starts from an MLM run")
    new_len, old_len = recipe.model.max_seq_length, source.recipe.model.max_seq_length
    if new_len < old_len:
        raise UserError(f"model.max_seq_length = {new_len}: must be at least the source run's {old_len}")


def resolve(recipe: Recipe, source: Run | None, vocab_size: int) -> Recipe:
    """pretrain: model.vocab_size from the tokenizer; extend-length: the source's architecture at the new
    model.max_seq_length, and its tokenizer."""
    from ssmlm.models import with_vocab

    model, data = recipe.model, recipe.data
    if source is not None:
        model = dataclasses.replace(source.recipe.model, max_seq_length=recipe.model.max_seq_length)
        data = extend_data(recipe, source)
    return dataclasses.replace(recipe, model=with_vocab(model, vocab_size), data=data)


def token_eval_data(data_dir: Path, objective, batch_size: int, max_batches: int | None):
    """() -> the validation split's batches under ``objective`` (None when the split is empty)."""
    split = TokenRows(data_dir, "validation")
    if not len(split):
        return None
    pad = {"tokens": np.zeros(split.seq_len, np.int32), "row": np.int64(0)}  # weight-0 rows fill the last batch
    return lambda: (objective.eval_batch(rows) for rows in eval_batches(split, batch_size, max_batches, pad))


def prepare(recipe: Recipe, kind: str, source: Run | None, quiet: bool) -> Work:
    from ssmlm.models import build_mlm

    if source is not None:
        check_source(recipe, source)
    seq_len = recipe.seq_len
    if seq_len > recipe.model.max_seq_length:
        raise UserError(f"data.max_seq_length = {seq_len} exceeds model.max_seq_length = {recipe.model.max_seq_length}")
    data_dir = preprocessed(extend_data(recipe, source) if source else recipe.data, seq_len, quiet)
    meta = read_metadata(data_dir)
    recipe = resolve(recipe, source, meta["vocab_size"])
    objective = objectives.build(recipe.objective, meta["special_ids"], meta["vocab_size"], seq_len, recipe.data.seed)
    model = build_mlm(recipe.model, seed=recipe.train.seed)
    init_step = None
    if source is not None:
        init_step = source_weights(model, source, recipe.train.position_init, recipe.train.init_step)
    t = recipe.train
    rows = Batches(objective.train_examples(TokenRows(data_dir, "train")), t.batch_size, t.seed, process_shard())
    stage = loop.Stage(
        kind=kind,
        model=model,
        loss_fn=objective.loss,
        batches=lambda step, state=None: objective.train_batch(rows(step), step, state),
        total_steps=t.steps,
        tokens_per_step=t.batch_size * seq_len,
        eval_fn=objective.eval,
        eval_data=token_eval_data(data_dir, objective, t.batch_size, t.eval_batches),
        score=objective.score,
        meta={
            "data_dir": str(data_dir),
            "data_fingerprint": meta["fingerprint"],
            "objective": objective.name,
            "max_predictions": objective.predictions,
            "fill_rate": meta.get("fill_rate"),  # real tokens / slots of the training rows
            "steps_per_epoch": rows.steps_per_epoch,
        },
        predictions_per_row=objective.predictions,
    )
    info = {"kind": kind, "data_dir": str(data_dir), "source": staging.location(source.dir) if source else None}
    if source is not None:
        info["init_step"] = init_step  # the source's checkpoint loaded
    warnings = recorded(packing_note(meta))  # preprocessed() printed it
    held = {"rows": meta["splits"].get("validation", {}).get("sequences", 0)}  # for the record (preprocessed() said it)
    summary = {"fill_rate": meta.get("fill_rate"), "warnings": warnings, "validation_held_out": held}
    return Work(recipe, stage, info, data_dir / "tokenizer.json", summary=summary)
