"""The subcommands' stages: what pretrain, extend-length and finetune feed the one loop.

A run directory holds everything needed to continue from it or build on it:
  recipe.yaml     the resolved recipe (model.vocab_size filled in)
  run.json        kind, data directory, task, label names
  tokenizer.json  the tokenizer the run's ids refer to
  metrics.jsonl   one JSON object per log step / evaluation
  checkpoints/    Orbax checkpoints
  summary.json    written when the stage finishes
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from flax import nnx

from ssmlm.data.loader import ArrayTable, Batches, eval_batches, load_split
from ssmlm.data.preprocess import preprocess, read_metadata
from ssmlm.errors import CheckpointError, UserError
from ssmlm.models import ENCODERS, build_mlm, with_vocab
from ssmlm.models.layout import to_layout
from ssmlm.progress import console, progress_bar
from ssmlm.recipe import MeshConfig, Recipe, from_dict
from ssmlm.train import downstream, loop
from ssmlm.train.checkpoint import load_params
from ssmlm.train.mesh import barrier, check_batch, make_mesh, maybe_initialize_distributed

# ----------------------------------------------------------------------------- run directories


@dataclasses.dataclass
class Run:
    """A finished or running run directory, read back."""

    dir: Path
    recipe: Recipe
    info: dict

    @property
    def kind(self) -> str:
        return self.info["kind"]

    def tokenizer(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.dir / "tokenizer.json"))

    def abstract_model(self):
        cfg = self.recipe.model
        if self.kind == "finetune":
            head = downstream.HEADS[self.info.get("head", "classify")]
            return nnx.eval_shape(lambda: head.build(cfg, self.info["num_labels"]))
        return nnx.eval_shape(lambda: build_mlm(cfg))

    def load_model(self, step: int | None = None):
        abstract = self.abstract_model()
        graphdef, abs_params = nnx.split(abstract, nnx.Param)
        params, meta = load_params(self.dir, abs_params, step)
        return nnx.merge(graphdef, params), meta


def open_run(path: str | Path) -> Run:
    d = Path(path).expanduser()
    if not (d / "run.json").is_file() or not (d / "recipe.yaml").is_file():
        raise CheckpointError(f"{path}: not an ssmlm run directory (expected run.json and recipe.yaml)")
    try:
        raw = with_layout_of_older_runs(yaml.safe_load((d / "recipe.yaml").read_text()))
        recipe = from_dict(Recipe, raw, str(d / "recipe.yaml"))
        info = json.loads((d / "run.json").read_text())
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: damaged run directory: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    return Run(d, recipe, info)


# Model options added after runs were already being written, with the value that reproduces what such a
# run was trained as (a run's recipe.yaml lists every field of its time, so a missing key means "older").
OLDER_RUNS = {"final_norm": False, "mask_padding": False, "scan_layers": False}


def with_layout_of_older_runs(raw):
    if isinstance(raw, dict) and isinstance(raw.get("model"), dict):
        raw = {**raw, "model": {**OLDER_RUNS, **raw["model"]}}
    return raw


def prepare_run_dir(run_dir: Path, recipe: Recipe, info: dict) -> None:
    """Create the run directory, or check that an existing one was made by the same recipe."""
    rpath = run_dir / "recipe.yaml"
    if rpath.exists():
        old = from_dict(Recipe, with_layout_of_older_runs(yaml.safe_load(rpath.read_text())), str(rpath))
        # Stopping points and bookkeeping may change between attempts; what is trained may not.
        same = lambda r: dataclasses.replace(  # noqa: E731
            r,
            mesh=MeshConfig(),  # a run may move to another device layout
            train=dataclasses.replace(
                r.train, log_every=0, eval_every=0, checkpoint_every=0, keep_checkpoints=0, out_dir=""
            ),
        )
        if same(old) != same(recipe):
            raise UserError(
                f"{run_dir} already holds a run with a different recipe; pass --name to start a new run "
                f"(differences: {_diff(old.to_dict(), recipe.to_dict())})"
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    _atomic_write(rpath, recipe.to_yaml())
    _atomic_write(run_dir / "run.json", json.dumps(info, indent=2))


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


def check_layout(recipe: Recipe) -> None:
    """The batch splits over this machine's devices as the mesh asks (known only once jax sees the devices)."""
    check_batch(recipe.train.batch_size // recipe.train.grad_accum, make_mesh(recipe.mesh))


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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _process_shard() -> tuple[int, int]:
    """Each process reads only its own rows of every global batch."""
    return jax.process_index(), jax.process_count()


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# ----------------------------------------------------------------------------- weight transfer


def transplant(target: nnx.Module, source_params, position_init: str = "tile", extend=None) -> dict[str, int]:
    """Copy every source parameter whose path exists in ``target`` into it.

    Equal shapes are copied. A longer position table (extend-length) keeps the source rows and fills
    the new ones by tiling them (as Longformer does) or leaves them at their fresh initialisation.
    Parameters only in the target (a new head) keep their initialisation. ``extend(path, old, new_shape)``
    is the model family's hook for other length-dependent parameters (gMLP's spatial weights).
    """
    tgt_state = nnx.state(target, nnx.Param)
    src = dict(nnx.to_flat_state(to_layout(source_params, tgt_state)))  # unrolled ↔ scanned blocks
    report = {"copied": 0, "extended": 0, "fresh": 0}
    flat = []
    for path, var in nnx.to_flat_state(tgt_state):
        if path not in src:
            report["fresh"] += 1
            flat.append((path, var))
            continue
        new, old = var.get_value(), src[path].get_value()
        if new.shape == old.shape:
            value = old
            report["copied"] += 1
        elif path[-2:] == ("position", "embedding") and new.shape[0] > old.shape[0]:
            n_old = old.shape[0]
            if position_init == "tile":
                reps = -(-new.shape[0] // n_old)
                value = jnp.tile(old, (reps, 1))[: new.shape[0]]
            else:
                value = new.at[:n_old].set(old)
            report["extended"] += 1
        elif extend is not None and (grown := extend(path, old, new.shape)) is not None:
            value = grown
            report["extended"] += 1
        elif path[0] == "classifier":  # a new label space (e.g. MRPC from an MNLI run): fresh classifier
            report["fresh"] += 1
            flat.append((path, var))
            continue
        else:
            raise CheckpointError(
                f"cannot load parameter {'/'.join(map(str, path))}: checkpoint shape {old.shape}, model {new.shape}"
            )
        flat.append((path, var.replace(value)))
    nnx.update(target, nnx.from_flat_state(flat))
    return report


def extend_hook(arch: str):
    """The family's ``extend_params`` (length-dependent parameters other than the position table), if any."""
    module = importlib.import_module(ENCODERS[arch].split(":")[0])
    return getattr(module, "extend_params", None)


# ----------------------------------------------------------------------------- MLM (pretrain, extend-length)


def mlm_loss(model, batch, rng):
    positions = batch["masked_lm_positions"]
    weights = (positions > 0).astype(jnp.float32)
    logits = model(batch["input_ids"], positions=positions, rng=rng)
    nll, count = loop.cross_entropy(logits, batch["masked_lm_ids"], weights)
    return nll / jnp.maximum(count, 1.0), {"weight": jnp.maximum(count, 1.0)}


def mlm_eval(model, batch):
    positions = batch["masked_lm_positions"]
    weights = (positions > 0).astype(jnp.float32)
    logits = model(batch["input_ids"], positions=positions)
    nll, count = loop.cross_entropy(logits, batch["masked_lm_ids"], weights)
    correct = ((logits.argmax(-1) == batch["masked_lm_ids"]) * weights).sum()
    return {"nll": nll, "count": count, "correct": correct}


def mlm_score(outputs, _batches) -> dict[str, float]:
    nll = sum(float(o["nll"]) for o in outputs)
    count = sum(float(o["count"]) for o in outputs)
    loss = nll / max(count, 1.0)
    return {
        "mlm_loss": loss,
        "mlm_accuracy": sum(float(o["correct"]) for o in outputs) / max(count, 1.0),
        "perplexity": float(np.exp(min(loss, 50))),
        "masked_tokens": count,
    }


def mlm_eval_data(data_dir: Path, recipe: Recipe):
    meta = read_metadata(data_dir)
    if meta["splits"]["validation"]["sequences"] == 0:
        return None
    split = load_split(data_dir, "validation")
    L, P = meta["max_seq_length"], meta["max_predictions"]
    pad = {"input_ids": np.zeros(L, np.int32), "masked_lm_positions": np.zeros(P, np.int32),
           "masked_lm_ids": np.zeros(P, np.int32)}  # fmt: skip
    return lambda: eval_batches(split, recipe.train.batch_size, recipe.train.eval_batches, pad)


def pretrain(
    recipe: Recipe, run_dir: Path, kind: str = "pretrain", quiet: bool = False, stop_after: int | None = None
) -> dict[str, Any]:
    """MLM training; with ``kind='extend-length'`` it starts from ``train.init_from`` at a longer length."""
    source = None
    data_cfg = recipe.data
    if kind == "extend-length":
        if not recipe.train.init_from:
            raise UserError("extend-length needs a pretrained run: pass --from RUN_DIR (or set train.init_from)")
        source = open_run(recipe.train.init_from)
        if source.kind == "finetune":
            raise UserError(f"{source.dir}: is a finetuning run; extend-length starts from an MLM run")
        new_len = recipe.model.max_seq_length
        if new_len < source.recipe.model.max_seq_length:
            raise UserError(
                f"model.max_seq_length = {new_len}: must be at least the source run's "
                f"{source.recipe.model.max_seq_length}"
            )
        # The architecture is the source's; only the length changes. The ids must mean what they meant.
        recipe = dataclasses.replace(recipe, model=dataclasses.replace(source.recipe.model, max_seq_length=new_len))
        data_cfg = dataclasses.replace(data_cfg, tokenizer=str((source.dir / "tokenizer.json").resolve()))
        recipe = dataclasses.replace(recipe, data=data_cfg)
    maybe_initialize_distributed()
    seq_len = recipe.seq_len
    if seq_len > recipe.model.max_seq_length:
        raise UserError(f"data.max_seq_length = {seq_len} exceeds model.max_seq_length = {recipe.model.max_seq_length}")
    # Process 0 preprocesses; the others find its result in the shared cache.
    if jax.process_index() == 0:
        data_dir = preprocess(data_cfg, seq_len, quiet=quiet)
    barrier("preprocess")
    if jax.process_index() != 0:
        data_dir = preprocess(data_cfg, seq_len, quiet=True)
    meta = read_metadata(data_dir)
    recipe = dataclasses.replace(recipe, model=with_vocab(recipe.model, meta["vocab_size"]))

    # Everything that can fail on the data or the model is tried before the run directory is written.
    model = build_mlm(recipe.model, seed=recipe.train.seed)
    if source is not None:
        src_params, _ = load_params(source.dir, nnx.split(source.abstract_model(), nnx.Param)[1])
        report = transplant(model, src_params, recipe.train.position_init, extend_hook(recipe.model.arch))
        console.print(f"initialised from {source.dir}: {report}")
    batches = Batches(load_split(data_dir, "train"), recipe.train.batch_size, recipe.train.seed, _process_shard())
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
            loss_fn=mlm_loss,
            batches=batches,
            total_steps=recipe.train.steps,
            tokens_per_step=recipe.train.batch_size * seq_len,
            eval_fn=mlm_eval,
            eval_data=mlm_eval_data(data_dir, recipe),
            score=mlm_score,
            meta={
                "data_dir": str(data_dir),
                "data_fingerprint": meta["fingerprint"],
                "max_predictions": meta["max_predictions"],
                "fill_rate": meta.get("fill_rate"),  # real tokens / slots of the training rows
                "tokenizer_sha256": _sha256(run_dir / "tokenizer.json"),
                "steps_per_epoch": batches.steps_per_epoch,
            },  # fmt: skip
        )
        summary = loop.run(stage, recipe, run_dir, quiet=quiet, stop_after=stop_after)
    from ssmlm.analyze.plots import plot_metrics

    if jax.process_index() == 0:
        summary["loss_plot"] = str(plot_metrics(run_dir))
        summary["fill_rate"] = meta.get("fill_rate")
        _atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary


# ----------------------------------------------------------------------------- finetune


def task_eval_data(arrays: dict[str, np.ndarray], batch_size: int):
    pad = {k: np.zeros_like(v[0]) for k, v in arrays.items()}  # weight-0 rows fill the last batch
    return lambda: eval_batches(ArrayTable(arrays), batch_size, None, pad)


def finetune(recipe: Recipe, run_dir: Path, quiet: bool = False, stop_after: int | None = None) -> dict[str, Any]:
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
    prep = downstream.prepare(recipe.task, source.tokenizer(), max_len)
    td = prep.definition
    recipe = dataclasses.replace(
        recipe,
        model=dataclasses.replace(source.recipe.model, dropout=recipe.model.dropout),
        data=source.recipe.data,
        task=dataclasses.replace(recipe.task, max_seq_length=max_len, num_labels=td.num_labels,
                                 text_fields=list(td.text_fields), label_field=td.label_field),
    )  # fmt: skip
    info = {"kind": "finetune", "source": str(source.dir), "task": td.name, "head": td.head,
            "num_labels": td.num_labels, "label_names": prep.label_names, "metrics": list(td.metrics)}  # fmt: skip

    # Everything that can fail on the data or the model is tried before the run directory is written.
    head = downstream.HEADS[td.head]
    model = head.build(recipe.model, td.num_labels, recipe.train.seed)
    src_params, _ = load_params(source.dir, nnx.split(source.abstract_model(), nnx.Param)[1])
    report = transplant(model, src_params)
    console.print(f"initialised from {source.dir}: {report}")
    arrays = prep.arrays
    batches = Batches(ArrayTable(arrays["train"]), recipe.train.batch_size, recipe.train.seed, _process_shard())
    epochs = recipe.train.epochs
    total = int(batches.steps_per_epoch * epochs) if epochs else recipe.train.steps
    if total < 1:
        raise UserError(
            f"train.epochs = {epochs}: gives no training step ({batches.steps_per_epoch} steps per epoch "
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
            batches=batches,
            total_steps=total,
            tokens_per_step=recipe.train.batch_size * max_len,
            eval_fn=head.eval,
            eval_data=task_eval_data(arrays["validation"], recipe.train.batch_size) if has_val else None,
            score=prep.scorers.get("validation"),
            meta={
                "task": td.name,
                "tokenizer_sha256": _sha256(run_dir / "tokenizer.json"),
                "steps_per_epoch": batches.steps_per_epoch,
            },  # fmt: skip
            eval_also_every=batches.steps_per_epoch if epochs else 0,  # every N steps and at every epoch end
        )
        summary = loop.run(stage, recipe, run_dir, quiet=quiet, stop_after=stop_after)
    if jax.process_index() == 0:
        summary["best_validation"] = best_validation(run_dir / "metrics.jsonl", td.selection)
        _atomic_write(run_dir / "summary.json", json.dumps(summary, indent=2))
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


# ----------------------------------------------------------------------------- evaluate


def evaluate(
    run: Run, recipe_task=None, split: str = "validation", batch_size: int = 32, submission: Path | None = None
) -> dict[str, Any]:
    """Metrics of a run's newest checkpoint: MLM on its held-out data, or its finetuning task.

    With ``submission``, the split's predictions are also written in the GLUE leaderboard format.
    """
    model, meta = run.load_model()
    graphdef, params = nnx.split(model, nnx.Param)
    result = {"run": str(run.dir), "arch": run.recipe.model.arch, "split": split, "step": meta["step"]}
    if run.kind == "finetune":
        base = run.recipe.task
        task = recipe_task or base
        if task.name and task.name != base.name:
            raise UserError(f"{run.dir} was finetuned on '{run.info['task']}', not '{task.name}'")
        task = dataclasses.replace(task, max_seq_length=base.max_seq_length)
        prep = downstream.prepare(task, run.tokenizer(), task.max_seq_length)
        if split not in prep.arrays:
            raise UserError(f"task {prep.definition.name} has no '{split}' split (has {list(prep.arrays)})")
        head = downstream.HEADS[run.info.get("head", "classify")]
        eval_data = task_eval_data(prep.arrays[split], batch_size)
        stage = loop.Stage("evaluate", model, None, None, 0, 0, head.eval, eval_data, prep.scorers[split])
        result["task"] = prep.definition.name
        if submission is not None:
            stage.score = lambda outs, batches: {"_predictions": downstream.predictions(outs, batches)}
            preds = loop.evaluate_stage(stage, params, graphdef)["_predictions"]
            from ssmlm.data.glue import write_glue_submission

            name = prep.definition.name
            name = "mnli-mm" if name == "mnli" and split.endswith("mismatched") else name
            path = write_glue_submission(name, preds.tolist(), submission, label_names=run.info.get("label_names"))
            result["submission"] = str(path)
            stage.score = prep.scorers[split]
    else:
        if recipe_task is not None and recipe_task.name:
            raise UserError(f"{run.dir} is a pretraining run; finetune it on '{recipe_task.name}' first")
        if not run.info.get("data_dir"):
            raise UserError(
                f"{run.dir}: has no MLM data of its own (imported from {run.info.get('source')}); "
                "finetune it or evaluate a task"
            )
        data_dir = Path(run.info["data_dir"])
        train = dataclasses.replace(run.recipe.train, batch_size=batch_size, eval_batches=0)
        ev = mlm_eval_data(data_dir, dataclasses.replace(run.recipe, train=train))
        if ev is None:
            raise UserError(f"{data_dir}: has no validation sequences to evaluate on")
        stage = loop.Stage("evaluate", model, None, None, 0, 0, mlm_eval, ev, mlm_score)
        result["task"] = "mlm"
    data = stage.eval_data

    def with_progress():
        with progress_bar(False) as bar:
            task = bar.add_task(f"evaluating {result['task']}", total=None)
            for batch in data():
                yield batch
                bar.advance(task)

    stage.eval_data = with_progress
    result["metrics"] = loop.evaluate_stage(stage, params, graphdef)
    return result
