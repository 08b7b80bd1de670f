"""Planning and running an experiment: every stage of every arm × seed (× grid point) is an ordinary run directory
under OUT/runs/ARM/seedS/, run by the driver functions the CLI calls.

Seed by seed: every stage of seed 0 of every arm (pretrain → finetune → evaluate → analyze; arms that pretrain
identically share the run) before anything of seed 1, so that an experiment stopped early already holds complete
pairs to compare. With ``jobs`` > 1 a free worker takes the first run in that order whose dependencies are done.
With a grid, the evaluations (RUN/eval/TASK-SPLIT.json, as `ssmlm evaluate` writes them) and analyses wait until
every seed's finetuning runs are in: the point is selected per arm on their mean validation metric.

A run whose summary.json (an evaluation whose JSON) exists is reused; an unfinished one resumes from its newest
checkpoint (the driver's own rule). A run that fails is recorded with its error's first line (the full traceback
under OUT/errors/), its dependants are not run, and its arm is reported as failed; the other arms go on. The
warnings a training run recorded (summary.json's ``warnings``) are printed once under its line.

``jobs`` = 1 runs everything in this process (jax is imported once and the compiled steps of one seed serve the
next); more start that many worker processes (spawned, each running the same driver functions), which pays only
where one run does not already use every core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from ssmlm.errors import Interrupted, UserError
from ssmlm.experiment.spec import (
    DEFAULT_RECIPE,
    Experiment,
    point_label,
    point_overrides,
    stage_overrides,
)


@dataclasses.dataclass
class Job:
    """One run: a training stage (recipe → run_dir) or an evaluation of run_dir."""

    key: str
    kind: str  # pretrain | finetune | evaluate | analyze
    label: str
    run_dir: Path
    recipe: Any = None
    init: str = "pretrained"
    split: str = "validation"
    batch_size: int = 32
    task: str | None = None  # evaluate: a language model's task (phonebook, …); None: the run's own metrics
    limit: int | None = None
    analysis: tuple = ()  # analyze: (NAME, its options)
    deps: tuple[str, ...] = ()
    arm: str = ""  # the arm and seed it was planned for (a pretraining run shared by arms: the first)
    seed: int | None = None


@dataclasses.dataclass
class Outcome:
    ok: bool
    result: dict | None = None  # a training run's summary, or an evaluation's result
    seconds: float = 0.0
    reused: bool = False
    error: str | None = None


@dataclasses.dataclass
class Plan:
    jobs: list[Job]  # in the order of work: seed by seed, each arm's chain of stages
    chains: dict[tuple[str, int, int], dict[str, str]]  # (arm, seed, point) -> stage -> job key
    by_key: dict[str, Job] = dataclasses.field(default_factory=dict)

    def of_kind(self, kind: str) -> list[Job]:
        return [j for j in self.jobs if j.kind == kind]


def build_plan(exp: Experiment, out: Path) -> Plan:
    """Every run of every seed × arm × grid point, seed by seed (evaluations and analyses too, except with a
    grid: those come after the selection, see later_jobs)."""
    from ssmlm.recipe import load_recipe

    pre_by_recipe: dict[str, Job] = {}
    plan = Plan([], {})
    for seed in exp.seeds:
        for arm, stages in exp.arms.items():
            seed_dir = out / "runs" / arm / f"seed{seed}"
            for pi, point in enumerate(exp.points()):
                chain: dict[str, str] = {}
                plan.chains[(arm, seed, pi)] = chain
                pre = None
                if "pretrain" in stages:
                    s = stages["pretrain"]
                    sets = [*stage_overrides(s), *point_overrides(point, "pretrain"), f"train.seed={seed}"]
                    pre = load_recipe(s.recipe or DEFAULT_RECIPE["pretrain"], sets)
                if pre is not None and exp.runs_pretrain(arm):
                    name = f"pretrain{_suffix(exp, 'pretrain', pi)}"
                    job = pre_by_recipe.get(pre.to_yaml())  # the seed is in the recipe (train.seed)
                    if job is None:
                        label = f"pretrain {arm} seed {seed}{_at(point, 'pretrain')}"
                        job = Job(f"{arm}/seed{seed}/{name}", "pretrain", label, seed_dir / name, pre, arm=arm,
                                  seed=seed)  # fmt: skip
                        pre_by_recipe[pre.to_yaml()] = job
                        _add(plan, job)
                    chain["pretrain"] = job.key
                if "finetune" in exp.stages:
                    name = f"finetune{_suffix(exp, 'finetune', pi)}"
                    pre_dir = pre_by_recipe[pre.to_yaml()].run_dir if "pretrain" in chain else None
                    job = _finetune_job(exp, arm, seed, point, pre, pre_dir)
                    job.key, job.run_dir = f"{arm}/seed{seed}/{name}", seed_dir / name
                    job.label = f"finetune {arm} seed {seed}{_at(point, 'finetune')}"
                    job.deps = (chain["pretrain"],) if "pretrain" in chain else ()
                    job.arm, job.seed = arm, seed
                    _add(plan, job)
                    chain["finetune"] = job.key
                if not exp.grid:
                    for job in _later(exp, plan, arm, seed, pi):
                        _add(plan, job)
    return plan


def _add(plan: Plan, job: Job) -> None:
    plan.jobs.append(job)
    plan.by_key[job.key] = job


def _suffix(exp: Experiment, stage: str, pi: int) -> str:
    return f"-g{pi}" if stage in exp.grid else ""


def _at(point: dict, stage: str) -> str:
    return f" [{point_label({stage: point[stage]})}]" if stage in point else ""


def _finetune_job(exp: Experiment, arm: str, seed: int, point: dict, pre, pre_dir: Path | None) -> Job:
    from ssmlm.recipe import load_recipe

    s = exp.arms[arm]["finetune"]
    sets = [*stage_overrides(s), *point_overrides(point, "finetune"), f"train.seed={seed}"]
    r = load_recipe(s.recipe or DEFAULT_RECIPE["finetune"], sets)
    init_from = s.ckpt or (str(pre_dir) if pre_dir is not None else None)
    if s.init == "random" and not s.ckpt and pre is not None:
        # the architecture and data (tokenizer) of the arm's pretrain section, which is not run; the dropout is
        # the finetuning recipe's, as a pretrained start's would be
        r = dataclasses.replace(r, model=dataclasses.replace(pre.model, dropout=r.model.dropout), data=pre.data)
    r = dataclasses.replace(r, train=dataclasses.replace(r.train, init_from=init_from))
    return Job("", "finetune", "", Path(), r, init=s.init)


def later_jobs(exp: Experiment, plan: Plan, chosen: dict[str, int]) -> list[Job]:
    """With a grid: the evaluations and analyses at each arm's chosen point, seed by seed."""
    jobs = [job for seed in exp.seeds for arm, pi in chosen.items() for job in _later(exp, plan, arm, seed, pi)]
    for job in jobs:
        plan.by_key[job.key] = job
    return jobs


def _later(exp: Experiment, plan: Plan, arm: str, seed: int, pi: int) -> list[Job]:
    """The evaluation of one arm × seed's last training run, then its analyses (each run's own, in RUN/analysis)."""
    chain = plan.chains[(arm, seed, pi)]
    target = chain.get("finetune") or chain.get("pretrain")
    run_dir = plan.by_key[target].run_dir
    out = []
    if "evaluate" in exp.stages:
        ev = exp.arms[arm]["evaluate"]
        key = f"{target}/evaluate-{ev.split}"
        out.append(Job(key, "evaluate", f"evaluate {arm} seed {seed} ({ev.task or ev.split})", run_dir,
                       split=ev.split, batch_size=ev.batch_size, task=ev.task, limit=ev.limit, deps=(target,),
                       arm=arm, seed=seed))  # fmt: skip
        chain["evaluate"] = key
    if "analyze" in exp.stages:
        deps = tuple(k for k in (target, chain.get("evaluate")) if k)
        for name, opts in exp.arms[arm]["analyze"].analyses:
            key = f"{target}/analyze-{name}"
            out.append(Job(key, "analyze", f"analyze {name} {arm} seed {seed}", run_dir, analysis=(name, opts),
                           deps=deps, arm=arm, seed=seed))  # fmt: skip
            chain[f"analyze-{name}"] = key
    return out


# ----------------------------------------------------------------------------- running one job


def execute(job: Job, verbose: bool = False) -> tuple[dict, bool]:
    """Run (or reuse) one job in this process: (summary or evaluation result, reused?)."""
    from ssmlm.progress import console

    quiet, console.quiet = console.quiet, console.quiet or not verbose
    try:
        if job.kind == "evaluate":
            return _evaluate(job)
        if job.kind == "analyze":
            return _analyze(job)
        path = job.run_dir / "summary.json"
        if path.is_file():
            return json.loads(path.read_text()), True
        from ssmlm.analyze.plots import LossPlot
        from ssmlm.train import drive

        kw = {"init": job.init} if job.kind == "finetune" else {}
        fn = drive.finetune if job.kind == "finetune" else drive.pretrain
        return fn(job.recipe, job.run_dir, quiet=not verbose, hooks=[LossPlot(job.run_dir)], **kw), False
    finally:
        console.quiet = quiet


def _evaluate(job: Job) -> tuple[dict, bool]:
    from ssmlm.runs import atomic_write, open_run

    run = open_run(job.run_dir)
    path = run.dir / "eval" / f"{job.task or run.info.get('task') or run.kind}-{job.split}.json"
    if path.is_file():
        return json.loads(path.read_text()), True
    from ssmlm.evaluate.run import evaluate_run  # what `ssmlm evaluate` runs

    result = evaluate_run(run, job.task, split=job.split, batch_size=job.batch_size, limit=job.limit)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(result, indent=2))
    return result, False


def _analyze(job: Job) -> tuple[dict, bool]:
    """`ssmlm analyze NAME --ckpt RUN` (output in RUN/analysis); a marker there records that it ran."""
    import contextlib
    import io
    import typing

    from ssmlm.analyze import registry

    name, opts = job.analysis
    marker = job.run_dir / "analysis" / f".experiment-{name}.json"
    if marker.is_file():
        return json.loads(marker.read_text()), True
    command = registry()[name].command
    hint = typing.get_type_hints(command, include_extras=True)["ckpt"]
    many = typing.get_origin(typing.get_args(hint)[0] if typing.get_args(hint) else hint) is list
    printed = io.StringIO()  # anything the command prints: not shown between progress lines
    with contextlib.redirect_stdout(printed):
        returned = command(ckpt=[str(job.run_dir)] if many else str(job.run_dir), **dict(opts))
    result = {"analysis": name, "options": dict(opts), "run": str(job.run_dir), "result": returned}
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(result))
    return result, False


def _worker_init() -> None:
    """A pool worker leaves the terminal's process group, so that a Ctrl-C reaches only the parent, which then
    passes exactly one SIGINT to every worker (stop after the current step, with a checkpoint; a second Ctrl-C
    stops them at once) — also when the signal was sent to the parent alone (`kill -INT`). If the parent dies, the
    worker stops the same way instead of finishing a run nobody waits for, and then exits: no parent will send it
    work or its exit sentinel."""
    import os
    import signal

    if hasattr(os, "setpgrp"):
        os.setpgrp()
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGINT)
        while _RUNNING.is_set():  # the run checkpoints and returns
            time.sleep(0.2)
        os._exit(130)

    threading.Thread(target=watch, name="ssmlm-parent-watch", daemon=True).start()


@contextlib.contextmanager
def _signals_as_ctrl_c():
    """SIGINT and SIGTERM (`kill -INT`, `kill`, a scheduler's notice) stop an experiment as Ctrl-C does: each running
    run after its step, with a checkpoint (a run in this process takes them itself; pool workers get SIGINT). SIGINT
    too is set here, because a job started with `&` from a script inherits it ignored, and `ssmlm pretrain` (its
    CtrlC) takes it all the same."""
    import signal

    main = threading.current_thread() is threading.main_thread()  # handlers can only be set there
    signals = (signal.SIGINT, signal.SIGTERM) if main else ()
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in signals}  # KeyboardInterrupt
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_workers() -> None:
    import multiprocessing
    import os
    import signal

    for p in multiprocessing.active_children():  # the pool's workers: this process starts no others
        if p.pid is not None:
            os.kill(p.pid, signal.SIGINT)


_RUNNING = threading.Event()  # in a pool worker: a run is going


def _timed(job: Job, verbose: bool) -> tuple[dict, bool, float]:
    t0 = time.time()
    _RUNNING.set()
    try:
        result, reused = execute(job, verbose)
    finally:
        _RUNNING.clear()
    return result, reused, time.time() - t0


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    msg = text[0] if text else ""
    return msg if isinstance(e, UserError) else f"{type(e).__name__}: {msg}".rstrip(": ")


# ----------------------------------------------------------------------------- running the plan


def fmt_time(s: float) -> str:
    s = round(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _steps(job: Job) -> int:
    """A pretraining run's training steps (0 for the other kinds, timed per run)."""
    return (job.recipe.train.steps or 0) if job.kind == "pretrain" and job.recipe is not None else 0


class Runner:
    """Runs jobs in order, one line per start and finish (runs done / total, ETA from the finished runs) and one
    per distinct warning a training run recorded (its summary.json's ``warnings``)."""

    def __init__(self, out: Path, total: Counter, jobs: int = 1, verbose: bool = False, echo=print, steps: int = 0):
        self.out, self.jobs, self.verbose, self.echo = out, jobs, verbose, echo
        self.pending = Counter(total)  # kind -> runs not finished yet (the evaluations included)
        # pretraining runs differ in length (a budget sweep: 200 to 3,200 steps), so they are timed per step
        self.pending_steps = steps  # training steps of the pretraining runs not finished yet
        self.step_seconds = [0.0, 0]  # seconds and steps of the pretraining runs that ran
        self.total = sum(total.values())
        self.done: dict[str, Outcome] = {}
        self.jobs_by_key: dict[str, Job] = {}
        self.seconds: dict[str, list[float]] = {}  # kind -> durations of the runs that ran (not reused)
        self.started = 0  # runs started (those not run for a failed dependency count as started)
        self.warnings: list[dict] = []  # each training run's distinct recorded warnings, in the order they came
        self.t0 = time.time()

    def run(self, jobs: list[Job]) -> None:
        """Run ``jobs`` in their order; a free worker takes the first whose dependencies are done (a job whose
        dependency failed is recorded as not run)."""
        for job in jobs:
            self.jobs_by_key[job.key] = job
        queue = list(jobs)
        with _signals_as_ctrl_c():
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
            self.started += 1
            self._finish(job, Outcome(False, error=self.done[failed].error), f"not run: {failed} failed")
        return None

    def _in_process(self, job: Job) -> Outcome:
        try:
            result, reused, dt = _timed(job, self.verbose)
            return Outcome(True, result, dt, reused)
        except (Interrupted, KeyboardInterrupt):
            raise
        except Exception as e:  # recorded: the arm is reported as failed, the others go on
            return self._failed(job, e, traceback.format_exc())

    def _pool(self, queue: list[Job]) -> None:
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        ctx = multiprocessing.get_context("spawn")  # jax is not fork-safe
        with ProcessPoolExecutor(min(self.jobs, len(queue)), mp_context=ctx, initializer=_worker_init) as pool:
            futures = {}

            def fill() -> None:  # one run per free worker, so that "start" is printed when a run starts
                while len(futures) < self.jobs and (job := self._next(queue)) is not None:
                    self._start(job)
                    futures[pool.submit(_timed, job, self.verbose)] = job

            fill()
            try:
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
            except (Interrupted, KeyboardInterrupt):
                _signal_workers()  # each stops after its current step and writes a checkpoint
                while True:
                    try:
                        pool.shutdown(wait=True, cancel_futures=True)
                        break
                    except KeyboardInterrupt:  # a second Ctrl-C: the workers stop at once
                        _signal_workers()
                raise

    def _failed(self, job: Job, e: BaseException, trace: str) -> Outcome:
        log = self.out / "errors" / (job.key.replace("/", "__") + ".txt")
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(trace)
        return Outcome(False, error=first_line(e))

    def _start(self, job: Job) -> None:
        self.started += 1
        self.echo(f"[{self.started}/{self.total}] start {job.label}")

    def _finish(self, job: Job, o: Outcome, how: str | None = None) -> None:
        self.done[job.key] = o
        self.pending[job.kind] -= 1
        steps = _steps(job)
        self.pending_steps -= steps
        if o.ok and not o.reused:
            self.seconds.setdefault(job.kind, []).append(o.seconds)
            if steps:
                self.step_seconds[0] += o.seconds
                self.step_seconds[1] += steps
        how = how or ("reused" if o.reused else fmt_time(o.seconds))
        what = "done" if o.ok else "FAILED"
        tail = "" if o.ok else f": {o.error}"
        self.echo(f"[{len(self.done)}/{self.total}] {what} {job.label} ({how}){tail}{self.eta()}")
        if o.ok and job.kind in ("pretrain", "finetune"):
            self._warnings(job, o)

    def _warnings(self, job: Job, o: Outcome) -> None:
        """The warnings the run recorded in its summary.json, each once, under its line (the run itself printed
        them only with --verbose, and not when it is reused); kept for results.md."""
        for text in dict.fromkeys(o.result.get("warnings") or []):
            self.warnings.append({"arm": job.arm, "seed": job.seed, "stage": job.kind, "run": job.label,
                                  "run_dir": str(job.run_dir), "warning": text})  # fmt: skip
            if not self.verbose or o.reused:
                self.echo(f"  warning: {text}")

    def eta(self) -> str:
        """The pretraining steps left × the seconds per step so far, plus the other runs left × the mean duration
        of their kind's finished runs; a kind none of whose runs has finished yet is named, not guessed."""
        left = sum(self.pending.values())
        if not left:
            return f" · all {self.total} done in {fmt_time(time.time() - self.t0)}"
        est, timed, untimed = 0.0, False, []
        for kind, n in self.pending.items():
            if n <= 0:
                continue
            if kind == "pretrain" and self.step_seconds[1]:
                est += self.pending_steps * self.step_seconds[0] / self.step_seconds[1]
            elif self.seconds.get(kind):
                est += n * sum(self.seconds[kind]) / len(self.seconds[kind])
            else:
                untimed.append(kind)
                continue
            timed = True
        if not timed:
            return f" · {left} to go"
        more = f" + the {', '.join(untimed)} runs (none timed yet)" if untimed else ""
        return f" · {left} to go, ETA {fmt_time(est / max(1, self.jobs))}{more}"


# ----------------------------------------------------------------------------- the experiment


def run_experiment(exp: Experiment, out: Path, jobs: int = 1, verbose: bool = False, echo=print) -> dict:
    """Run (or reuse) every run of ``exp`` under ``out``; the per-arm values and intervals (see report)."""
    from ssmlm.experiment.report import summarize

    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.yaml").write_text(exp.path.read_text(encoding="utf-8"), encoding="utf-8")
    plan = build_plan(exp, out)
    n_eval = len(exp.arms) * len(exp.seeds) if "evaluate" in exp.stages else 0
    n_analyze = sum(len(a["analyze"].analyses) for a in exp.arms.values() if "analyze" in a) * len(exp.seeds)
    pretrain = plan.of_kind("pretrain")
    total = Counter(pretrain=len(pretrain), finetune=len(plan.of_kind("finetune")), evaluate=n_eval,
                    analyze=n_analyze)  # fmt: skip
    grid = f" × {len(exp.points())} grid points" if exp.grid else ""
    n_arms = f"{len(exp.arms)} arm{'s' if len(exp.arms) > 1 else ''}"
    echo(f"experiment {exp.name}: {n_arms} × {len(exp.seeds)} seed{'s' if len(exp.seeds) > 1 else ''}{grid}, "
         f"{sum(total.values())} runs under {out}, seed by seed")  # fmt: skip
    runner = Runner(out, total, jobs, verbose, echo, steps=sum(_steps(j) for j in pretrain))
    runner.run(plan.jobs)
    chosen, grids = select(exp, plan, runner.done)
    if exp.grid:  # the selection needed every seed's finetuning runs
        runner.run(later_jobs(exp, plan, chosen))
    arms = {arm: collect_arm(exp, plan, runner, arm, chosen[arm], grids.get(arm)) for arm in exp.arms}
    return summarize(exp, arms, time.time() - runner.t0, runner.warnings)


def metric_value(exp: Experiment, result: dict, stage: str | None = None) -> float:
    """The metric's field in a run's result: an evaluation's metrics, or a training run's final validation."""
    stage = stage or exp.metric.stage
    found = (result.get("metrics") if stage == "evaluate" else result.get("validation")) or {}
    v = found.get(exp.metric.field)
    if not isinstance(v, int | float) or isinstance(v, bool):
        where = "evaluation" if stage == "evaluate" else f"{stage} run's final validation"
        raise UserError(f"metric {exp.metric}: the {where} has no '{exp.metric.field}' "
                        f"(has {', '.join(found) or 'no metrics'})")  # fmt: skip
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
    out = {"status": "failed" if errors else "ok", "error": errors[0] if errors else None, "values": values,
           "runs": runs}  # fmt: skip
    if grid is not None:
        out["selected"] = point_label(exp.points()[pi])
        out["grid"] = grid
    return out
