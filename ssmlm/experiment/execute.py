"""Running one job of the plan in this process, by the functions the CLI calls: a training run through
ssmlm.train.drive, an evaluation as `ssmlm evaluate` writes it (RUN/eval/TASK-SPLIT.json), an analysis as
`ssmlm analyze NAME --ckpt RUN` does. A run whose summary.json (an analysis whose marker) exists is reused, unless
it says the run failed (it runs again and fails again, or not, as it will), and an
evaluation whose JSON exists and scored the job's limit at the run's final step (`ssmlm evaluate` by hand writes
the same file); an unfinished training run resumes from its newest checkpoint (the driver's own rule)."""

from __future__ import annotations

import json
import threading
import time

from ssmlm import staging
from ssmlm.experiment.plan import Job


def execute(job: Job, verbose: bool = False) -> tuple[dict, bool]:
    """Run (or reuse) one job in this process: (summary or evaluation result, reused?)."""
    from ssmlm.progress import console

    quiet, console.quiet = console.quiet, console.quiet or not verbose
    try:
        return _execute(job, verbose)
    finally:
        console.quiet = quiet
        staging.sync(job.run_dir)  # an experiment in a bucket: the run's records there as soon as it ends


def reusable(job: Job) -> dict | None:
    """What the job left when it ran before and is reused as it is (its summary or result), or None: it is to run.
    `experiment --dry-run` asks the same, to count what is left."""
    if job.kind == "analyze":
        marker = job.run_dir / "analysis" / f".experiment-{job.analysis[0]}.json"
        return json.loads(marker.read_text()) if marker.is_file() else None
    if job.kind == "evaluate":
        if not (job.run_dir / "summary.json").is_file():  # the run it scores has not run yet
            return None
        path = _evaluation_path(job)
        return done if path.is_file() and not _stale(done := json.loads(path.read_text()), job) else None
    path = job.run_dir / "summary.json"
    # a run that failed (diverged) is no result: it runs again, from its newest (finite) checkpoint
    return done if path.is_file() and "failed" not in (done := json.loads(path.read_text())) else None


def _execute(job: Job, verbose: bool) -> tuple[dict, bool]:
    if (done := reusable(job)) is not None:
        return done, True
    if job.kind == "evaluate":
        return _evaluate(job)
    if job.kind == "analyze":
        return _analyze(job)
    from ssmlm.analyze.plots import LossPlot
    from ssmlm.train import drive

    kw = {"init": job.init} if job.kind == "finetune" else {}
    fn = drive.finetune if job.kind == "finetune" else drive.pretrain
    return fn(job.recipe, job.run_dir, quiet=not verbose, hooks=[LossPlot(job.run_dir)], **kw), False


def _evaluation_path(job: Job):
    from ssmlm.display.printouts import result_name  # the file `ssmlm evaluate` writes
    from ssmlm.runs import open_run

    run = open_run(job.run_dir)
    return run.dir / "eval" / result_name(job.task or run.info.get("task") or run.kind, job.split, job.entries)


def _evaluate(job: Job) -> tuple[dict, bool]:
    from ssmlm.checkpoint_eval.run import evaluate_run  # what `ssmlm evaluate` runs
    from ssmlm.runs import atomic_write, open_run

    run, path = open_run(job.run_dir), _evaluation_path(job)
    result = evaluate_run(
        run, job.task, split=job.split, batch_size=job.batch_size, limit=job.limit, entries=job.entries
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(result, indent=2))
    return result, False


def _stale(result: dict, job: Job) -> bool:
    """An evaluation of other settings than the job's: another limit (one run by hand with --limit), or an
    earlier step than the run's last (the run was trained on after it). Results without the fields are older
    files and are taken as they are."""
    if result.get("limit", job.limit) != job.limit:
        return True
    summary = job.run_dir / "summary.json"
    final = json.loads(summary.read_text()).get("final_step") if summary.is_file() else None
    return final is not None and result.get("step", final) != final


def _analyze(job: Job) -> tuple[dict, bool]:
    """`ssmlm analyze NAME --ckpt RUN` (output in RUN/analysis); a marker there records that it ran."""
    import contextlib
    import io
    import typing

    from ssmlm.analyze import registry

    name, opts = job.analysis
    marker = job.run_dir / "analysis" / f".experiment-{name}.json"
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


RUNNING = threading.Event()  # a run is going (in a pool worker, its parent watch waits for it to stop)


def timed(job: Job, verbose: bool) -> tuple[dict, bool, float]:
    t0 = time.time()
    RUNNING.set()
    try:
        result, reused = execute(job, verbose)
    finally:
        RUNNING.clear()
    return result, reused, time.time() - t0
