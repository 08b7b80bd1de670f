"""Running an experiment's plan (experiment/plan.py): every run in order, one line per start and finish, then
the per-arm values (with a grid: at each arm's point selected on validation).

A run that fails is recorded with its error's first line (the full traceback under OUT/errors/), its dependants
are not run, and its arm is reported as failed; the other arms go on. The warnings a training run recorded
(summary.json's ``warnings``) are printed once under its line.

``jobs`` = 1 runs everything in this process (jax is imported once and the compiled steps of one seed serve the
next); more start that many worker processes (experiment/pool.py, each running the same driver functions), which
pays only where one run does not already use every core.
"""

from __future__ import annotations

import dataclasses
import json
import time
import traceback
from collections import Counter
from pathlib import Path

from ssmlm.errors import Interrupted, UserError, reason
from ssmlm.experiment.eta import Eta, dry_run_estimate, steps
from ssmlm.experiment.execute import timed
from ssmlm.experiment.plan import Job, Plan, build_plan, later_jobs
from ssmlm.experiment.pool import signals_as_ctrl_c, spawn_pool, stop_on_interrupt
from ssmlm.experiment.spec import Experiment, point_label
from ssmlm.progress import clock_time


@dataclasses.dataclass
class Outcome:
    ok: bool
    result: dict | None = None  # a training run's summary, or an evaluation's result
    seconds: float = 0.0
    reused: bool = False
    error: str | None = None


def first_line(e: BaseException) -> str:
    return reason(e, limit=1000)  # (whole first line: a run's failure is the one thing its line says)


class Runner:
    """Runs jobs in order, one line per start and finish (runs done / total, ETA from the finished runs) and one
    per distinct warning a training run recorded (its summary.json's ``warnings``)."""

    def __init__(self, out: Path, total: Counter, jobs: int = 1, verbose: bool = False, echo=print, steps: int = 0):
        self.out, self.jobs, self.verbose, self.echo = out, jobs, verbose, echo
        self.eta = Eta(total, steps, jobs)
        self.total = self.eta.total
        self.done: dict[str, Outcome] = {}
        self.jobs_by_key: dict[str, Job] = {}
        self.warnings: list[dict] = []  # each training run's distinct recorded warnings, in the order they came
        self.t0 = self.eta.t0

    def run(self, jobs: list[Job]) -> None:
        """Run ``jobs`` in their order; a free worker takes the first whose dependencies are done (a job whose
        dependency failed is recorded as not run)."""
        for job in jobs:
            self.jobs_by_key[job.key] = job
        queue = list(jobs)
        with signals_as_ctrl_c():
            if self.jobs > 1 and len(jobs) > 1:
                self._pool(queue)
            else:  # the order already puts every run after its dependencies
                while (job := self._next(queue)) is not None:
                    self._start(job)
                    self._finish(job, self._in_process(job))

    def _next(self, queue: list[Job]) -> Job | None:
        """Take the first queued job whose dependencies have all finished (None: none yet); one whose dependency
        failed is finished here as not run."""
        i = 0
        while i < len(queue):
            job = queue[i]
            if any(d not in self.done for d in job.deps):  # waits for a run still going
                i += 1
                continue
            queue.pop(i)
            failed = next((d for d in job.deps if not self.done[d].ok), None)
            if failed is None:
                return job
            self._finish(job, Outcome(False, error=self.done[failed].error), f"not run: {failed} failed")
        return None

    def _in_process(self, job: Job) -> Outcome:
        try:
            result, reused, dt = timed(job, self.verbose)
            return Outcome(True, result, dt, reused)
        except (Interrupted, KeyboardInterrupt):
            raise
        except Exception as e:  # recorded: the arm is reported as failed, the others go on
            return self._failed(job, e, traceback.format_exc())

    def _pool(self, queue: list[Job]) -> None:
        from concurrent.futures import FIRST_COMPLETED, wait

        with spawn_pool(min(self.jobs, len(queue))) as pool:
            futures = {}

            def fill() -> None:  # one run per free worker, so that "start" is printed when a run starts
                while len(futures) < self.jobs and (job := self._next(queue)) is not None:
                    self._start(job)
                    futures[pool.submit(timed, job, self.verbose)] = job

            fill()
            with stop_on_interrupt(pool):  # each worker stops after its current step and writes a checkpoint
                while futures:
                    f = next(iter(wait(futures, return_when=FIRST_COMPLETED).done))
                    job = futures.pop(f)
                    try:
                        result, reused, dt = f.result()
                        self._finish(job, Outcome(True, result, dt, reused))
                    except Interrupted:
                        raise
                    except Exception as e:
                        self._finish(job, self._failed(job, e, "".join(traceback.format_exception(e))))
                    fill()

    def _failed(self, job: Job, e: BaseException, trace: str) -> Outcome:
        log = self.out / "errors" / (job.key.replace("/", "__") + ".txt")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(trace)
        return Outcome(False, error=first_line(e))

    def _start(self, job: Job) -> None:
        # the runs done so far, as on the "done" lines: with --jobs a count of runs started would run ahead of it
        self.echo(f"[{len(self.done)}/{self.total}] start {job.label}")

    def _finish(self, job: Job, o: Outcome, how: str | None = None) -> None:
        self.done[job.key] = o
        self.eta.finished(job, whole_run_seconds(o) if o.ok and not o.reused else None)
        how = how or ("reused" if o.reused else clock_time(o.seconds))
        what = "done" if o.ok else "FAILED"
        tail = "" if o.ok else f": {o.error}"
        self.echo(f"[{len(self.done)}/{self.total}] {what} {job.label} ({how}){tail}{self.eta.text()}")
        if o.ok and job.kind in ("pretrain", "finetune"):
            self._warnings(job, o)

    def _warnings(self, job: Job, o: Outcome) -> None:
        """The warnings the run recorded in its summary.json, each once, under its line (the run itself printed
        them only with --verbose, and not when it is reused); kept for results.md."""
        for text in dict.fromkeys(o.result.get("warnings") or []):
            self.warnings.append(
                {
                    "arm": job.arm,
                    "seed": job.seed,
                    "stage": job.kind,
                    "run": job.label,
                    "run_dir": str(job.run_dir),
                    "warning": text,
                }
            )
            if not self.verbose or o.reused:
                self.echo(f"  warning: {text}")


def run_experiment(exp: Experiment, out: Path, jobs: int = 1, verbose: bool = False, echo=print) -> dict:
    """Run (or reuse) every run of ``exp`` under ``out``; the per-arm values and intervals (see report)."""
    from ssmlm.experiment.report import summarize

    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.yaml").write_text(exp.path.read_text(encoding="utf-8"), encoding="utf-8")
    plan = build_plan(exp, out)
    pretrain = plan.of_kind("pretrain")
    total = run_counts(exp, plan)
    grid = f" × {len(exp.points())} grid points" if exp.grid else ""
    if exp.budgets:
        plural = lambda n, word: f"{n} {word}{'s' if n > 1 else ''}"  # noqa: E731
        grid = f" × {plural(len(exp.budgets), 'budget')} × {plural(len(exp.probes), 'probe')}"
    n_arms = f"{len(exp.arms)} arm{'s' if len(exp.arms) > 1 else ''}"
    echo(
        f"experiment {exp.name}: {n_arms} × {len(exp.seeds)} seed{'s' if len(exp.seeds) > 1 else ''}{grid}, "
        f"{sum(total.values())} runs under {out}, seed by seed"
    )
    runner = Runner(out, total, jobs, verbose, echo, steps=sum(steps(j) for j in pretrain))
    runner.run(plan.jobs)
    chosen, grids = select(exp, plan, runner.done)
    if exp.grid:  # the selection needed every seed's finetuning runs
        runner.run(later_jobs(exp, plan, chosen))
    arms = {arm: collect_arm(exp, plan, runner, arm, chosen[arm], grids.get(arm)) for arm in exp.arms}
    res = summarize(exp, arms, time.time() - runner.t0, runner.warnings)
    res["run_time"] = {**training_seconds(plan), "evaluations": len(plan.of_kind("evaluate")), "jobs": jobs}
    if exp.budgets:
        from ssmlm.experiment.sweep_report import summarize_sweep

        res["sweep"] = summarize_sweep(collect_sweep(exp, plan, runner))
    return res


def run_counts(exp: Experiment, plan: Plan) -> Counter:
    """Runs of each kind the experiment makes, those that wait for a grid's selection included."""
    n_eval = len(exp.arms) * len(exp.seeds) if "evaluate" in exp.stages and exp.grid else len(plan.of_kind("evaluate"))
    n_analyze = sum(len(a["analyze"].analyses) for a in exp.arms.values() if "analyze" in a) * len(exp.seeds)
    pretrain, finetune = len(plan.of_kind("pretrain")), len(plan.of_kind("finetune"))
    return Counter(pretrain=pretrain, finetune=finetune, evaluate=n_eval, analyze=n_analyze)


def whole_run_seconds(o: Outcome) -> float:
    """What the whole run would have taken: a training run resumed from a checkpoint ran only its last steps in
    ``o.seconds``, so that time is scaled to all of its steps (the estimate counts the run's every step)."""
    r = o.result if isinstance(o.result, dict) else {}
    start, final, total = r.get("start_step"), r.get("final_step"), r.get("total_steps")
    if isinstance(start, int) and start > 0 and isinstance(final, int) and final > start and total:
        return o.seconds * total / (final - start)
    return o.seconds


def dry_run_time(exp: Experiment, out: Path, jobs: int) -> str:
    """`experiment --dry-run`'s estimate of its time (see eta.dry_run_estimate)."""
    plan = build_plan(exp, out)
    return dry_run_estimate(plan.jobs, run_counts(exp, plan), jobs)


def training_seconds(plan: Plan) -> dict[str, float]:
    """Seconds per training stage, summed over its runs and all their launches (each summary.json's
    seconds_total), so that a file run over several invocations, resumed or reused, is counted whole."""
    out = {}
    for kind in ("pretrain", "finetune"):
        paths = [j.run_dir / "summary.json" for j in plan.of_kind(kind)]
        out[kind] = round(sum(json.loads(p.read_text())["seconds_total"] for p in paths if p.exists()), 1)
    return out


def metric_value(exp: Experiment, result: dict, stage: str | None = None, field: str | None = None) -> float:
    """The metric's field (or ``field``) in a run's result: an evaluation's metrics, or a training run's final
    validation."""
    stage, field = stage or exp.metric.stage, field or exp.metric.field
    found = (result.get("metrics") if stage == "evaluate" else result.get("validation")) or {}
    v = found.get(field)
    if not isinstance(v, int | float) or isinstance(v, bool):
        where = "evaluation" if stage == "evaluate" else f"{stage} run's final validation"
        name = exp.metric if field == exp.metric.field else f"{stage}:{field}"
        raise UserError(f"metric {name}: the {where} has no '{field}' (has {', '.join(found) or 'no metrics'})")
    return float(v)


def select(exp: Experiment, plan: Plan, done: dict[str, Outcome]) -> tuple[dict[str, int], dict[str, list]]:
    """Per arm, the grid point whose finetuning runs' mean final validation metric (over seeds) is best; the
    test split is never looked at here. Without a grid: the one point."""
    if not exp.grid:
        return dict.fromkeys(exp.arms, 0), {}
    chosen, grids = {}, {}
    for arm in exp.arms:
        rows = []
        for pi, point in enumerate(exp.points()):
            row = {"point": point_label(point), "validation": {}, "mean": None, "error": None}
            for seed in exp.seeds:
                o = done[plan.chains[(arm, seed, pi)]["finetune"]]
                try:
                    if not o.ok:
                        raise UserError(o.error)
                    row["validation"][seed] = metric_value(exp, o.result, "finetune")
                except UserError as e:
                    row["error"] = f"seed {seed}: {e}"
                    break
            if row["error"] is None:
                row["mean"] = sum(row["validation"].values()) / len(row["validation"])
            rows.append(row)
        complete = [i for i, r in enumerate(rows) if r["mean"] is not None]
        sign = 1 if exp.metric.goal == "max" else -1
        chosen[arm] = max(complete, key=lambda i: sign * rows[i]["mean"]) if complete else 0
        for i, r in enumerate(rows):
            r["selected"] = bool(complete) and i == chosen[arm]
        grids[arm] = rows
    return chosen, grids


def collect_arm(exp: Experiment, plan: Plan, runner: Runner, arm: str, pi: int, grid: list | None) -> dict:
    """An arm's metric per seed at its chosen point, its runs, and the first error of a failed one."""
    values, errors, runs = {}, [], {}
    for seed in exp.seeds:
        chain = plan.chains[(arm, seed, pi)]
        runs[seed] = {stage: str(runner.jobs_by_key[key].run_dir) for stage, key in chain.items()}
        bad = next((key for key in chain.values() if not runner.done[key].ok), None)
        if bad is not None:
            errors.append(f"{bad}: {runner.done[bad].error}")
            continue
        if exp.metric.stage not in chain:
            errors.append(f"{arm} has no {exp.metric.stage} run (its finetuning starts from init or ckpt)")
            continue
        try:
            values[seed] = metric_value(exp, runner.done[chain[exp.metric.stage]].result)
        except UserError as e:
            errors.append(f"seed {seed}: {e}")
    out = {
        "status": "failed" if errors else "ok",
        "error": errors[0] if errors else None,
        "values": values,
        "runs": runs,
    }
    if grid is not None:
        out["selected"] = point_label(exp.points()[pi])
        out["grid"] = grid
    return out


# an evaluation's shares of replies that say nothing or are not numbers of the books' shape (phone books), kept
# per seed beside the metric: an accuracy of 0 reads differently when every reply was empty or malformed
REPLY_SHARES = {"empty": "empty_replies", "malformed": "malformed_replies"}


def collect_sweep(exp: Experiment, plan: Plan, runner: Runner) -> dict:
    """A budget sweep's values: arm -> evaluation -> budget -> each seed's metric (and the first error), and
    each seed's shares of empty and malformed replies where the evaluation records them (REPLY_SHARES)."""
    arms: dict[str, dict] = {}
    stages = exp.evaluations()
    for (arm, seed, ename, budget), key in plan.sweep.items():
        cell = arms.setdefault(arm, {}).setdefault(ename, {}).setdefault(str(budget), {"values": {}, "error": None})
        o = runner.done.get(key)
        if o is None or not o.ok:
            cell["error"] = cell["error"] or f"seed {seed}: {o.error if o else 'not run'}"
            continue
        try:
            cell["values"][str(seed)] = metric_value(exp, o.result, field=stages[ename][1].metric)
        except UserError as e:
            cell["error"] = cell["error"] or f"seed {seed}: {e}"
        for name, field in REPLY_SHARES.items():
            share = (o.result.get("metrics") or {}).get(field)
            if isinstance(share, int | float) and not isinstance(share, bool):
                cell.setdefault(name, {})[str(seed)] = float(share)
    evaluations = {}
    for e, (probe, st) in stages.items():
        key = next(k for (_, _, name, _), k in plan.sweep.items() if name == e)
        finetuning = plan.by_key[plan.by_key[key].deps[0]].recipe
        field = st.metric or exp.metric.field
        evaluations[e] = {"probe": probe, "metric": field, "chance": st.chance, "about": _about(st, finetuning)}
    reference = {a: exp.reference_of(a) for a in exp.arms if exp.reference_of(a)} if exp.reference else None
    return {
        "budgets": list(exp.budgets),
        "metric": exp.metric.field,
        "seeds": list(exp.seeds),
        "evaluations": evaluations,
        "arms": arms,
        "reference": reference,
    }


def _about(ev, finetuning) -> str:
    """What an evaluation scores, e.g. "phonebook test, 100 books of 4 entries" (phone books: their entries)."""
    what = f"{ev.task or 'its own task'} {ev.split}" + (f", {ev.limit} items" if ev.limit else "")
    if ev.task != "phonebook":
        return what
    lo, hi = ev.entries or finetuning.task.phonebook.entries
    return (
        what.replace("items", "books")
        + f" of {lo}"
        + (f"-{hi}" if hi > lo else "")
        + (" entries" if hi > 1 else " entry")
    )
