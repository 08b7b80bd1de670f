"""Run directories: what a stage writes, and reading it back.

A run directory holds everything needed to continue from it or build on it:
  recipe.yaml     the resolved recipe (model.vocab_size filled in)
  run.json        kind, data directory, task, label names
  tokenizer.json  the tokenizer the run's ids refer to
  metrics.jsonl   one JSON object per log step / evaluation / controller update, cut back to the restored
                  step on every start
  checkpoints/    Orbax checkpoints with their manifests (ssmlm.runs.checkpoint)
  launches.json   every start of the run: its first and last step, the seconds it trained
  summary.json    written when the stage finishes (launches and seconds_total: all its starts)
  tensorboard/, wandb/   with train.trackers (ssmlm.train.trackers)

This package sits below ssmlm.train (the loop writes through it) and above models, data and objectives
(it rebuilds a run's model). It never imports train, analyze or cli.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import jax
import yaml
from flax import nnx

from ssmlm import staging
from ssmlm.errors import CheckpointError, UserError
from ssmlm.models import build_pretraining_model, flops
from ssmlm.models.config import FAMILIES, ModelConfig, fields_of
from ssmlm.objectives.tasks import HEADS
from ssmlm.recipe import MeshConfig, Recipe, from_dict
from ssmlm.runs.checkpoint import load_params


@dataclasses.dataclass
class Run:
    """A finished or running run directory, read back."""

    dir: Path
    recipe: Recipe
    info: dict

    @property
    def kind(self) -> str:
        return self.info["kind"]

    @property
    def random_init(self) -> bool:
        """Finetuned from random weights (`finetune --init random`): its ``source`` gave the architecture only."""
        return self.info.get("init") == "random"

    @property
    def weights_from(self) -> str | None:
        """The run whose weights this one started from, as run.json names it; None for a pretraining run and
        for a random initialisation (whose ``source`` is only the architecture's)."""
        return None if self.random_init else self.info.get("source")

    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.dir / "tokenizer.json"))

    def abstract_model(self):
        cfg = self.recipe.model
        if self.kind == "finetune" and self.info.get("head") != "lm":  # a finetuned LM is still a whole LM
            head = HEADS[self.info.get("head", "classify")]
            return flops.abstract(lambda: head.build(cfg, self.info["num_labels"]))
        return flops.abstract(lambda: build_pretraining_model(cfg))

    def load_model(self, step: int | None = None):
        abstract = self.abstract_model()
        graphdef, abs_params = nnx.split(abstract, nnx.Param)
        params, meta = load_params(self.dir, abs_params, step)
        return nnx.merge(graphdef, params), meta


def random_init_text(source: str | Path | None) -> str:
    """How a report names a `--init random` run's start: no weights, only an architecture (the source run's)."""
    return f"random initialisation (the architecture of {Path(source).name})" if source else "random initialisation"


def open_run(path: str | Path) -> Run:
    """A run directory, or a run in a bucket (gs://…: its records read from a local copy, its checkpoints
    from the bucket)."""
    d = staging.records(path)
    if not (d / "run.json").is_file() or not (d / "recipe.yaml").is_file():
        raise CheckpointError(f"{path}: not an ssmlm run directory (expected run.json and recipe.yaml)")
    for name in ("recipe.yaml", "run.json"):  # each one's damage named with its file
        try:
            text = (d / name).read_text()
            if name == "recipe.yaml":
                recipe = from_dict(Recipe, with_layout_of_older_runs(yaml.safe_load(text)), str(d / name))
            else:
                info = json.loads(text)
        except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
            why = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            raise CheckpointError(f"{d / name}: damaged run directory: {why}") from None
    check_info(d / "run.json", info)
    return Run(d, recipe, info)


def check_info(path: Path, info) -> None:
    """The run.json keys the commands that open a run rely on, so that a hand-edited or damaged one is one line
    naming the file rather than a KeyError deep inside a command."""
    bad = lambda what: CheckpointError(f"{path}: damaged run directory: {what}")  # noqa: E731
    if not isinstance(info, dict):
        raise bad(f"expected a JSON object, got {type(info).__name__}")
    if not isinstance(info.get("kind"), str) or not info["kind"]:
        raise bad(f"kind is {info.get('kind')!r}: expected the stage that wrote it, e.g. 'pretrain' or 'finetune'")
    if info["kind"] == "finetune":
        for key in ("source", "task"):
            if key not in info:
                raise bad(f"{key} is missing: a finetuned run names its source run and task")
        if info.get("head") != "lm" and not (isinstance(info.get("num_labels"), int) and info["num_labels"] > 0):
            raise bad(f"num_labels is {info.get('num_labels')!r}: expected a positive whole number")


# Model options added after runs were already being written, with the value that reproduces what such a
# run was trained as (a run's recipe.yaml lists every field of its time, so a missing key means "older").
OLDER_RUNS = {"final_norm": False, "mask_padding": False, "scan_layers": False}


def with_layout_of_older_runs(raw):
    """A run's saved recipe as today's loader reads it: options added since take the value the run was
    trained with; a flat model section (every family's fields, before `model.arch` chose a family config)
    keeps its family's fields; masking settings move from `data:` to `objective:`."""
    if not isinstance(raw, dict):
        return raw
    raw = dict(raw)
    model = raw.get("model")
    if isinstance(model, dict):
        model = {**OLDER_RUNS, **model}
        arch = model.get("arch", ModelConfig.arch)
        if arch in FAMILIES:
            model = {k: v for k, v in model.items() if k in fields_of(arch)}
        raw["model"] = model
    data = raw.get("data")
    if isinstance(data, dict) and "objective" not in raw:
        moved = {k: data[k] for k in ("masked_lm_prob", "max_predictions", "duplicate_factor") if k in data}
        raw["data"] = {k: v for k, v in data.items() if k not in moved}
        raw["objective"] = moved
    return raw


def refuse_other_recipe(run_dir: Path, recipe: Recipe, as_resolved=None) -> None:
    """Raise if ``run_dir`` already holds a run of a different recipe. ``as_resolved(old, recipe)``: the recipe
    as it will be once resolved, for a check made before the data and the source run are read (the driver's
    early check takes what they would fill in from the old run)."""
    rpath = run_dir / "recipe.yaml"
    if not rpath.exists():
        return
    old = from_dict(Recipe, with_layout_of_older_runs(yaml.safe_load(rpath.read_text())), str(rpath))
    if as_resolved is not None:
        recipe = as_resolved(old, recipe)
    # Stopping points and bookkeeping may change between attempts; what is trained may not.
    same = lambda r: dataclasses.replace(  # noqa: E731
        r,
        mesh=MeshConfig(),  # a run may move to another device layout
        train=dataclasses.replace(
            r.train,
            log_every=0,
            eval_every=0,
            checkpoint_every=0,
            keep_checkpoints=0,
            keep_steps=[],
            out_dir="",
            trackers=[],
            # how many skipped steps stop a run: a stricter or looser guard on a resumed run trains the same
            max_skipped_steps=0,
            max_skipped_in_a_row=1,
            max_skipped_share=0.0,
        ),
    )
    if same(old) != same(recipe):
        raise UserError(
            f"{run_dir} already holds a run with a different recipe; pass --name to start a new run "
            f"(differences: {_diff(old.to_dict(), recipe.to_dict())})"
        )


def prepare_run_dir(run_dir: Path, recipe: Recipe, info: dict) -> None:
    """Create the run directory, or check that an existing one was made by the same recipe."""
    refuse_other_recipe(run_dir, recipe)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(run_dir / "recipe.yaml", recipe.to_yaml())
    atomic_write(run_dir / "run.json", json.dumps(info, indent=2))


@contextlib.contextmanager
def removed_on_failure(run_dir: Path):
    """If this invocation creates ``run_dir`` and then fails before training produced anything (a checkpoint
    or a line of metrics), remove what it created: a half-made run would make the corrected command be
    refused as 'a different recipe'. A run that trained and then failed (diverged) keeps its log."""
    created = None
    for p in (run_dir, *run_dir.parents):  # the outermost folder that does not exist yet
        if p.exists():
            break
        created = p
    try:
        yield
    except BaseException:
        if created is not None and jax.process_index() == 0 and not trained_anything(run_dir):
            shutil.rmtree(created, ignore_errors=True)
        raise


def trained_anything(run_dir: Path) -> bool:
    d = run_dir / "checkpoints"
    has_checkpoint = d.is_dir() and any(p.name.isdigit() for p in d.iterdir())
    return has_checkpoint or (run_dir / "metrics.jsonl").exists()


def _diff(a: dict, b: dict, prefix: str = "") -> str:
    out = []
    for k in sorted(set(a) | set(b)):
        if isinstance(a.get(k), dict) and isinstance(b.get(k), dict):
            d = _diff(a[k], b[k], f"{prefix}{k}.")
            if d:
                out.append(d)
        elif a.get(k) != b.get(k):
            out.append(f"{prefix}{k}: {a.get(k)!r} -> {b.get(k)!r}")
    return ", ".join(out)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
