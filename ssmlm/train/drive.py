"""The one driver behind `ssmlm pretrain`, `extend-length` and `finetune`.

Every kind of work does the same setup — distributed start, the batch-layout check, the run's lock (one writer
at a time: ssmlm.lockfile), the source run, the run directory (written only once the data and the model are
ready, removed again if nothing was trained), the
tokenizer copy, the loop, the summary — and differs only in its parts (ssmlm.train.parts): which model,
objective, batches, controller and selection rule. Which parts run is decided here, once: by the kind of work
and by whether the model family is a language model (``ssmlm.models.is_lm``, the family registry's word).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import jax

from ssmlm import staging
from ssmlm.checks import checkpoint_step
from ssmlm.errors import Diverged, UserError
from ssmlm.hosts import check_shared, lost
from ssmlm.lockfile import locked
from ssmlm.progress import console
from ssmlm.recipe import Recipe
from ssmlm.runs import (
    Run,
    atomic_write,
    open_run,
    prepare_run_dir,
    refuse_other_recipe,
    removed_on_failure,
    sha256,
)
from ssmlm.runs.checkpoint import CheckpointWriteError
from ssmlm.train import loop
from ssmlm.train.mesh import barrier, check_batch, make_mesh, maybe_initialize_distributed
from ssmlm.train.parts import architecture_only, best_validation, recipe_source

# (kind of work, language model?) -> the parts module (ssmlm.train.parts.*)
PARTS = {
    ("pretrain", False): "mlm",
    ("extend-length", False): "mlm",
    ("finetune", False): "task",
    ("pretrain", True): "lm",
    ("finetune", True): "prompts",
}
NEEDS_SOURCE = {
    "extend-length": "extend-length needs a pretrained run: pass --from RUN_DIR (or set train.init_from)",
    "finetune": "finetune needs a pretrained run: pass --ckpt RUN_DIR",
}


def check_layout(recipe: Recipe) -> None:
    """The batch splits over this machine's devices as the mesh asks (known only once jax sees the devices)."""
    check_batch(recipe.train.batch_size, make_mesh(recipe.mesh), grad_accum=recipe.train.grad_accum)


def source_run(recipe: Recipe, kind: str, init: str = "pretrained", quiet: bool = False) -> Run | None:
    """The run a stage starts from. ``init='random'`` (finetune only): its architecture and tokenizer, the weights
    not loaded — of ``train.init_from`` when set, else of the recipe's own model and data."""
    if kind not in NEEDS_SOURCE:
        return None
    if init == "random":
        if kind != "finetune":
            raise UserError(f"init 'random' is for finetune, not {kind}")
        if recipe.train.init_step is not None:
            raise UserError(
                f"train.init_step = {recipe.train.init_step} picks weights to load; init 'random' loads none"
            )
        source = open_run(recipe.train.init_from) if recipe.train.init_from else recipe_source(recipe, quiet)
        return architecture_only(source)
    if not recipe.train.init_from:
        raise UserError(NEEDS_SOURCE[kind])
    checkpoint_step(recipe.train.init_from, recipe.train.init_step, "train.init_step")
    return open_run(recipe.train.init_from)


# what finetuning fills into its recipe's task from the task's definition and the source run
TASK_RESOLVED = ("max_seq_length", "num_labels", "text_fields", "label_field")


def as_resolved(kind: str):
    """(old recipe, recipe) -> the recipe with what the parts fill in from the data or the source run taken from
    the old run's: its vocabulary size and, for a stage from a source run, the model, data and objective sections
    (the source's) and the task's derived fields. What is left is the user's, comparable before any data work."""

    def fill(old: Recipe, recipe: Recipe) -> Recipe:
        recipe = dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, vocab_size=old.model.vocab_size))
        if kind not in NEEDS_SOURCE:
            return recipe
        task = dataclasses.replace(recipe.task, **{f: getattr(old.task, f) for f in TASK_RESOLVED})
        return dataclasses.replace(recipe, model=old.model, data=old.data, objective=old.objective, task=task)

    return fill


def early_checks(kind: str, recipe: Recipe, run_dir: Path) -> None:
    """The checks that need no data, before any data work or log line: the run directory holds no run of another
    recipe (checked again, whole, once the recipe is resolved), and the batch splits over the devices (the parts
    resolve no train or mesh field). (The recipe's values, a language model's row length against its objective
    included, were checked as it loaded: ssmlm.checks.)"""
    refuse_other_recipe(run_dir, recipe, as_resolved(kind))  # every process reads it: all stop together
    check_layout(recipe)


def shared_locations(run_dir: Path) -> None:
    """With several hosts, the local places every host reads what host 0 writes (the run directory's folder, the
    data cache) are probed before any work: a host's own disk there stops every host with one line."""
    if jax.process_count() == 1:
        return
    from ssmlm.data.preprocess import ssmlm_home

    if staging.url_of(run_dir) is None:  # a run in a bucket is shared by every host; its staging folder is not
        check_shared(Path(run_dir).parent, "the run directory's folder")
    check_shared(ssmlm_home(), "the data cache (SSMLM_HOME)")


def parts_for(kind: str, arch: str):
    """The parts module of ``kind`` of work on a model of ``arch`` (ssmlm.train.parts.*)."""
    from ssmlm.models import is_lm

    name = PARTS.get((kind, is_lm(arch)))
    if name is None:
        raise UserError(f"{kind} is for encoders; a language model ({arch}) is pretrained only")
    return importlib.import_module(f"ssmlm.train.parts.{name}")


def drive(
    kind: str,
    recipe: Recipe,
    run_dir: Path,
    quiet: bool = False,
    stop_after: int | None = None,
    hooks: list | None = None,
    init: str = "pretrained",
) -> dict[str, Any]:
    """Run ``kind`` (pretrain | extend-length | finetune) of ``recipe`` in ``run_dir``, resuming from its newest
    checkpoint; ``stop_after`` ends this invocation after that many more steps, with a checkpoint; ``init``
    'random' (finetune): the source's architecture at a fresh initialisation (seed train.seed)."""
    maybe_initialize_distributed()
    # finetuning follows the source run's family; pretraining and extend-length the recipe's (and an extended
    # source must be of a family that extends too)
    from ssmlm.train.trackers import check_available

    check_available(recipe.train.trackers)  # a tracker's missing package, before any data work
    own = None if kind == "finetune" else parts_for(kind, recipe.model.arch)
    early_checks(kind, recipe, run_dir)
    shared_locations(run_dir)
    lead = jax.process_index() == 0
    # one writer per run: a second start of it is refused before any data work (process 0 writes the run for all)
    lock = locked(staging.url_of(run_dir) or run_dir, "run", say=_say) if lead else contextlib.nullcontext()
    with removed_on_failure(run_dir), lock:
        source = source_run(recipe, kind, init, quiet)
        of_source = parts_for(kind, source.recipe.model.arch) if source is not None else None
        parts = own or of_source
        work = parts.prepare(recipe, kind, source, quiet)
        if init == "random":  # the manifest says so; the source named is the architecture's (None: the recipe's)
            work.info.update(init="random", source=staging.location(source.dir) if recipe.train.init_from else None)
        stage = work.stage
        stage.hooks = [*stage.hooks, *(hooks or [])]
        try:
            summary = _train(stage, work, run_dir, lead, quiet, stop_after)
        except (jax.errors.JaxRuntimeError, CheckpointWriteError) as e:
            # another host died: its collectives (a checkpoint's commit among them) fail here at once
            gone = lost(e) if jax.process_count() > 1 else None
            if gone is None:
                raise
            raise gone from None
        except Diverged as e:  # a failed run says so where a finished one keeps its numbers
            if lead and run_dir.is_dir():
                failed = {"kind": kind, "failed": f"diverged: {e}"}
                atomic_write(run_dir / "summary.json", json.dumps(failed, indent=2))
            raise
        if lead:
            summary.update(work.summary)
            if work.selection:
                summary["best_validation"] = best_validation(run_dir / "metrics.jsonl", work.selection)
            atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


def _train(stage, work, run_dir: Path, lead: bool, quiet: bool, stop_after: int | None) -> dict[str, Any]:
    """The run directory written (removed again by the caller if nothing was trained), then the loop."""
    if lead:
        prepare_run_dir(run_dir, work.recipe, work.info)
        shutil.copyfile(work.tokenizer, run_dir / "tokenizer.json")
        for name, text in work.files.items():
            atomic_write(run_dir / name, text)
        staging.sync(run_dir)  # a run in a bucket: there before the other hosts look
    barrier("run-dir", f"the run directory {staging.location(run_dir)} (written by host 0)")
    if not lead:
        staging.refresh(run_dir, "tokenizer.json")  # from the bucket, into this host's own staging folder
    stage.meta["tokenizer_sha256"] = sha256(run_dir / "tokenizer.json")
    return loop.run(stage, work.recipe, run_dir, quiet=quiet, stop_after=stop_after)


def _say(line: str) -> None:
    console.print(line, soft_wrap=True, markup=False)


def pretrain(recipe: Recipe, run_dir: Path, kind: str = "pretrain", **kw) -> dict[str, Any]:
    """`ssmlm pretrain` (kind 'pretrain') and `ssmlm extend-length` (kind 'extend-length')."""
    return drive(kind, recipe, run_dir, **kw)


def finetune(recipe: Recipe, run_dir: Path, **kw) -> dict[str, Any]:
    """`ssmlm finetune`: a task head on an encoder run, or prompt/response pairs on a language-model run
    (``init='random'``: the random-initialisation baseline, `ssmlm finetune --init random`)."""
    return drive("finetune", recipe, run_dir, **kw)
