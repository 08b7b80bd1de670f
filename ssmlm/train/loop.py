"""The one training loop, shared by pretrain, extend-length and finetune.

A Stage says what differs between them (model, loss, data, evaluation); this module owns everything
else: the jitted step, the learning-rate schedule, progress, the JSONL metrics log, evaluation,
checkpointing and exact resume. Batch ``s`` is a pure function of (seed, s) and dropout keys are
fold_in(seed, s), so a resumed run takes exactly the steps an uninterrupted one would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ssmlm.errors import UserError
from ssmlm.progress import console, progress_bar
from ssmlm.recipe import Recipe
from ssmlm.train.checkpoint import Checkpoints
from ssmlm.train.mesh import batch_sharding, check_batch, make_mesh, param_shardings, put_batch
from ssmlm.train.optim import make_optimizer


class Interrupted(UserError):
    """Ctrl-C during training: a checkpoint was written; re-running the command resumes."""


@dataclass
class Stage:
    kind: str  # pretrain | extend-length | finetune
    model: nnx.Module
    loss_fn: Callable  # (model, batch, rng) -> (loss, aux dict of scalars)
    batches: Callable[[int], dict]  # step -> host batch
    total_steps: int
    tokens_per_step: int
    eval_fn: Callable | None = None  # (model, batch) -> dict of arrays
    eval_data: Callable[[], Iterable[dict]] | None = None
    score: Callable[[list[dict], list[dict]], dict] | None = None  # (outputs, batches) -> metrics
    meta: dict = field(default_factory=dict)  # written into every checkpoint manifest


class MetricsLog:
    """Append-only JSONL; on resume, lines past the restored step are dropped so nothing repeats."""

    def __init__(self, path: Path):
        self.path = path

    def truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        keep = [ln for ln in self.path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
        self.path.write_text("".join(ln + "\n" for ln in keep))

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def _to_host(tree) -> dict:
    return {k: float(v) for k, v in jax.device_get(tree).items()}


def evaluate_stage(stage: Stage, params, graphdef) -> dict[str, float]:
    """Run the stage's evaluation on the given parameters."""
    if stage.eval_fn is None or stage.eval_data is None:
        return {}

    @jax.jit
    def eval_step(p, batch):
        return stage.eval_fn(nnx.merge(graphdef, p), batch)

    outputs, batches = [], []
    for batch in stage.eval_data():
        outputs.append(jax.device_get(eval_step(params, batch)))
        batches.append(batch)
    return stage.score(outputs, batches) if outputs else {}


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation, graphdef, seed: int, shardings=None):
    """The jitted update: (params, opt_state, batch, step) -> (params, opt_state, metrics).

    Dropout keys are fold_in(seed, step), so a step's randomness does not depend on how it was reached.
    """
    base_key = jax.random.key(seed)

    def train_step(params, opt_state, batch, step):
        rng = jax.random.fold_in(base_key, step)

        def loss_of(p):
            return loss_fn(nnx.merge(graphdef, p), batch, rng)

        (loss, aux), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return params, opt_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), **aux}

    if shardings is None:
        return jax.jit(train_step)
    p_sh, o_sh, b_sh = shardings
    return jax.jit(train_step, in_shardings=(p_sh, o_sh, b_sh, None), out_shardings=(p_sh, o_sh, None),
                   donate_argnums=(0, 1))  # fmt: skip


def run(stage: Stage, recipe: Recipe, run_dir: Path, quiet: bool = False, stop_after: int | None = None) -> dict[str, Any]:
    """Train ``stage`` to its total steps, resuming from the run's newest checkpoint.

    ``stop_after`` ends this invocation after that many more steps, with a checkpoint (for job slots
    with a time limit); running again continues.
    """
    cfg = recipe.train
    run_dir.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(run_dir / "metrics.jsonl")
    total = stage.total_steps
    tx, lr_fn = make_optimizer(cfg, total)

    mesh = make_mesh(recipe.mesh)
    check_batch(cfg.batch_size, mesh)
    graphdef, params = nnx.split(stage.model, nnx.Param)
    p_sh = param_shardings(params, mesh)
    o_sh = param_shardings(jax.eval_shape(tx.init, params), mesh)
    b_sh = batch_sharding(mesh)
    params = jax.device_put(params, p_sh)
    opt_state = jax.jit(tx.init, out_shardings=o_sh)(params)
    ckpt = Checkpoints(run_dir, keep=cfg.keep_checkpoints)
    start = 0
    last: dict[str, float] = {}
    latest = ckpt.latest_step()
    if latest is not None:
        # Abstract targets carry this run's shardings, so a checkpoint from another mesh reshards on load.
        target = lambda tree, sh: jax.tree.map(  # noqa: E731
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh
        )
        params, opt_state, meta = ckpt.restore(latest, target(params, p_sh), target(opt_state, o_sh))
        start = int(meta["step"])
        last = {k: v for k, v in meta.get("metrics", {}).items() if isinstance(v, float)}
        log.truncate_after(start)
        console.print(f"[green]resuming[/] {run_dir} from step {start} (data position {meta['data_position']})", soft_wrap=True)

    stop = min(total, start + stop_after) if stop_after else total
    train_step = make_train_step(stage.loss_fn, tx, graphdef, cfg.seed, (p_sh, o_sh, b_sh))

    saved = {start} if latest is not None else set()

    def save(step: int, metrics: dict) -> None:
        if step in saved:  # e.g. a periodic save right before a stop at the same step
            return
        saved.add(step)
        meta = {"step": step, "data_position": step, "total_steps": total, "kind": stage.kind, **stage.meta}
        ckpt.save(step, params, opt_state, {**meta, "metrics": metrics})

    summary: dict[str, Any] = {"kind": stage.kind, "start_step": start, "total_steps": total}
    eval_metrics: dict[str, float] = {}
    step = start
    t_start = time.time()
    with progress_bar(quiet, "loss", "lr", "tok/s") as bar:
        task = bar.add_task(stage.kind, total=total, completed=start, loss="-", lr="-", **{"tok/s": "-"})
        t_window, steps_window, window_sum = time.time(), 0, None
        try:
            while step < stop:
                batch = put_batch(stage.batches(step), b_sh)
                params, opt_state, out = train_step(params, opt_state, batch, step)
                step += 1
                steps_window += 1
                # Sum on device (no host sync per step); log the mean over the window.
                window_sum = out if window_sum is None else jax.tree.map(jnp.add, window_sum, out)
                if step % cfg.log_every == 0 or step == total:
                    last = {k: v / steps_window for k, v in _to_host(window_sum).items()}
                    window_sum = None
                    if not np.isfinite(last["loss"]):
                        raise UserError(
                            f"training diverged: loss is {last['loss']} at step {step}; "
                            "lower train.learning_rate or set train.grad_clip"
                        )
                    now = time.time()
                    tps = stage.tokens_per_step * steps_window / max(now - t_window, 1e-9)
                    t_window, steps_window = now, 0
                    lr = float(lr_fn(step - 1))
                    log.write({"step": step, "lr": lr, "tokens_per_s": round(tps, 1), "time": round(now, 3), **last})
                    bar.update(task, loss=f"{last['loss']:.4f}", lr=f"{lr:.2e}", **{"tok/s": f"{tps:,.0f}"})
                    if not quiet and bar.disable and step % max(total // 10, cfg.log_every) == 0:
                        console.print(f"{stage.kind} step {step}/{total} loss {last['loss']:.4f} {tps:,.0f} tok/s")
                if cfg.eval_every and step % cfg.eval_every == 0 and step < total:
                    eval_metrics = evaluate_stage(stage, params, graphdef)
                    if eval_metrics:
                        log.write({"step": step, "split": "validation", **eval_metrics})
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < total:
                    save(step, last)
                bar.update(task, completed=step)
        except KeyboardInterrupt:
            save(step, last)
            ckpt.close()
            raise Interrupted(
                f"interrupted at step {step}/{total}; checkpoint saved in {run_dir}; "
                "run the same command again to resume"
            ) from None

    if step < total:
        save(step, last)
        summary["stopped_early"] = True
    elif step > start or latest is None:
        eval_metrics = evaluate_stage(stage, params, graphdef)
        if eval_metrics:
            log.write({"step": step, "split": "validation", **eval_metrics})
        save(step, {**last, **eval_metrics})
    ckpt.close()
    summary.update(
        final_step=step,
        seconds=round(time.time() - t_start, 2),
        train=last,
        validation=eval_metrics,
    )
    stage.model = nnx.merge(graphdef, params)
    return summary


def cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Summed token cross-entropy and summed weights (the caller divides)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    return (nll * weights).sum(), weights.sum()
