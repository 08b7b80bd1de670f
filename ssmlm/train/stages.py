"""The subcommands' stages: what pretrain, extend-length and finetune feed the one loop.

Each driver does the same four things: resolve the recipe it will run (once, in ``resolve``), prepare the
data and the objective, build the model (from a source run's weights where there is one), and hand a
loop.Stage to loop.run inside a run directory (ssmlm.runs). Everything that can fail on the data or the model
is tried before the run directory is written.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from ssmlm import objectives
from ssmlm.data.loader import ArrayTable, Batches, TokenRows, eval_batches
from ssmlm.data.preprocess import preprocess, read_metadata
from ssmlm.errors import UserError
from ssmlm.models import build_mlm, extend_hook, with_vocab
from ssmlm.objectives.tasks import HEADS, Prepared, prepare, task_batch
from ssmlm.progress import console
from ssmlm.recipe import DataConfig, Recipe
from ssmlm.runs import (
    Run,
    atomic_write,
    open_run,
    prepare_run_dir,
    removed_on_failure,
    sha256,
)
from ssmlm.runs.checkpoint import load_params
from ssmlm.train import loop
from ssmlm.train.mesh import barrier, check_batch, make_mesh, maybe_initialize_distributed
from ssmlm.train.transfer import transplant

__all__ = ["best_validation", "check_padding", "finetune", "open_run", "pretrain", "resolve"]


# ----------------------------------------------------------------------------- the resolved recipe


def resolve(
    recipe: Recipe,
    kind: str,
    source: Run | None = None,
    vocab_size: int | None = None,
    prep: Prepared | None = None,
) -> Recipe:
    """The recipe a stage runs and writes to its run directory, computed in one place:

    pretrain       model.vocab_size from the tokenizer
    extend-length  the source's architecture at the new model.max_seq_length; its tokenizer
    finetune       the source's architecture (this recipe's dropout), data section and tokenizer; the task's
                   length (default: the source's), label count and columns
    """
    model, data, task = recipe.model, recipe.data, recipe.task
    if kind == "extend-length":
        model = dataclasses.replace(source.recipe.model, max_seq_length=recipe.model.max_seq_length)
        data = extend_data(recipe, source)
    elif kind == "finetune":
        model = dataclasses.replace(source.recipe.model, dropout=recipe.model.dropout)
        data = source.recipe.data
        td = prep.definition
        task = dataclasses.replace(task, max_seq_length=task.max_seq_length or source.recipe.model.max_seq_length,
                                   num_labels=td.num_labels, text_fields=list(td.text_fields),
                                   label_field=td.label_field)  # fmt: skip
    if vocab_size is not None:
        model = with_vocab(model, vocab_size)
    return dataclasses.replace(recipe, model=model, data=data, task=task)


def extend_data(recipe: Recipe, source: Run) -> DataConfig:
    """extend-length's data: this recipe's corpus, tokenised with the source run's tokenizer (the ids must
    mean what they meant)."""
    return dataclasses.replace(recipe.data, tokenizer=str((source.dir / "tokenizer.json").resolve()))


def _process_shard() -> tuple[int, int]:
    """Each process reads only its own rows of every global batch."""
    return jax.process_index(), jax.process_count()


def check_layout(recipe: Recipe) -> None:
    """The batch splits over this machine's devices as the mesh asks (known only once jax sees the devices)."""
    check_batch(recipe.train.batch_size // recipe.train.grad_accum, make_mesh(recipe.mesh))


def _source_weights(model, source: Run, position_init: str = "tile") -> None:
    src_params, _ = load_params(source.dir, nnx.split(source.abstract_model(), nnx.Param)[1])
    report = transplant(model, src_params, position_init, extend_hook(source.recipe.model.arch))
    console.print(f"initialised from {source.dir}: {report}")


# ----------------------------------------------------------------------------- pretrain, extend-length


def _extend_source(recipe: Recipe) -> Run:
    if not recipe.train.init_from:
        raise UserError("extend-length needs a pretrained run: pass --from RUN_DIR (or set train.init_from)")
    source = open_run(recipe.train.init_from)
    if source.kind == "finetune":
        raise UserError(f"{source.dir}: is a finetuning run; extend-length starts from an MLM run")
    new_len = recipe.model.max_seq_length
    if new_len < source.recipe.model.max_seq_length:
        raise UserError(
            f"model.max_seq_length = {new_len}: must be at least the source run's {source.recipe.model.max_seq_length}"
        )
    return source


def _preprocessed(data: DataConfig, seq_len: int, quiet: bool, layout: str = "rows") -> Path:
    """Every process tokenises its share of the corpus's chunks (multi-host runs split the shards); process 0
    writes the metadata once all shards exist. A finished dataset in the shared cache is reused."""
    hosts = (jax.process_index(), jax.process_count())
    data_dir = preprocess(data, seq_len, quiet=quiet or hosts[0] != 0, hosts=hosts, layout=layout)
    barrier("preprocess")
    return data_dir


def pretrain(
    recipe: Recipe, run_dir: Path, kind: str = "pretrain", quiet: bool = False, stop_after: int | None = None,
    hooks: list | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train on the recipe's objective (MLM by default); with ``kind='extend-length'`` start from
    ``train.init_from`` at a longer length."""
    if recipe.objective.kind == "lm":
        if kind != "pretrain":
            raise UserError(f"{kind} is for encoders; a language model ({recipe.model.arch}) is pretrained only")
        return pretrain_lm(recipe, run_dir, quiet, stop_after, hooks)
    source = _extend_source(recipe) if kind == "extend-length" else None
    maybe_initialize_distributed()
    data_cfg = extend_data(recipe, source) if source else recipe.data
    seq_len = recipe.seq_len
    if seq_len > recipe.model.max_seq_length:
        raise UserError(f"data.max_seq_length = {seq_len} exceeds model.max_seq_length = {recipe.model.max_seq_length}")
    data_dir = _preprocessed(data_cfg, seq_len, quiet)
    meta = read_metadata(data_dir)
    recipe = resolve(recipe, kind, source, vocab_size=meta["vocab_size"])
    objective = objectives.build(recipe.objective, meta["special_ids"], meta["vocab_size"], seq_len, recipe.data.seed)

    model = build_mlm(recipe.model, seed=recipe.train.seed)
    if source is not None:
        _source_weights(model, source, recipe.train.position_init)
    rows = Batches(objective.train_examples(TokenRows(data_dir, "train")), recipe.train.batch_size,
                   recipe.train.seed, _process_shard())  # fmt: skip
    check_layout(recipe)

    with removed_on_failure(run_dir):
        if jax.process_index() == 0:
            info = {"kind": kind, "data_dir": str(data_dir), "source": str(source.dir) if source else None}
            prepare_run_dir(run_dir, recipe, info)
            shutil.copyfile(data_dir / "tokenizer.json", run_dir / "tokenizer.json")
        barrier("run-dir")
        stage = loop.Stage(
            kind=kind,
            model=model,
            loss_fn=objective.loss,
            batches=lambda step, state=None: objective.train_batch(rows(step), step, state),
            total_steps=recipe.train.steps,
            tokens_per_step=recipe.train.batch_size * seq_len,
            eval_fn=objective.eval,
            eval_data=token_eval_data(data_dir, objective, recipe.train.batch_size, recipe.train.eval_batches),
            score=objective.score,
            meta={
                "data_dir": str(data_dir),
                "data_fingerprint": meta["fingerprint"],
                "objective": objective.name,
                "max_predictions": objective.predictions,
                "fill_rate": meta.get("fill_rate"),  # real tokens / slots of the training rows
                "tokenizer_sha256": sha256(run_dir / "tokenizer.json"),
                "steps_per_epoch": rows.steps_per_epoch,
            },  # fmt: skip
            hooks=list(hooks or []),
            predictions_per_row=objective.predictions,
        )
        summary = loop.run(stage, recipe, run_dir, quiet=quiet, stop_after=stop_after)
    if jax.process_index() == 0:
        summary["fill_rate"] = meta.get("fill_rate")
        atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def pretrain_lm(
    recipe: Recipe, run_dir: Path, quiet: bool = False, stop_after: int | None = None, hooks: list | None = None
) -> dict[str, Any]:
    """Pretrain a language model (Birdie's families) on the recipe's objective mixture. The corpus is kept as
    documents; every step's rows are packed on the host from (seed, step, mixture) alone, so a resumed run
    reads exactly the rows an uninterrupted one would, and each process builds only its own rows."""
    from ssmlm.models import build_pretraining_model

    maybe_initialize_distributed()
    seq_len = recipe.seq_len
    data_dir = _preprocessed(recipe.data, seq_len, quiet, layout="documents")
    meta = read_metadata(data_dir)
    recipe = resolve(recipe, "pretrain", vocab_size=meta["vocab_size"])
    process, processes = _process_shard()
    local = recipe.train.batch_size // processes
    objective = lm_objective(recipe, data_dir, rows=(process * local, (process + 1) * local))
    model = build_pretraining_model(recipe.model, seed=recipe.train.seed)
    check_layout(recipe)
    eval_data = lm_eval_data(recipe, objective)
    no_val = (f"data.validation_fraction = {recipe.data.validation_fraction} of {meta['documents']} documents "
              "held none out (a corpus of few long files: split them, or raise it)")  # fmt: skip
    controller = birdie_controller(recipe, objective)
    if controller is not None and eval_data is None:
        raise UserError(f"objective.mixture: birdie learns from validation losses, but {no_val}")
    if eval_data is None and not quiet:
        console.print(f"[yellow]no validation: {no_val}")
    if objective.dropped and not quiet:
        left = ", ".join(objective.dropped)
        console.print(f"[yellow]{len(objective.dropped)} of the mixture's configurations cannot make a sample in "
                      f"{seq_len} tokens and are left out:[/] {left}", soft_wrap=True)  # fmt: skip
    if controller is not None:
        eval_steps = set(controller.eval_steps())
        batches = lambda step, state=None: objective.train_batch(  # noqa: E731
            step, None if state is None else controller.action(state)
        )
    else:
        eval_steps, batches = set(), objective.train_batch

    with removed_on_failure(run_dir):
        if jax.process_index() == 0:
            prepare_run_dir(run_dir, recipe, {"kind": "pretrain", "data_dir": str(data_dir), "source": None})
            shutil.copyfile(data_dir / "tokenizer.json", run_dir / "tokenizer.json")
        barrier("run-dir")
        stage = loop.Stage(
            kind="pretrain",
            model=model,
            loss_fn=objective.loss,
            batches=batches,
            total_steps=recipe.train.steps,
            tokens_per_step=recipe.train.batch_size * seq_len,
            eval_fn=objective.eval,
            eval_data=eval_data,
            score=objective.score,
            meta={
                "data_dir": str(data_dir),
                "data_fingerprint": meta["fingerprint"],
                "objective": f"lm/{objective.mixture}",
                "tokenizer_sha256": sha256(run_dir / "tokenizer.json"),
                "configs": [c.name for c in objective.configs],
            },
            hooks=list(hooks or []),
            controller=controller,
            eval_at=eval_steps.__contains__ if eval_steps else None,
            predictions_per_row=None,  # the LM head is a dense layer at every position: counted with the rest
        )
        summary = loop.run(stage, recipe, run_dir, quiet=quiet, stop_after=stop_after)
    if jax.process_index() == 0:
        atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def lm_objective(recipe: Recipe, data_dir: Path, rows: tuple[int, int] | None = None):
    """The LM objective of a recipe over its preprocessed documents (training and ``ssmlm evaluate``); a
    dynamic mixture also evaluates ``objective.controller.validation_rows`` rows per configuration."""
    from ssmlm.data.reserved import reserved_ids
    from ssmlm.data.shards import TokenDocuments
    from ssmlm.data.tokenizer import load_lm_tokenizer
    from ssmlm.objectives.birdie.mixtures import DYNAMIC
    from ssmlm.objectives.lm import LMObjective

    tok = load_lm_tokenizer(data_dir / "tokenizer.json")
    cfg = recipe.objective
    seed = cfg.seed if cfg.seed is not None else recipe.data.seed
    config_rows = cfg.controller.validation_rows if cfg.mixture in DYNAMIC else 0
    try:
        return LMObjective(cfg, reserved_ids(tok.token_to_id), TokenDocuments(data_dir, "train"),
                           TokenDocuments(data_dir, "validation"), recipe.seq_len, seed,
                           batch_size=recipe.train.batch_size, min_space=cfg.min_sample_space, rows=rows,
                           config_rows=config_rows)  # fmt: skip
    except ValueError as e:  # e.g. no configuration of the mixture fits the sequence length
        raise UserError(f"objective.mixture = {cfg.mixture!r}: {e}") from None


def birdie_controller(recipe: Recipe, objective):
    """Birdie's controller over the objective's configurations (None for a fixed mixture)."""
    from ssmlm.objectives.birdie.mixtures import DYNAMIC

    if objective.mixture not in DYNAMIC:
        return None
    from ssmlm.objectives.birdie.controller import BirdieController, ControllerConfig

    c = recipe.objective.controller
    settings = ControllerConfig(
        proposals=c.proposals, pools=c.pools, top_n=c.top_n, grok_iterations=c.grok_iterations, lr=c.learning_rate,
        weight_decay=c.weight_decay, noise=c.noise, width=c.width, state=c.state_size, layers=c.layers,
        max_history=c.max_history, explore=c.explore, explore_style=c.explore_style, start=c.start,
        eval_scale=c.eval_scale,
    )  # fmt: skip
    return BirdieController(objective.configs, recipe.train.steps, objective.seed, settings)


def lm_eval_data(recipe: Recipe, objective):
    """() -> the fixed validation batches (rows are generated: "the whole split" has no meaning here, so
    train.eval_batches = 0 means 8); None without validation documents."""
    n = recipe.train.eval_batches or 8
    return (lambda: objective.eval_batches(n)) if len(objective.docs_val) else None


def token_eval_data(data_dir: Path, objective, batch_size: int, max_batches: int | None):
    """() -> the validation split's batches under ``objective`` (None when the split is empty)."""
    split = TokenRows(data_dir, "validation")
    if not len(split):
        return None
    pad = {"tokens": np.zeros(split.seq_len, np.int32), "row": np.int64(0)}  # weight-0 rows fill the last batch
    return lambda: (objective.eval_batch(rows) for rows in eval_batches(split, batch_size, max_batches, pad))


# ----------------------------------------------------------------------------- finetune


def task_eval_data(arrays: dict[str, np.ndarray], batch_size: int):
    pad = {k: np.zeros_like(v[0]) for k, v in arrays.items()}  # weight-0 rows fill the last batch
    return lambda: (task_batch(rows) for rows in eval_batches(ArrayTable(arrays), batch_size, None, pad))


def finetune(
    recipe: Recipe, run_dir: Path, quiet: bool = False, stop_after: int | None = None, hooks: list | None = None
) -> dict[str, Any]:
    """Finetune a pretrained (or finetuned, e.g. MNLI) run on a task: classification, regression, span
    extraction or multiple choice. The encoder is copied; the pooler and classifier too when the source
    has them with the same shapes (the paper's MNLI initialisation for RTE, MRPC and STS-B)."""
    if not recipe.train.init_from:
        raise UserError("finetune needs a pretrained run: pass --ckpt RUN_DIR")
    maybe_initialize_distributed()
    source = open_run(recipe.train.init_from)
    max_len = recipe.task.max_seq_length or source.recipe.model.max_seq_length
    if max_len > source.recipe.model.max_seq_length:
        raise UserError(
            f"task.max_seq_length = {max_len} exceeds the checkpoint's max_seq_length "
            f"{source.recipe.model.max_seq_length}; run extend-length first"
        )
    check_padding(source.recipe.model, recipe.task.padding)
    prep = prepare(recipe.task, source.tokenizer(), max_len)
    td = prep.definition
    recipe = resolve(recipe, "finetune", source, prep=prep)
    info = {"kind": "finetune", "source": str(source.dir), "task": td.name, "head": td.head,
            "num_labels": td.num_labels, "label_names": prep.label_names, "metrics": list(td.metrics)}  # fmt: skip

    head = HEADS[td.head]
    model = head.build(recipe.model, td.num_labels, recipe.train.seed)
    _source_weights(model, source)
    arrays = prep.arrays
    rows = Batches(ArrayTable(arrays["train"]), recipe.train.batch_size, recipe.train.seed, _process_shard())
    epochs = recipe.train.epochs
    total = int(rows.steps_per_epoch * epochs) if epochs else recipe.train.steps
    if total < 1:
        raise UserError(
            f"train.epochs = {epochs}: gives no training step ({rows.steps_per_epoch} steps per epoch "
            f"at train.batch_size = {recipe.train.batch_size})"
        )
    check_layout(recipe)

    with removed_on_failure(run_dir):
        if jax.process_index() == 0:
            prepare_run_dir(run_dir, recipe, info)
            shutil.copyfile(source.dir / "tokenizer.json", run_dir / "tokenizer.json")
        barrier("run-dir")
        has_val = "validation" in arrays
        stage = loop.Stage(
            kind="finetune",
            model=model,
            loss_fn=head.loss,
            batches=lambda step, state=None: task_batch(rows(step)),
            total_steps=total,
            tokens_per_step=recipe.train.batch_size * max_len,
            eval_fn=head.eval,
            eval_data=task_eval_data(arrays["validation"], recipe.train.batch_size) if has_val else None,
            score=prep.scorers.get("validation"),
            meta={
                "task": td.name,
                "tokenizer_sha256": sha256(run_dir / "tokenizer.json"),
                "steps_per_epoch": rows.steps_per_epoch,
            },  # fmt: skip
            eval_also_every=rows.steps_per_epoch if epochs else 0,  # every N steps and at every epoch end
            hooks=list(hooks or []),
        )
        summary = loop.run(stage, recipe, run_dir, quiet=quiet, stop_after=stop_after)
    if jax.process_index() == 0:
        summary["best_validation"] = best_validation(run_dir / "metrics.jsonl", td.selection)
        atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def check_padding(cfg, padding: str) -> None:
    """`task.padding: longest` pads each split to its longest example, so an example's padding depends on its
    split; refuse it where padding changes predictions (official unmasked SSM / spatial mixing, or a pooler
    that averages the pads)."""
    from ssmlm.models.heads import pooler_kind

    mixes_pads = cfg.arch not in ("bert", "gated_att") and not cfg.mask_padding
    if padding == "longest" and (mixes_pads or pooler_kind(cfg) == "mean"):
        why = "model.pooler = 'mean' averages the pads" if not mixes_pads else "model.mask_padding = false"
        raise UserError(
            f"task.padding = 'longest': with {why} predictions would depend on the padding; "
            "use task.padding = 'max_length' (the official setting)"
        )


def best_validation(metrics_path: Path, key: str) -> dict | None:
    """The best evaluation seen during training by metric ``key`` (the task's `TaskDef.selection`, e.g.
    Spearman for STS-B), as the official BiGS protocol reports (optimistic). The earliest row wins a tie;
    rows without a finite value for ``key`` are skipped (a NaN would make the max depend on row order)."""
    rows = [json.loads(ln) for ln in metrics_path.read_text().splitlines() if ln.strip()]
    rows = [r for r in rows if r.get("split") == "validation" and isinstance(r.get(key), int | float)]
    rows = [r for r in rows if np.isfinite(r[key])]
    return max(rows, key=lambda r: r[key]) if rows else None
