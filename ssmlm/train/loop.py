"""The one training loop, shared by pretrain, extend-length and finetune (and any objective).

A Stage says what differs between them (model, loss, batches, evaluation); this module owns the rest of a run's
training: the jitted step, the run's state (TrainState) and what stays fixed (RunContext), setup, exact resume and
the ending. Batch ``s`` is a pure function of (seed, s, controller state) and dropout keys are fold_in(seed, s), so
a resumed run takes exactly the steps an uninterrupted one would.

``run`` is setup (a RunContext of what stays fixed, a TrainState of what changes, restored from the newest
checkpoint), the step loop and the ending. After every step the default hooks of ssmlm.train.hooks run in
order: metrics log, divergence guard, progress, evaluation (and the controller's update), checkpointing.
Evaluation goes through the one evaluation step and loop of ssmlm.evaluate.runner, its step compiled once per run.

Beside the loop: ssmlm.train.logs (metrics.jsonl, cut back to the restored checkpoint's step on every start so no
row is ever repeated; launches.json, the run's starts and the seconds each trained), ssmlm.train.control (when a
controller's updates apply) and ssmlm.train.threads (Ctrl-C, worker threads, the batch prefetcher).

Ctrl-C: the loop stops after the current step and saves the checkpoint to resume from. Work it can drop and
redo (an evaluation with the controller's update, the first step of a start, which compiles) runs on a worker
thread that the loop stops waiting for at once; a checkpoint saved in the middle of an evaluation says so, and
the resumed run evaluates that step again first.

Extension points: ``Stage.hooks`` (objects with any of on_start / on_record / on_log / on_eval / on_checkpoint /
on_interrupt / on_end) see the run's events (on_record: every row written to metrics.jsonl; the trackers of
``train.trackers``, ssmlm.train.trackers, are such hooks); ``Stage.controller`` may change what the batches are
made of while training runs (Birdie's objective mixture): its state is saved in every checkpoint and restored.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import jax
import optax
from flax import nnx

from ssmlm import staging
from ssmlm.errors import Interrupted, UserError  # Interrupted stays importable from here
from ssmlm.evaluate.runner import make_eval_step, run_eval
from ssmlm.models.flops import peak_flops_per_second
from ssmlm.progress import console, progress_bar
from ssmlm.recipe import Recipe
from ssmlm.runs.checkpoint import Checkpoints
from ssmlm.train.control import CONTROL_LAG, Controller, ControllerTimeline
from ssmlm.train.hooks import (
    Checkpointing,
    DivergenceGuard,
    Evaluation,
    Hook,
    LogLine,
    MetricsLogger,
    Progress,
    Stopped,
    emit,
    log_control,
)
from ssmlm.train.logs import Launches, MetricsLog
from ssmlm.train.mesh import check_batch, make_mesh, put_batch
from ssmlm.train.optim import Optimizer, make_optimizer, rule_records, rule_table
from ssmlm.train.step import make_train_step, step_shardings
from ssmlm.train.threads import PREFETCH_DEPTH, CtrlC, Prefetcher, interruptibly

UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}  # write failures the user can fix


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


@dataclass
class TrainState:
    """Everything that changes while a run trains. The hooks (ssmlm.train.hooks) read and update it."""

    params: Any
    opt_state: Any
    control: ControllerTimeline | None = None  # the controller state in effect at each step (None: no controller)
    step: int = 0  # steps done
    start: int = 0  # the step this invocation started from (the restored checkpoint's, else 0)
    stop: int = 0  # the step this invocation ends at: the total, or sooner with stop_after
    resumed: bool = False  # restored from a checkpoint
    skipped_total: int = 0  # steps skipped for a non-finite loss or gradient, over the whole run
    last: dict[str, float] = field(default_factory=dict)  # the newest training metrics
    eval_metrics: dict[str, float] = field(default_factory=dict)  # the newest validation metrics (kept apart)
    fresh_eval: dict[str, float] | None = None  # the metrics of an evaluation after the newest step, if any
    saved: set[int] = field(default_factory=set)  # steps this invocation saved (or restored)
    outputs: Any = None  # the newest step's metrics, on device
    tokens: int = 0  # the newest step's real (non-pad) tokens on this process
    log_line: LogLine | None = None  # what the newest step logged, when it was a logging step
    eval_pending: bool = False  # a Ctrl-C cut this step's evaluation short: it is done again on resume

    def control_at(self, step: int):
        return self.control.at(step) if self.control is not None else None


@dataclass
class RunContext:
    """Everything fixed while a run trains."""

    stage: Stage
    recipe: Recipe
    run_dir: Path
    quiet: bool
    lead: bool  # only one process writes logs and plots
    hooks: list  # the stage's (user) hooks
    log: MetricsLog
    optimizer: Optimizer
    graphdef: Any
    shardings: tuple  # (parameters, optimizer state, batch)
    ckpt: Checkpoints
    manifest: dict  # written into every checkpoint's meta

    @property
    def cfg(self):
        return self.recipe.train

    @property
    def where(self) -> str:
        """The run as a person names it: its bucket URL when its records are staged in a local folder."""
        return staging.location(self.run_dir)

    @property
    def total(self) -> int:
        return self.stage.total_steps


def run(
    stage: Stage, recipe: Recipe, run_dir: Path, quiet: bool = False, stop_after: int | None = None
) -> dict[str, Any]:
    """Train ``stage`` to its total steps, resuming from the run's newest checkpoint.

    ``stop_after`` ends this invocation after that many more steps, with a checkpoint (for job slots
    with a time limit); running again continues.
    """
    ctx, state = _setup(stage, recipe, run_dir, quiet)
    _restore(ctx, state)
    state.stop = min(ctx.total, state.start + stop_after) if stop_after else ctx.total
    launch = Launches(run_dir / "launches.json", state.start, enabled=ctx.lead)
    trackers = _trackers(ctx, state)
    try:
        with progress_bar(quiet or not ctx.lead, "loss", "lr", "tok/s", "mfu") as bar, CtrlC() as ctrl_c:
            task = bar.add_task(
                stage.kind, total=ctx.total, completed=state.start, loss="-", lr="-", mfu="-", **{"tok/s": "-"}
            )
            defaults = _default_hooks(ctx, bar, task, ctrl_c)
            _train(ctx, state, defaults, launch, ctrl_c)
            if ctrl_c.requested and state.step < ctx.total:
                _interrupted(ctx, state, defaults)
            summary = _finish(ctx, state, defaults, launch, ctrl_c)
            if state.eval_pending:  # a Ctrl-C during the final evaluation: the checkpoint is saved, the rest waits
                _interrupted(ctx, state, [])
    except OSError as e:  # a log or record that could not be written (a full disk, a lost permission)
        if e.errno not in UNWRITABLE:
            raise
        with contextlib.suppress(Exception):
            ctx.ckpt.close()
        kept = ctx.ckpt.committed_steps()
        newest = f"the newest complete checkpoint, step {kept[-1]}, is kept" if kept else "no checkpoint was kept"
        raise UserError(
            f"cannot write '{e.filename}': {e.strerror}; {newest}; free space (or fix the permissions) and run "
            "the same command again to resume"
        ) from None
    finally:
        with contextlib.suppress(OSError):  # a full disk: reported once, above
            launch.end(state.step)
        for tracker in trackers:  # flushed and closed however the run ends
            tracker.close()
    return summary


def _train(ctx: RunContext, state: TrainState, defaults: list[Hook], launch: Launches, ctrl_c: CtrlC) -> None:
    """Steps up to ``state.stop`` (or a Ctrl-C), each followed by the default hooks (the bar's among them)."""
    stage, cfg = ctx.stage, ctx.cfg
    train_step = make_train_step(stage.loss_fn, ctx.optimizer.tx, ctx.graphdef, cfg.seed, ctx.shardings, cfg.grad_accum)
    if state.control is not None and not state.resumed:
        log_control(ctx, 0, state.control.current, 0)
    emit(ctx.hooks, "on_start", state.start, ctx.total)
    evaluation = next(h for h in defaults if isinstance(h, Evaluation))
    progress = next(h for h in defaults if isinstance(h, Progress))
    if state.eval_pending and state.step < ctx.total:  # the evaluation a Ctrl-C cut short, before training goes on
        evaluation.after_step(state)
        state.eval_pending = state.eval_pending and ctrl_c.requested  # (done, or no longer due: eval_every changed)
    # The prefetcher reads ahead with the schedule as it stands; updates only touch steps beyond its reach.
    prefetch = Prefetcher(lambda s: stage.batches(s, state.control_at(s)), state.start, state.stop, PREFETCH_DEPTH)
    try:
        while state.step < state.stop and not ctrl_c.requested:  # stop between steps, never inside a save
            if state.step == state.start:  # compiles: a Ctrl-C need not wait for it, nothing is trained yet
                with progress.phase("compiling the training step"):
                    interruptibly(lambda: _train_one(ctx, state, prefetch, train_step), ctrl_c)
            else:
                _train_one(ctx, state, prefetch, train_step)
            for hook in defaults:
                hook.after_step(state)
            launch.update(state.step)
            ctrl_c.at_step(state.step)
    except UserError:
        ctx.ckpt.close(wait=jax.process_count() == 1)  # several hosts: one may be gone, and its barrier never met
        raise
    except Exception:  # a collective failed (another host died): leave the save in flight, as above
        if jax.process_count() > 1:
            ctx.ckpt.close(wait=False)
        raise
    except Stopped:  # during the first step: nothing to save
        ctx.ckpt.close()
        emit(ctx.hooks, "on_interrupt", state.step)
        raise Interrupted(
            f"stopped before step {state.start + 1}/{ctx.total} finished, with nothing new to save; "
            "run the same command again to resume"
        ) from None
    except KeyboardInterrupt:  # a second Ctrl-C: leave now, the newest complete checkpoint stands
        emit(ctx.hooks, "on_interrupt", state.step)
        raise Interrupted(
            f"stopped at step {state.step}/{ctx.total}; the newest complete checkpoint in {ctx.where} is step "
            f"{ctx.ckpt.latest_step() or 0}; run the same command again to resume"
        ) from None
    finally:
        prefetch.close()


def _setup(stage: Stage, recipe: Recipe, run_dir: Path, quiet: bool) -> tuple[RunContext, TrainState]:
    """What stays fixed for the run, and the state of a fresh start (on the mesh, not yet restored)."""
    lead = jax.process_index() == 0
    run_dir.mkdir(parents=True, exist_ok=True)
    hooks = [*stage.hooks]
    log = MetricsLog(run_dir / "metrics.jsonl", enabled=lead, listeners=hooks)
    optimizer = _optimizer(stage, recipe, show_rules=lead and not quiet)
    graphdef, params, opt_state, shardings = _place(stage.model, optimizer.tx, recipe)
    control = None
    if stage.controller is not None:
        first = stage.controller.init_state()
        control = ControllerTimeline(first, first, 0)
    cfg = recipe.train
    ckpt = Checkpoints(run_dir, keep=cfg.keep_checkpoints, best=cfg.keep_best, kept_steps=cfg.keep_steps)
    manifest = {
        "recipe": recipe.to_dict(),
        "recipe_fingerprint": recipe.fingerprint("model", "data", "objective", "train", "task"),
        "total_steps": stage.total_steps,
        "kind": stage.kind,
        "param_rules": rule_records(optimizer.caught),
        **stage.meta,
    }
    ctx = RunContext(stage, recipe, run_dir, quiet, lead, hooks, log, optimizer, graphdef, shardings, ckpt, manifest)
    return ctx, TrainState(params, opt_state, control)


def _optimizer(stage: Stage, recipe: Recipe, show_rules: bool) -> Optimizer:
    cfg = recipe.train
    optimizer = make_optimizer(cfg, stage.total_steps, nnx.state(stage.model, nnx.Param), recipe.model)
    if show_rules:
        console.print(rule_table(optimizer.caught))  # what each parameter rule took: lr multiplier, decay, counts
    if cfg.batch_size % cfg.grad_accum:
        raise UserError(f"train.batch_size = {cfg.batch_size} is not divisible by train.grad_accum = {cfg.grad_accum}")
    return optimizer


def _place(model: nnx.Module, tx: optax.GradientTransformation, recipe: Recipe):
    """(graphdef, parameters, a fresh optimizer state, their shardings and the batch's) on the recipe's mesh over
    this machine's devices (the shardings are ssmlm.train.step's, which `--dry-run --target` compiles with)."""
    cfg = recipe.train
    mesh = make_mesh(recipe.mesh)
    check_batch(cfg.batch_size, mesh, grad_accum=cfg.grad_accum)
    graphdef, params = nnx.split(model, nnx.Param)
    p_sh, o_sh, b_sh = step_shardings(params, tx, mesh)
    params = jax.device_put(params, p_sh)
    opt_state = jax.jit(tx.init, out_shardings=o_sh)(params)
    return graphdef, params, opt_state, (p_sh, o_sh, b_sh)


def _restore(ctx: RunContext, state: TrainState) -> None:
    """Continue ``state`` from the run's newest checkpoint, when it has one."""
    p_sh, o_sh, _ = ctx.shardings
    # Abstract targets carry this run's shardings, so a checkpoint from another mesh reshards on load.
    target = lambda tree, sh: jax.tree.map(  # noqa: E731
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh
    )
    abstract_control = jax.eval_shape(lambda: state.control.to_tree()) if state.control is not None else None
    try:
        restored = ctx.ckpt.restore_newest(target(state.params, p_sh), target(state.opt_state, o_sh), abstract_control)
    except UserError:
        ctx.ckpt.close()
        raise
    if not restored:
        ctx.log.restart(None)  # rows of a start killed before its first checkpoint: all of it is trained again
        return
    state.params, state.opt_state, meta, control_tree = restored[1]
    state.step = state.start = int(meta["step"])
    state.resumed, state.saved = True, {state.start}
    state.skipped_total = int(meta.get("skipped_steps", 0))
    if state.control is not None:
        state.control = ControllerTimeline.from_tree(control_tree)
    state.last = {k: v for k, v in meta.get("metrics", {}).items() if isinstance(v, float)}
    state.eval_metrics = {k: v for k, v in meta.get("validation", {}).items() if isinstance(v, float)}
    state.eval_pending = bool(meta.get("evaluation_pending", False))
    ctx.log.restart(state.start)
    console.print(
        f"[green]resuming[/] {ctx.where} from step {state.start} (data position {meta['data_position']})",
        soft_wrap=True,
    )


def _default_hooks(ctx: RunContext, bar, task, ctrl_c: CtrlC | None = None) -> list[Hook]:
    """The loop's own behaviours, in the order they run after every step (see ssmlm.train.hooks)."""
    stage = ctx.stage
    eval_step = make_eval_step(stage.eval_fn, ctx.graphdef) if stage.eval_fn is not None else None  # compiled once
    evaluate = lambda params: _evaluate(stage, params, eval_step, ctx.shardings[2].mesh)  # noqa: E731
    progress = Progress(ctx, bar, task)
    guard = DivergenceGuard(ctx, newest=lambda: _committed(ctx))
    return [
        MetricsLogger(ctx, stage_flops(stage, ctx.recipe), peak_flops_per_second(ctx.cfg.peak_flops)),
        guard,
        progress,
        Evaluation(ctx, evaluate, CONTROL_LAG, run=lambda work: interruptibly(work, ctrl_c), phase=progress.phase),
        Checkpointing(ctx, phase=progress.phase, guard=guard),
    ]


def _committed(ctx: RunContext) -> int | None:
    """The newest checkpoint once the save in flight (if any) is committed."""
    ctx.ckpt.wait()
    return ctx.ckpt.latest_step()


def _evaluate(stage: Stage, params, eval_step, mesh) -> dict[str, float]:
    """The stage's evaluation of ``params`` through the one evaluation loop, with the run's compiled step (traced
    under the run's mesh: a kernel that runs per device, splash attention on a TPU, needs it)."""
    if eval_step is None or stage.eval_data is None:
        return {}
    with jax.set_mesh(mesh):
        return run_eval(stage.eval_fn, params, stage.eval_data, stage.score, eval_step=eval_step)


def _trackers(ctx: RunContext, state: TrainState) -> list:
    """The recipe's trackers (train.trackers; on the lead process), as hooks that get every metrics.jsonl row."""
    if not ctx.cfg.trackers or not ctx.lead:
        return []
    from ssmlm.train.trackers import open_trackers

    restored = state.start if state.resumed else None
    trackers = open_trackers(ctx.cfg.trackers, ctx.run_dir, restored, ctx.log.rows(), ctx.recipe.to_dict())
    ctx.hooks.extend(trackers)  # the metrics log's listeners too
    return trackers


def _train_one(ctx: RunContext, state: TrainState, prefetch: Prefetcher, train_step) -> None:
    """One update: the step's batch (read ahead) onto the mesh, through the jitted step."""
    host_batch = prefetch.next(state.step)
    state.tokens = real_tokens(host_batch)
    batch = put_batch(host_batch, ctx.shardings[2])
    with jax.set_mesh(ctx.shardings[2].mesh):  # traced under the run's mesh, as `--dry-run --target` compiles it
        state.params, state.opt_state, state.outputs = train_step(state.params, state.opt_state, batch, state.step)
    state.step += 1
    if state.control is not None:
        state.control.advance(state.step)


def _interrupted(ctx: RunContext, state: TrainState, defaults: list[Hook]) -> NoReturn:
    """After the first Ctrl-C: the checkpoint to resume from, then Interrupted."""
    for hook in defaults:
        hook.at_interrupt(state)
    ctx.ckpt.close()
    emit(ctx.hooks, "on_interrupt", state.step)
    pending = " (its evaluation is done first on resume)" if state.eval_pending else ""
    raise Interrupted(
        f"stopped at step {state.step}/{ctx.total}; checkpoint saved in {ctx.where}{pending}; "
        "run the same command again to resume"
    )


def _finish(
    ctx: RunContext, state: TrainState, defaults: list[Hook], launch: Launches, ctrl_c: CtrlC | None = None
) -> dict[str, Any]:
    """The final evaluation and checkpoint (or, stopped early, the one to resume from); the summary, with the
    seconds of this start (``seconds``) and of all the run's starts (``launches``, ``seconds_total``). The user
    hooks' on_end (the loss plot) only without a stop request, one during the final evaluation or save included:
    a spot machine's SIGTERM gives ~30 s before the kill, and the next invocation or `ssmlm analyze` draws them."""
    for hook in defaults:
        hook.at_end(state)
    ctx.ckpt.close()
    launch.end(state.step)
    summary: dict[str, Any] = {"kind": ctx.stage.kind, "start_step": state.start, "total_steps": ctx.total}
    if state.step < ctx.total:
        summary["stopped_early"] = True
    summary.update(
        final_step=state.step,
        seconds=launch.this["seconds"],
        **launch.summary(),
        skipped_steps=state.skipped_total,
        train=state.last,
        validation=state.eval_metrics,  # a finished run asked again reports its last evaluation
    )
    if ctx.ckpt.best_step() is not None:
        summary["best_checkpoint"] = ctx.ckpt.best_step()
    ctx.stage.model = nnx.merge(ctx.graphdef, state.params)
    if ctrl_c is not None and ctrl_c.requested:
        return summary
    with next(h for h in defaults if isinstance(h, Progress)).phase("finishing (plots)"):  # e.g. the loss plot
        emit(ctx.hooks, "on_end", summary)
    return summary


def real_tokens(batch) -> int:
    """Non-padding tokens of a host batch (segment id 0 is padding; weight-0 rows count none)."""
    return int((batch.segment_ids != 0).sum())


def stage_flops(stage: Stage, recipe: Recipe) -> float:
    """Training FLOPs per token of the stage's model (see ssmlm.models.flops)."""
    from ssmlm.models.flops import flops_per_token

    seq_len = stage.tokens_per_step // max(recipe.train.batch_size, 1)
    return flops_per_token(stage.model, recipe.model, seq_len, stage.predictions_per_row)
