"""Language-model pretraining (Birdie's families): the recipe's objective mixture on documents, every step's
rows packed on the host from (seed, step, mixture) alone, so a resumed run reads exactly the rows an
uninterrupted one would and each process builds only its own rows; with ``objective.mixture: birdie`` the
controller (reward model) moves the mixture while training runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ssmlm.data.preprocess import FILL_WARN, read_metadata
from ssmlm.errors import UserError
from ssmlm.progress import console
from ssmlm.recipe import Recipe
from ssmlm.runs import Run
from ssmlm.train import loop
from ssmlm.train.parts import Work, local_rows, preprocessed, recorded


def lm_objective(recipe: Recipe, data_dir: Path, rows: tuple[int, int] | None = None):
    """The LM objective of a recipe over its preprocessed documents (training and ``ssmlm evaluate``), built
    through ``objectives.OBJECTIVES['lm']``; a dynamic mixture also evaluates
    ``objective.controller.validation_rows`` rows per configuration."""
    from ssmlm.data.reserved import reserved_ids
    from ssmlm.data.shards import TokenDocuments
    from ssmlm.data.tokenizer import load_lm_tokenizer
    from ssmlm.objectives import build_lm

    tok = load_lm_tokenizer(data_dir / "tokenizer.json")
    try:
        return build_lm(
            recipe.objective,
            reserved_ids(tok.token_to_id),
            TokenDocuments(data_dir, "train"),
            TokenDocuments(data_dir, "validation"),
            recipe.seq_len,
            recipe.data.seed,
            batch_size=recipe.train.batch_size,
            rows=rows,
        )
    except ValueError as e:  # e.g. no configuration of the mixture fits the sequence length
        raise UserError(f"objective.mixture = {recipe.objective.mixture!r}: {e}") from None


def birdie_controller(recipe: Recipe, objective):
    """Birdie's controller over the objective's configurations (None for a fixed mixture)."""
    from ssmlm.objectives.birdie.mixtures import DYNAMIC

    if objective.mixture not in DYNAMIC:
        return None
    from ssmlm.objectives.birdie.controller import BirdieController

    return BirdieController(objective.configs, recipe.train.steps, objective.seed, recipe.objective.controller)


def lm_eval_data(recipe: Recipe, objective):
    """() -> the fixed validation batches (rows are generated: "the whole split" has no meaning here, so
    train.eval_batches = 0 means 8); None without validation documents."""
    n = recipe.train.eval_batches or 8
    return (lambda: objective.eval_batches(n)) if len(objective.docs_val) else None


def _batches(objective, controller):
    """(step, controller state) -> the step's batch, under the controller's action when there is one."""
    if controller is None:
        return objective.train_batch
    return lambda step, state=None: objective.train_batch(step, None if state is None else controller.action(state))


def left_out(dropped: list[str], total: int, seq_len: int) -> str:
    """One short line on the configurations a dynamic mixture leaves out, counted by objective function."""
    kinds = [name.split("(")[0] for name in dropped]
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
    return (
        f"[yellow]{len(dropped)} of the mixture's {total} configurations cannot make a sample in {seq_len} "
        f"tokens and are left out[/] ({counts})"
    )


def row_fill(objective) -> float:
    """The share of the first step's row slots that hold a sample (this process's rows, the mixture's start)."""
    return float((objective.train_rows(0)["segment_ids"] > 0).mean())


def packing_note(fill: float, recipe: Recipe) -> str | None:
    """One line when the rows are less than FILL_WARN filled: what closes a row early, and what fills it."""
    if fill >= FILL_WARN:
        return None
    obj = recipe.objective
    spacing = f"; objective.spacing = {obj.spacing} pads between samples" if obj.spacing else ""
    return (
        f"[yellow]packing:[/] the rows are {fill:.0%} samples, {1 - fill:.0%} padding (a row is closed once fewer "
        f"than objective.min_sample_space = {obj.min_sample_space} slots are left, or when 4 samples in a row do "
        f"not fit{spacing}); a smaller objective.min_sample_space fills them"
    )


def prepare(recipe: Recipe, kind: str, source: Run | None, quiet: bool) -> Work:
    from ssmlm.models import build_lm, with_vocab

    seq_len = recipe.seq_len
    data_dir = preprocessed(recipe.data, seq_len, quiet, layout="documents")
    meta = read_metadata(data_dir)
    recipe = dataclasses.replace(recipe, model=with_vocab(recipe.model, meta["vocab_size"]))
    objective = lm_objective(recipe, data_dir, rows=local_rows(recipe.train.batch_size))
    model = build_lm(recipe.model, seed=recipe.train.seed)
    eval_data = lm_eval_data(recipe, objective)
    no_val = (
        f"data.validation_fraction = {recipe.data.validation_fraction} of {meta['documents']} documents "
        "held none out (a corpus of few long files: split them, or raise it)"
    )
    controller = birdie_controller(recipe, objective)
    if controller is not None and eval_data is None:
        raise UserError(f"objective.mixture: birdie learns from validation losses, but {no_val}")
    fill = row_fill(objective)
    dropped = left_out(objective.dropped, len(objective.dropped) + len(objective.configs), seq_len)
    held = len(objective.docs_val)
    notes = [
        f"[yellow]no validation: {no_val}" if eval_data is None else None,
        dropped if objective.dropped else None,
        packing_note(fill, recipe),
    ]
    if not quiet:
        if held:  # said always, not only when none was held out
            fraction = recipe.data.validation_fraction
            console.print(
                f"validation: {held:,} documents held out (data.validation_fraction = {fraction} of "
                f"{meta['documents']:,})",
                soft_wrap=True,
            )
        for note in filter(None, notes):
            console.print(note, soft_wrap=True)
    eval_steps = set(controller.eval_steps()) if controller is not None else set()
    stage = loop.Stage(
        kind="pretrain",
        model=model,
        loss_fn=objective.loss,
        batches=_batches(objective, controller),
        total_steps=recipe.train.steps,
        tokens_per_step=recipe.train.batch_size * seq_len,
        eval_fn=objective.eval,
        eval_data=eval_data,
        score=objective.score,
        meta={
            "data_dir": str(data_dir),
            "data_fingerprint": meta["fingerprint"],
            "objective": f"lm/{objective.mixture}",
            "configs": [c.name for c in objective.configs],
            "fill_rate": fill,  # slots holding a sample / slots, of the first step's rows
        },
        controller=controller,
        eval_at=eval_steps.__contains__ if eval_steps else None,
        predictions_per_row=None,  # the LM head is a dense layer at every position: counted with the rest
    )
    info = {"kind": "pretrain", "data_dir": str(data_dir), "source": None}
    # what was printed, for `ssmlm experiment`; and the held-out documents' count, for the record
    summary = {"fill_rate": fill, "warnings": recorded(*notes), "validation_held_out": {"documents": held}}
    return Work(recipe, stage, info, data_dir / "tokenizer.json", summary=summary)
