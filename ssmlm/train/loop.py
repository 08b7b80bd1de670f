"""The one training loop, shared by pretrain, extend-length and finetune (and any objective).

A Stage says what differs between them (model, loss, batches, evaluation); this module owns everything
else: the jitted step, the learning-rate schedule, progress, the JSONL metrics log, evaluation (compiled once
per run), checkpointing and exact resume. Batch ``s`` is a pure function of (seed, s, controller state) and
dropout keys are fold_in(seed, s), so a resumed run takes exactly the steps an uninterrupted one would.

Extension points: ``Stage.hooks`` (objects with any of on_start / on_log / on_eval / on_checkpoint /
on_interrupt / on_end) see the run's events; ``Stage.controller`` may change what the batches are made of
while training runs (Birdie's objective mixture): its state is saved in every checkpoint and restored.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ssmlm.errors import Interrupted, UserError  # Interrupted stays importable from here
from ssmlm.progress import console, progress_bar
from ssmlm.recipe import Recipe
from ssmlm.runs.checkpoint import Checkpoints
from ssmlm.train.mesh import batch_sharding, check_batch, make_mesh, param_shardings, put_batch
from ssmlm.train.optim import make_optimizer, rule_records, rule_table


class Controller(Protocol):
    """Steers the batches while training runs. Its state is a pytree of arrays (saved in checkpoints)."""

    def init_state(self) -> Any: ...

    def update(self, state: Any, step: int, eval_metrics: dict[str, float]) -> Any:
        """The new state after the evaluation at ``step``; it applies from step + CONTROL_LAG on."""
        ...

    # optional: ``record(state) -> dict`` of JSON values, logged to metrics.jsonl (split "controller") for the
    # initial state and after every update


# An update made after step s applies to the batches of steps >= s + CONTROL_LAG. The lag is the prefetch
# depth, so batches already being read never change, and it is a constant, so a resumed run applies every
# update at the same step as an uninterrupted one.
PREFETCH_DEPTH = 2
CONTROL_LAG = PREFETCH_DEPTH


@dataclass
class Schedule:
    """The controller state in effect at each step: ``current`` up to ``pending_from`` - 1, then ``pending``."""

    current: Any
    pending: Any
    pending_from: int

    def at(self, step: int):
        return self.pending if step >= self.pending_from else self.current

    def advance(self, step: int) -> None:
        if step >= self.pending_from:
            self.current = self.pending

    def set(self, state, from_step: int) -> None:
        self.current, self.pending, self.pending_from = self.at(from_step - 1), state, from_step

    def to_tree(self) -> dict:
        start = np.asarray(self.pending_from, np.int64)
        return {"current": self.current, "pending": self.pending, "pending_from": start}

    @classmethod
    def from_tree(cls, tree: dict) -> Schedule:
        return cls(tree["current"], tree["pending"], int(tree["pending_from"]))


@dataclass
class Stage:
    kind: str  # pretrain | extend-length | finetune | evaluate
    model: nnx.Module
    loss_fn: Callable  # (model, batch, rng) -> (mean loss, aux dict of scalars; aux["weight"]: what it averaged over)
    batches: Callable  # (step, controller state or None) -> host Batch
    total_steps: int
    tokens_per_step: int  # slots per step (batch x length); tokens/s and MFU count only real (non-pad) tokens
    eval_fn: Callable | None = None  # (model, batch) -> dict of arrays
    eval_data: Callable[[], Iterable] | None = None  # () -> host Batches
    score: Callable[[list[dict], list], dict] | None = None  # (outputs, batches) -> metrics
    meta: dict = field(default_factory=dict)  # written into every checkpoint manifest
    eval_also_every: int = 0  # a second evaluation cadence (finetuning: every epoch end)
    hooks: list = field(default_factory=list)
    controller: Controller | None = None
    eval_at: Callable[[int], bool] | None = None  # more evaluation steps (Birdie's schedule: 10, 50, 250, …)
    predictions_per_row: int | None = None  # scored positions per row, for the FLOPs estimate


class MetricsLog:
    """Append-only JSONL; on resume, lines past the restored step are dropped so nothing repeats."""

    def __init__(self, path: Path, enabled: bool = True):
        self.path = path
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        if not self.enabled or not self.path.exists():
            return
        keep = [ln for ln in self.path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= step]
        self.path.write_text("".join(ln + "\n" for ln in keep))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def _due(step: int, every: int) -> bool:
    return bool(every) and step % every == 0


def _to_host(tree) -> dict:
    return {k: float(v) for k, v in jax.device_get(tree).items()}


def make_eval_step(eval_fn: Callable, graphdef):
    """The jitted evaluation step (params, batch) -> outputs. Build it once per run: every evaluation reuses
    the compiled function (evaluation batches all have one shape; the last one is padded)."""
    return jax.jit(lambda p, batch: eval_fn(nnx.merge(graphdef, p), batch))


def evaluate_stage(stage: Stage, params, graphdef, eval_step=None) -> dict[str, float]:
    """Run the stage's evaluation on the given parameters (with ``eval_step`` if compiled already)."""
    if stage.eval_fn is None or stage.eval_data is None:
        return {}
    eval_step = eval_step or make_eval_step(stage.eval_fn, graphdef)
    outputs, batches = [], []
    for batch in stage.eval_data():
        outputs.append(jax.device_get(eval_step(params, batch)))
        batches.append(batch)
    return stage.score(outputs, batches) if outputs else {}


def _call(hooks, event: str, *args) -> None:
    for h in hooks:
        fn = getattr(h, event, None)
        if fn is not None:
            fn(*args)


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation, graphdef, seed: int, shardings=None,
                    grad_accum: int = 1):  # fmt: skip
    """The jitted update: (params, opt_state, batch, step) -> (params, opt_state, metrics).

    Dropout keys are fold_in(seed, step), so a step's randomness does not depend on how it was reached.
    With ``grad_accum`` > 1 the batch is split into that many micro-batches whose gradients are averaged
    before one update (same result as the whole batch, less activation memory). A step whose loss or
    gradient is not finite changes nothing and reports ``skipped`` = 1.
    """
    base_key = jax.random.key(seed)

    def grads_of(params, batch, rng):
        def loss_of(p):
            return loss_fn(nnx.merge(graphdef, p), batch, rng)

        return jax.value_and_grad(loss_of, has_aux=True)(params)

    def train_step(params, opt_state, batch, step):
        rng = jax.random.fold_in(base_key, step)
        if grad_accum == 1:
            (loss, aux), grads = grads_of(params, batch, rng)
        else:
            micro = jax.tree.map(lambda x: x.reshape(grad_accum, x.shape[0] // grad_accum, *x.shape[1:]), batch)
            part = lambda i: grads_of(params, jax.tree.map(lambda x: x[i], micro), jax.random.fold_in(rng, i))  # noqa: E731

            def weighted(i):
                # Each micro-batch's loss is a mean over its own tokens; weighting by the token count
                # makes the accumulated update equal to the whole batch's.
                (loss, aux), grads = part(i)
                w = aux.get("weight", 1.0)
                return w, jax.tree.map(lambda x: x * w, (loss, aux, grads))

            def one(acc, i):
                return jax.tree.map(jnp.add, acc, weighted(i)), None

            (total_w, summed), _ = jax.lax.scan(one, weighted(0), jnp.arange(1, grad_accum))
            loss, aux, grads = jax.tree.map(lambda x: x / total_w, summed)
        aux = {k: v for k, v in aux.items() if k != "weight"}
        gnorm = optax.tree.norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        updates, new_opt = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)  # noqa: E731
        metrics = {"loss": jnp.where(ok, loss, 0.0), "grad_norm": jnp.where(ok, gnorm, 0.0),
                   "skipped": 1.0 - ok.astype(jnp.float32), **aux}  # fmt: skip
        return keep(new_params, params), keep(new_opt, opt_state), metrics

    if shardings is None:  # parameters and optimizer state are replaced every step: reuse their buffers
        return jax.jit(train_step, donate_argnums=(0, 1))
    p_sh, o_sh, b_sh = shardings
    return jax.jit(train_step, in_shardings=(p_sh, o_sh, b_sh, None), out_shardings=(p_sh, o_sh, None),
                   donate_argnums=(0, 1))  # fmt: skip


def run(
    stage: Stage, recipe: Recipe, run_dir: Path, quiet: bool = False, stop_after: int | None = None
) -> dict[str, Any]:
    """Train ``stage`` to its total steps, resuming from the run's newest checkpoint.

    ``stop_after`` ends this invocation after that many more steps, with a checkpoint (for job slots
    with a time limit); running again continues.
    """
    cfg = recipe.train
    lead = jax.process_index() == 0  # only one process writes logs and plots
    run_dir.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(run_dir / "metrics.jsonl", enabled=lead)
    hooks = [*stage.hooks]
    total = stage.total_steps
    tx, lr_fn, caught = make_optimizer(cfg, total, nnx.state(stage.model, nnx.Param), recipe.model)
    if lead and not quiet:
        console.print(rule_table(caught))  # what each parameter rule took: lr multiplier, decay, counts
    if cfg.batch_size % cfg.grad_accum:
        raise UserError(f"train.batch_size = {cfg.batch_size} is not divisible by train.grad_accum = {cfg.grad_accum}")

    mesh = make_mesh(recipe.mesh)
    check_batch(cfg.batch_size // cfg.grad_accum, mesh)
    graphdef, params = nnx.split(stage.model, nnx.Param)
    p_sh = param_shardings(params, mesh)
    o_sh = param_shardings(jax.eval_shape(tx.init, params), mesh)
    b_sh = batch_sharding(mesh)
    params = jax.device_put(params, p_sh)
    opt_state = jax.jit(tx.init, out_shardings=o_sh)(params)
    control = None
    if stage.controller is not None:
        first = stage.controller.init_state()
        control = Schedule(first, first, 0)
    ckpt = Checkpoints(run_dir, keep=cfg.keep_checkpoints, best=cfg.keep_best)
    start = 0
    last: dict[str, float] = {}  # the newest training metrics
    last_eval: dict[str, float] = {}  # the newest validation metrics, kept apart (both may hold "loss")
    # Abstract targets carry this run's shardings, so a checkpoint from another mesh reshards on load.
    target = lambda tree, sh: jax.tree.map(  # noqa: E731
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh
    )
    abstract_control = jax.eval_shape(lambda: control.to_tree()) if control is not None else None
    try:
        restored = ckpt.restore_newest(target(params, p_sh), target(opt_state, o_sh), abstract_control)
    except UserError:
        ckpt.close()
        raise
    latest = restored[0] if restored else None
    if restored:
        params, opt_state, meta, control_tree = restored[1]
        start = int(meta["step"])
        if control is not None:
            control = Schedule.from_tree(control_tree)
        last = {k: v for k, v in meta.get("metrics", {}).items() if isinstance(v, float)}
        last_eval = {k: v for k, v in meta.get("validation", {}).items() if isinstance(v, float)}
        log.truncate_after(start)
        console.print(
            f"[green]resuming[/] {run_dir} from step {start} (data position {meta['data_position']})", soft_wrap=True
        )

    stop = min(total, start + stop_after) if stop_after else total
    train_step = make_train_step(stage.loss_fn, tx, graphdef, cfg.seed, (p_sh, o_sh, b_sh), cfg.grad_accum)
    eval_step = make_eval_step(stage.eval_fn, graphdef) if stage.eval_fn is not None else None
    flops = stage_flops(stage, recipe)
    peak = peak_flops_per_second(cfg)
    manifest = {
        "recipe": recipe.to_dict(),
        "recipe_fingerprint": recipe.fingerprint("model", "data", "objective", "train", "task"),
        "total_steps": total,
        "kind": stage.kind,
        "param_rules": rule_records(caught),
        **stage.meta,
    }
    saved = {start} if latest is not None else set()

    def save(step: int, metrics: dict, eval_metrics: dict | None = None) -> None:
        if step in saved:  # e.g. a periodic save right before a stop at the same step
            return
        saved.add(step)
        meta = {
            "step": step,
            "data_position": step,
            "skipped_steps": skipped_total,
            **manifest,
            "metrics": metrics,
            "validation": eval_metrics or {},
        }
        ckpt.save(step, params, opt_state, meta, eval_metrics, control.to_tree() if control is not None else None)
        _call(hooks, "on_checkpoint", step)

    def evaluate(step: int) -> dict[str, float]:
        nonlocal control
        metrics = evaluate_stage(stage, params, graphdef, eval_step)
        if metrics:
            log.write({"step": step, "split": "validation", **metrics})
            _call(hooks, "on_eval", step, metrics)
            if control is not None and step < total:
                new = stage.controller.update(control.at(step), step, metrics)
                control.set(new, step + CONTROL_LAG)
                log_control(step, new, step + CONTROL_LAG)
        return metrics

    def log_control(step: int, state, applies_from: int) -> None:
        record = getattr(stage.controller, "record", None)
        if record is not None:
            log.write({"step": step, "split": "controller", "applies_from": applies_from, **record(state)})

    def batch_at(step: int):
        return stage.batches(step, control.at(step) if control is not None else None)

    summary: dict[str, Any] = {"kind": stage.kind, "start_step": start, "total_steps": total}
    eval_metrics: dict[str, float] = last_eval  # a finished run asked again reports its last evaluation
    step = start
    skipped_total = int(meta.get("skipped_steps", 0)) if latest is not None else 0
    t_start = time.time()
    if control is not None and latest is None:
        log_control(0, control.current, 0)
    _call(hooks, "on_start", start, total)
    # The prefetcher reads ahead with the schedule as it stands; updates only touch steps beyond its reach.
    prefetch = Prefetcher(batch_at, start, stop, PREFETCH_DEPTH)
    with progress_bar(quiet or not lead, "loss", "lr", "tok/s", "mfu") as bar, CtrlC() as ctrl_c:
        task = bar.add_task(stage.kind, total=total, completed=start, loss="-", lr="-", mfu="-", **{"tok/s": "-"})
        t_window, steps_window, window_sum, real_window = time.time(), 0, None, 0
        try:
            while step < stop:
                host_batch = prefetch.next(step)
                real_window += real_tokens(host_batch)
                batch = put_batch(host_batch, b_sh)
                params, opt_state, out = train_step(params, opt_state, batch, step)
                step += 1
                steps_window += 1
                if control is not None:
                    control.advance(step)
                # Sum on device (no host sync per step); log the mean over the window's good steps.
                window_sum = out if window_sum is None else jax.tree.map(jnp.add, window_sum, out)
                if step % cfg.log_every == 0 or step == stop:
                    sums = _to_host(window_sum)
                    skipped = int(round(sums.pop("skipped")))
                    skipped_total += skipped
                    good = max(steps_window - skipped, 1)
                    last = {k: v / good for k, v in sums.items()}
                    window_sum = None
                    now = time.time()
                    # Padding is not work: tokens/s (and MFU) count the real tokens of every process's rows.
                    real = real_window * jax.process_count()
                    tps = real / max(now - t_window, 1e-9)
                    fill = real / max(stage.tokens_per_step * steps_window, 1)
                    t_window, steps_window, real_window = now, 0, 0
                    lr = float(lr_fn(step - 1))
                    rec = {"step": step, "lr": lr, "tokens_per_s": round(tps, 1), "fill": round(fill, 4),
                           "time": round(now, 3), **last}  # fmt: skip
                    if skipped:
                        rec["skipped"] = skipped
                    mfu = tps * flops / peak if peak else None
                    if mfu is not None:
                        rec["mfu"] = float(f"{mfu:.4g}")
                    log.write(rec)
                    _call(hooks, "on_log", step, rec)
                    if skipped_total > cfg.max_skipped_steps:
                        raise UserError(
                            f"training diverged: {skipped_total} steps had a non-finite loss or gradient "
                            f"(limit train.max_skipped_steps = {cfg.max_skipped_steps}), the last by step {step}; "
                            "lower train.learning_rate or set train.grad_clip"
                        )
                    bar.update(task, loss=f"{last['loss']:.4f}", lr=f"{lr:.2e}", mfu=f"{mfu:.1%}" if mfu else "-",
                               **{"tok/s": f"{tps:,.0f}"})  # fmt: skip
                    if lead and not quiet and bar.disable and step % max(total // 10, cfg.log_every) == 0:
                        console.print(f"{stage.kind} step {step}/{total} loss {last['loss']:.4f} {tps:,.0f} tok/s")
                evaluated = False
                due = _due(step, cfg.eval_every) or _due(step, stage.eval_also_every)
                if (due or (stage.eval_at is not None and stage.eval_at(step))) and step < total:
                    eval_metrics = evaluate(step)
                    evaluated = bool(eval_metrics)
                periodic = cfg.checkpoint_every and step % cfg.checkpoint_every == 0
                if step < total and (periodic or (evaluated and cfg.keep_best)):
                    save(step, last, eval_metrics if evaluated else None)
                bar.update(task, completed=step)
                if ctrl_c.requested:  # stop between steps, never inside a save or an update
                    break
        except UserError:
            ckpt.close()
            raise
        except KeyboardInterrupt:  # a second Ctrl-C: leave now, the newest complete checkpoint stands
            _call(hooks, "on_interrupt", step)
            raise Interrupted(
                f"interrupted at step {step}/{total}; the newest complete checkpoint in {run_dir} is step "
                f"{ckpt.latest_step() or 0}; run the same command again to resume"
            ) from None
        finally:
            prefetch.close()

    if ctrl_c.requested and step < total:
        save(step, last)
        ckpt.close()
        _call(hooks, "on_interrupt", step)
        raise Interrupted(
            f"interrupted at step {step}/{total}; checkpoint saved in {run_dir}; run the same command again to resume"
        )

    if step < total:
        save(step, last)
        summary["stopped_early"] = True
    elif step > start or latest is None:
        eval_metrics = evaluate(step)
        save(step, last, eval_metrics or None)
    ckpt.close()
    summary.update(
        final_step=step,
        seconds=round(time.time() - t_start, 2),
        skipped_steps=skipped_total,
        train=last,
        validation=eval_metrics,
    )
    if ckpt.best_step() is not None:
        summary["best_checkpoint"] = ckpt.best_step()
    stage.model = nnx.merge(graphdef, params)
    _call(hooks, "on_end", summary)
    return summary


class CtrlC:
    """The first Ctrl-C only asks the loop to stop after the current step (it then saves a checkpoint);
    a KeyboardInterrupt raised at an arbitrary point could land inside an asynchronous checkpoint save
    or between a step and the assignment of its donated buffers. A second Ctrl-C interrupts at once."""

    def __enter__(self):
        self.requested = False
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


class Prefetcher:
    """Reads the next batches on a background thread while the device computes the current one.

    Batches are a pure function of the step, so prefetching never changes what is trained on.
    """

    def __init__(self, batches: Callable[[int], Any], start: int, stop: int, depth: int = PREFETCH_DEPTH):
        self.batches, self.stop = batches, stop
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending = {s: self.pool.submit(batches, s) for s in range(start, min(start + depth, stop))}
        self.depth = depth

    def next(self, step: int) -> dict:
        fut = self.pending.pop(step, None) or self.pool.submit(self.batches, step)
        ahead = step + self.depth
        if ahead < self.stop and ahead not in self.pending:
            self.pending[ahead] = self.pool.submit(self.batches, ahead)
        return fut.result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def real_tokens(batch) -> int:
    """Non-padding tokens of a host batch (segment id 0 is padding; weight-0 rows count none)."""
    return int((batch.segment_ids != 0).sum())


def stage_flops(stage: Stage, recipe: Recipe) -> float:
    """Training FLOPs per token of the stage's model (see ssmlm.models.flops)."""
    from ssmlm.models.flops import flops_per_token

    seq_len = stage.tokens_per_step // max(recipe.train.batch_size, 1)
    return flops_per_token(stage.model, recipe.model, seq_len, stage.predictions_per_row)


# Dense bf16 peak per device (FLOP/s), for the model-FLOPs utilisation estimate.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v3": 123e12, "TPU v4": 275e12,
              "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12}  # fmt: skip


def peak_flops_per_second(cfg) -> float | None:
    """train.peak_flops if set, else the known peak of this device kind times the device count."""
    if cfg.peak_flops:
        return cfg.peak_flops
    kind = jax.devices()[0].device_kind
    per = next((v for k, v in PEAK_FLOPS.items() if k.lower() in kind.lower()), None)
    return per * jax.device_count() if per else None
