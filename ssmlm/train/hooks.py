"""The training loop's default behaviours, as hooks over its TrainState (ssmlm.train.loop).

After every step ``loop.run`` calls each default hook's ``after_step`` in this order:

1. MetricsLogger: the training metrics of each window to metrics.jsonl (every train.log_every steps and at the
   invocation's last step), then the user hooks' ``on_log``;
2. DivergenceGuard: stops the run (Diverged) once too many steps were skipped for a non-finite loss or gradient
   (checked at logging steps, at the end and before every checkpoint, which is also refused for non-finite weights);
3. Progress: the bar's count of finished steps and its loss / lr / tok/s / mfu (without a terminal, its plain
   line every ~30 s);
4. Evaluation: validation at the recipe's cadences, the user hooks' ``on_eval``, the controller's update;
5. Checkpointing: periodic checkpoints and, with train.keep_best, one after every evaluation.

When the loop ends, ``at_end`` (the final evaluation, then the final checkpoint) or, after a Ctrl-C, ``at_interrupt``
(the checkpoint to resume from). User hooks (``Stage.hooks``: any of on_start / on_log / on_eval / on_checkpoint /
on_interrupt / on_end) are called through ``emit``.

This module imports nothing from the loop at run time: the loop hands each hook what it needs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from ssmlm.errors import Diverged

# The loop's ssmlm.train.loop.RunContext and TrainState, named here without importing the loop (which imports
# this module): no import cycle, not even one for type hints.
RunContext = Any
TrainState = Any


def emit(hooks, event: str, *args) -> None:
    """Call ``event`` on every hook that has it, in order."""
    for h in hooks:
        fn = getattr(h, event, None)
        if fn is not None:
            fn(*args)


def _due(step: int, every: int) -> bool:
    return bool(every) and step % every == 0


def _to_host(tree) -> dict:
    return {k: float(v) for k, v in jax.device_get(tree).items()}


def log_control(ctx: RunContext, step: int, control_state: Any, applies_from: int) -> None:
    """The controller's ``record`` of a state (if it has one) to metrics.jsonl, split "controller"."""
    record = getattr(ctx.stage.controller, "record", None)
    if record is not None:
        ctx.log.write({"step": step, "split": "controller", "applies_from": applies_from, **record(control_state)})


class Hook:
    """A default behaviour of the loop; each method may change the TrainState."""

    def after_step(self, state: TrainState) -> None:
        """After every step (``state.step`` steps done)."""

    def at_end(self, state: TrainState) -> None:
        """After the invocation's last step (the run's last, or ``stop_after``'s)."""

    def at_interrupt(self, state: TrainState) -> None:
        """After a Ctrl-C stopped the loop before the run's last step."""


@dataclass
class LogLine:
    """What a logging step wrote (``record``), with the unrounded values the progress display shows."""

    record: dict
    lr: float
    tokens_per_s: float
    mfu: float | None
    skipped: int = 0  # steps of the window skipped for a non-finite loss or gradient
    good: int = 1  # steps of the window that updated the weights (0: the record has no training metrics)


class MetricsLogger(Hook):
    """Every train.log_every steps (and at the invocation's last step): the window's mean training metrics over
    its good steps, learning rate, real tokens/s, fill and MFU to metrics.jsonl and the user hooks' on_log.
    Sets ``state.last``, ``state.skipped_total`` and ``state.log_line`` (None on the steps it does not log)."""

    def __init__(self, ctx: RunContext, flops: float, peak: float | None):
        self.ctx, self.flops, self.peak = ctx, flops, peak
        self._open_window(time.time())

    def _open_window(self, now: float) -> None:
        self.t0, self.steps, self.sum, self.tokens = now, 0, None, 0

    def after_step(self, state: TrainState) -> None:
        self.steps += 1
        self.tokens += state.tokens
        # Sum on device (no host sync per step); log the mean over the window's good steps.
        self.sum = state.outputs if self.sum is None else jax.tree.map(jnp.add, self.sum, state.outputs)
        due = state.step % self.ctx.cfg.log_every == 0 or state.step == state.stop
        state.log_line = self._write(state) if due else None

    def _write(self, state: TrainState) -> LogLine:
        sums = _to_host(self.sum)
        skipped = int(round(sums.pop("skipped")))
        state.skipped_total += skipped
        good = self.steps - skipped
        if good:  # a window whose every step was skipped has no training metrics: the newest good ones stand
            state.last = {k: v / good for k, v in sums.items()}
        now = time.time()
        # Padding is not work: tokens/s (and MFU) count the real tokens of every process's rows.
        real = self.tokens * jax.process_count()
        tps = real / max(now - self.t0, 1e-9)
        fill = real / max(self.ctx.stage.tokens_per_step * self.steps, 1)
        self._open_window(now)
        lr = float(self.ctx.optimizer.schedule(state.step - 1))
        rec = {
            "step": state.step,
            "lr": lr,
            "tokens_per_s": round(tps, 1),
            "fill": round(fill, 4),
            "time": round(now, 3),
            **(state.last if good else {}),
        }
        if skipped:
            rec["skipped"] = skipped
        mfu = tps * self.flops / self.peak if self.peak else None
        if mfu is not None:
            rec["mfu"] = float(f"{mfu:.4g}")
        self.ctx.log.write(rec)
        emit(self.ctx.hooks, "on_log", state.step, rec)
        return LogLine(rec, lr, tps, mfu, skipped, good)


SHARE_AFTER = 10  # steps before train.max_skipped_share applies: one early skip is not yet a share


class DivergenceGuard(Hook):
    """Stops the run (Diverged) once too many steps were skipped for a non-finite loss or gradient: more than
    train.max_skipped_steps in all, train.max_skipped_in_a_row in a row, or (from step SHARE_AFTER on) more than
    the share train.max_skipped_share of the steps so far. The counts are kept on the device (no host sync per
    step) and read at each logging step, at the end and before every checkpoint (``check``, which Checkpointing
    calls): a diverged run never saves the steps it skipped through. ``newest`` names the newest checkpoint."""

    def __init__(self, ctx: RunContext, newest: Callable[[], int | None] = lambda: None):
        self.ctx, self.newest = ctx, newest
        self.counted: int | None = None  # skipped steps up to the last check (from the restored checkpoint on)
        self.pending = self.run = self.longest = None  # on device: since the last check, the current streak, its max
        self.streak = 0  # the streak at the last check

    def after_step(self, state: TrainState) -> None:
        if self.counted is None:
            self.counted = state.skipped_total  # a resumed run's count, from its checkpoint
        s = state.outputs["skipped"]
        if self.run is None:
            self.pending, self.run, self.longest = s, (self.streak + s) * s, (self.streak + s) * s
        else:
            self.pending, self.run = self.pending + s, (self.run + s) * s
            self.longest = jnp.maximum(self.longest, self.run)
        if state.log_line is not None:
            self.check(state)

    def at_end(self, state: TrainState) -> None:  # before the final evaluation: a diverged run is not evaluated
        self.check(state)

    def check(self, state: TrainState) -> None:
        if self.run is None:
            return
        pending, run, longest = (int(round(float(x))) for x in jax.device_get((self.pending, self.run, self.longest)))
        self.counted = (self.counted or 0) + pending
        self.pending = self.run = self.longest = None
        self.streak = run
        cfg, step, total = self.ctx.cfg, state.step, self.ctx.total
        if longest > cfg.max_skipped_in_a_row:
            limit = cfg.max_skipped_in_a_row
            why = f"{longest} steps in a row were skipped (more than train.max_skipped_in_a_row = {limit})"
        elif self.counted > cfg.max_skipped_steps:
            why = f"{self.counted} steps were skipped (more than train.max_skipped_steps = {cfg.max_skipped_steps})"
        elif step >= SHARE_AFTER and self.counted > cfg.max_skipped_share * step:
            why = (
                f"{self.counted} of the {step} steps so far were skipped (more than train.max_skipped_share = "
                f"{cfg.max_skipped_share:g})"
            )
        else:
            return
        raise Diverged(
            f"training diverged by step {step}/{total}: {why} for a non-finite loss or gradient; "
            f"{newest_words(self.newest())}; lower train.learning_rate, set train.grad_clip, or check the data"
        )


def newest_words(step: int | None) -> str:
    return f"the newest checkpoint is step {step}, saved before it" if step else "no checkpoint was saved"


@jax.jit
def _all_finite(tree) -> jax.Array:
    """One bool on the device: every floating-point value of ``tree`` is finite."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves])) if leaves else jnp.bool_(True)


class Progress(Hook):
    """After every step the bar's count, at each logging step its loss, lr, tok/s and mfu (without a terminal the
    bar prints a plain line every ~30 s instead, ssmlm.progress), before the evaluation: its phase follows the
    step shown. ``phase`` names what the bar waits on between steps (a compile, an evaluation, a save).

    The count is of the steps the device has finished, not of those dispatched: steps run asynchronously, and a
    count that ran ahead by the queue's depth and then waited at every logging step would move in bursts, and its
    rate and ETA with it. Whether a step is done is asked without waiting (``is_ready``); a logging step has waited
    for all of them."""

    def __init__(self, ctx: RunContext, bar, task):
        self.ctx, self.bar, self.task = ctx, bar, task
        self.pending: deque[tuple[int, Any]] = deque()  # (step, one of its outputs): dispatched, not yet seen done

    def phase(self, label: str) -> AbstractContextManager:
        """While it lasts the bar says ``label`` (without a terminal: a line once it takes over 2 s), see
        ssmlm.progress.phase; the context's value moves it on to its next part (``.set(label)``). The steps
        dispatched before it are waited for and counted first: the phase's work (an evaluation of the newest
        parameters, a save) would wait for them anyway, and their time is the training's, not the phase's."""
        from ssmlm.progress import phase

        if self.pending:
            jax.block_until_ready([output for _, output in self.pending])
            self.bar.update(self.task, completed=self.pending[-1][0])
            self.pending.clear()
        return phase(self.bar, self.task, label)

    def after_step(self, state: TrainState) -> None:
        line = state.log_line
        self.pending.append((state.step, next(iter(jax.tree.leaves(state.outputs)), None)))
        done = {}
        while self.pending and (line is not None or _ready(self.pending[0][1])):
            done = {"completed": self.pending.popleft()[0]}
        if line is None:
            self.bar.update(self.task, **done)
            return
        tps, mfu = line.tokens_per_s, line.mfu
        self.bar.update(
            self.task,
            **done,
            loss=loss_text(line, state.last.get("loss")),
            lr=f"{line.lr:.2e}",
            mfu=f"{mfu:.1%}" if mfu else "-",
            **{"tok/s": f"{tps:,.0f}"},
        )

    def at_interrupt(self, state: TrainState) -> None:  # the steps before the stop: the checkpoint waits for them
        self.pending.clear()
        self.bar.update(self.task, completed=state.step)


def loss_text(line: LogLine, loss: float | None) -> str:
    """The bar's loss: the window's mean over its good steps, and how many were skipped (never a 0 for them)."""
    if not line.good or loss is None:
        return f"skipped ({line.skipped})"
    return f"{loss:.4f}" + (f" ({line.skipped} skipped)" if line.skipped else "")


def _ready(output) -> bool:
    return getattr(output, "is_ready", lambda: True)()


class Stopped(Exception):
    """Ctrl-C while the loop waited on work it drops and does again on resume (ssmlm.train.threads.interruptibly)."""


class Evaluation(Hook):
    """Validation every train.eval_every steps, every Stage.eval_also_every steps and at Stage.eval_at's steps
    (never at the last step inside the loop), and once at the end of a run that trained (or never saved).

    Each result with metrics goes to the controller, then to metrics.jsonl (split "validation") and the user hooks'
    on_eval; the controller's new state applies from ``lag`` steps on (logged, split "controller"). Sets
    ``state.eval_metrics`` to every result and ``state.fresh_eval`` to the metrics of this step's evaluation
    (None when there was none, or it gave no metrics).

    The evaluation and the controller's update go through ``run`` (the loop's: on a worker thread it stops
    waiting for on Ctrl-C). A Ctrl-C there writes nothing and sets ``state.eval_pending``: the checkpoint saved
    next says so and the resumed run evaluates this step first. ``phase`` (Progress.phase) says which of the two
    is running."""

    def __init__(
        self,
        ctx: RunContext,
        evaluate: Callable[[Any], dict[str, float]],
        lag: int,
        run: Callable[[Callable], Any] = lambda work: work(),
        phase: Callable[[str], AbstractContextManager] | None = None,
    ):
        self.ctx, self.evaluate_params, self.lag, self.run = ctx, evaluate, lag, run
        self.phase = phase or (lambda label: nullcontext(_Unnamed()))

    def after_step(self, state: TrainState) -> None:
        step, stage, cfg = state.step, self.ctx.stage, self.ctx.cfg
        state.fresh_eval = None
        due = _due(step, cfg.eval_every) or _due(step, stage.eval_also_every)
        if (due or (stage.eval_at is not None and stage.eval_at(step))) and step < self.ctx.total:
            self.evaluate(state)

    def at_end(self, state: TrainState) -> None:
        state.fresh_eval = None
        # a run that trained, never saved, or was stopped in this very evaluation
        wanted = state.step > state.start or not state.resumed or state.eval_pending
        if state.step >= self.ctx.total and wanted:
            self.evaluate(state)

    def evaluate(self, state: TrainState) -> None:
        step, ctx = state.step, self.ctx
        control = state.control if step < ctx.total else None

        def work(shown):  # reads the state, changes nothing: dropped on Ctrl-C
            metrics = self.evaluate_params(state.params)
            if not (metrics and control):
                return metrics, None
            shown.set(getattr(ctx.stage.controller, "update_label", "controller update"))
            return metrics, ctx.stage.controller.update(control.at(step), step, metrics)

        try:
            with self.phase("evaluating") as shown:
                metrics, new = self.run(lambda: work(shown))
        except Stopped:
            state.eval_pending = True
            return
        state.eval_pending = False
        state.eval_metrics, state.fresh_eval = metrics, metrics or None
        if not metrics:
            return
        ctx.log.write({"step": step, "split": "validation", **metrics})
        emit(ctx.hooks, "on_eval", step, metrics)
        if new is not None:
            control.set(new, step + self.lag)
            log_control(ctx, step, new, step + self.lag)


class _Unnamed:
    """A phase nobody is shown (no bar)."""

    def set(self, label: str) -> None:
        pass


class Checkpointing(Hook):
    """Checkpoints every train.checkpoint_every steps, at each of train.keep_steps and, with train.keep_best, after
    every evaluation (all before the last step); at the end the final one (or, stopped early, the one to resume
    from), and the one to resume from after a Ctrl-C. A step is saved at most once per invocation (a resumed run's
    first step counts as saved); each save is announced to the user hooks' on_checkpoint. ``phase``
    (Progress.phase) shows the save on the bar, and leaves its time out of the ETA."""

    def __init__(
        self,
        ctx: RunContext,
        phase: Callable[[str], AbstractContextManager] | None = None,
        guard: DivergenceGuard | None = None,
    ):
        self.ctx, self.guard = ctx, guard
        self.phase = phase or (lambda label: nullcontext(_Unnamed()))

    def after_step(self, state: TrainState) -> None:
        cfg = self.ctx.cfg
        self.ctx.ckpt.poll()  # a save that failed in the background stops the run now, not at the next save
        periodic = (cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0) or state.step in cfg.keep_steps
        if state.step < self.ctx.total and (periodic or (state.fresh_eval is not None and cfg.keep_best)):
            self.save(state, state.fresh_eval)

    def at_end(self, state: TrainState) -> None:  # after Evaluation.at_end: fresh_eval is the final evaluation's
        self.save(state, state.fresh_eval)

    def at_interrupt(self, state: TrainState) -> None:
        self.save(state, None)

    def save(self, state: TrainState, eval_metrics: dict | None) -> None:
        step, ctx = state.step, self.ctx
        if step in state.saved:  # e.g. a periodic save right before a stop at the same step
            return
        if self.guard is not None:
            self.guard.check(state)
        # one reduced bool, read once per save: the newest checkpoint is always one of finite weights
        if not bool(_all_finite((state.params, state.opt_state))):
            raise Diverged(
                f"training diverged by step {step}/{self.ctx.total}: its parameters or optimizer state are not "
                f"finite, so it was not saved; {newest_words(self.ctx.ckpt.latest_step())}; lower "
                "train.learning_rate, set train.grad_clip, or check the data"
            )
        state.saved.add(step)
        meta = {
            "step": step,
            "data_position": step,
            "skipped_steps": state.skipped_total,
            **ctx.manifest,
            "metrics": state.last,
            "validation": eval_metrics or {},
            **({"evaluation_pending": True} if state.eval_pending else {}),
        }
        control = state.control.to_tree() if state.control is not None else None
        with self.phase("saving a checkpoint"):  # asynchronous, but it waits for the device and the previous save
            ctx.ckpt.save(step, state.params, state.opt_state, meta, eval_metrics, control)
        emit(ctx.hooks, "on_checkpoint", step)
