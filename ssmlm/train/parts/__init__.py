"""The kinds of work the driver (ssmlm.train.drive) runs, one module each, and what they share.

    mlm.py       encoder pretraining and extend-length: masked LM on preprocessed token rows
    lm.py        language-model pretraining: Birdie's objective mixtures, packed per step, and its controller
    task.py      encoder finetuning: classification, regression, spans, multiple choice
    prompts.py   language-model finetuning on prompt/response pairs (phone book, instructions)

Each has ``prepare(recipe, kind, source, quiet) -> Work``: the resolved recipe, the loop.Stage (model, loss,
batches, evaluation) and what the run directory records. Everything that can fail on the data or the model
happens there, before the driver writes anything.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from ssmlm.metrics_file import read_metrics
from ssmlm.progress import console
from ssmlm.recipe import DataConfig, Recipe
from ssmlm.runs import Run
from ssmlm.runs.checkpoint import load_params
from ssmlm.train import loop
from ssmlm.train.mesh import barrier
from ssmlm.train.transplant import transplant


@dataclasses.dataclass
class Work:
    """What one kind of work hands the driver."""

    recipe: Recipe  # resolved: what the run directory records and the loop runs
    stage: loop.Stage  # model, loss, batches, evaluation (its meta gets the tokenizer's hash from the driver)
    info: dict  # the run's manifest entries: kind, source, data_dir, task, head, …
    tokenizer: Path  # copied into the run directory
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # more files for the run directory
    selection: str | None = None  # finetuning: the validation metric of the summary's best_validation
    summary: dict = dataclasses.field(default_factory=dict)  # more summary entries (warnings: see recorded)


def recorded(*notes: str | None) -> list[str]:
    """The warnings a run printed (or would have printed, when quiet), as its summary.json keeps them under
    ``warnings``, without their colours: where `ssmlm experiment` finds them."""
    from rich.text import Text

    return [Text.from_markup(n).plain for n in notes if n]


def process_shard() -> tuple[int, int]:
    """Each process reads only its own rows of every global batch."""
    return jax.process_index(), jax.process_count()


def local_rows(batch_size: int) -> tuple[int, int]:
    """This process's rows [start, stop) of every global batch."""
    process, processes = process_shard()
    local = batch_size // processes
    return process * local, (process + 1) * local


def preprocessed(data: DataConfig, seq_len: int, quiet: bool, layout: str = "rows") -> Path:
    """Every process tokenises its share of the corpus's chunks (multi-host runs split the shards); process 0
    writes the metadata once all shards exist. A finished dataset in the shared cache is reused. After the
    barrier the other processes look again: the dataset is finished, and with a cache in a bucket each fetches
    its local copies of the shards (hosts share no disk)."""
    from ssmlm.data.preprocess import preprocess

    hosts = process_shard()
    data_dir = preprocess(data, seq_len, quiet=quiet or hosts[0] != 0, hosts=hosts, layout=layout)
    barrier("preprocess", f"the end of preprocessing (host 0 writes {data_dir}/metadata.json)", "SSMLM_DATA_TIMEOUT")
    if hosts[0] != 0:
        data_dir = preprocess(data, seq_len, quiet=True, hosts=hosts, layout=layout)
    return data_dir


def architecture_only(source: Run) -> Run:
    """``source`` as an architecture and tokenizer only: ``source_weights`` leaves the model at its fresh
    initialisation (`ssmlm finetune --init random`)."""
    return dataclasses.replace(source, info={**source.info, "weights": False})


def recipe_source(recipe: Recipe, quiet: bool) -> Run:
    """An encoder recipe's own model and data as a source run without weights (`finetune --init random` without
    --ckpt): the data is preprocessed (or its cache reused) for the tokenizer, which fixes model.vocab_size."""
    from ssmlm.data.preprocess import read_metadata
    from ssmlm.errors import UserError
    from ssmlm.models import is_lm, with_vocab

    if is_lm(recipe.model.arch):
        raise UserError(f"init 'random' of a language model ({recipe.model.arch}) needs --ckpt RUN (its tokenizer)")
    data_dir = preprocessed(recipe.data, recipe.seq_len, quiet)
    resolved = dataclasses.replace(recipe, model=with_vocab(recipe.model, read_metadata(data_dir)["vocab_size"]))
    return architecture_only(Run(data_dir, resolved, {"kind": "pretrain", "data_dir": str(data_dir), "source": None}))


def source_weights(model, source: Run, position_init: str = "tile", step: int | None = None) -> int | None:
    """Copy a source run's weights into ``model`` (what matches by name and shape; see train.transplant), of its
    checkpoint at ``step`` (train.init_step; None: its newest usable one); a source from ``architecture_only``
    leaves the model as it is. Returns the step loaded (None: none was)."""
    from ssmlm.models import extend_hook

    if source.info.get("weights") is False:
        console.print(f"random initialisation: the architecture of {source.dir}, its weights not loaded")
        return None

    src_params, meta = load_params(source.dir, nnx.split(source.abstract_model(), nnx.Param)[1], step)
    report = transplant(model, src_params, position_init, extend_hook(source.recipe.model.arch))
    counts = ", ".join(f"{n:,} {what}" for what, n in report.items() if n)  # tensors copied / extended / fresh
    console.print(f"initialised from {source.dir} (step {meta['step']}): tensors {counts}")
    return int(meta["step"])


def total_steps(train, steps_per_epoch: int) -> int:
    """train.epochs × the epoch's steps when epochs are set, else train.steps (finetuning)."""
    from ssmlm.errors import UserError

    total = int(steps_per_epoch * train.epochs) if train.epochs else train.steps
    if total < 1:
        raise UserError(
            f"train.epochs = {train.epochs}: gives no training step ({steps_per_epoch} steps per epoch "
            f"at train.batch_size = {train.batch_size})"
        )
    return total


def best_validation(metrics_path: Path, key: str) -> dict | None:
    """The best evaluation seen during training by metric ``key`` (the task's `TaskDef.selection`, e.g.
    Spearman for STS-B), as the official BiGS protocol reports (optimistic). The earliest row wins a tie;
    rows without a finite value for ``key`` are skipped (a NaN would make the max depend on row order)."""
    rows = [
        r for r in read_metrics(metrics_path) if r.get("split") == "validation" and isinstance(r.get(key), int | float)
    ]
    rows = [r for r in rows if np.isfinite(r[key])]
    return max(rows, key=lambda r: r[key]) if rows else None
