"""The experiment's estimate of the time left, printed after each finished run."""

from __future__ import annotations

import time
from collections import Counter

from ssmlm.experiment.plan import Job
from ssmlm.progress import clock_time, time_left


def steps(job: Job) -> int:
    """A pretraining run's training steps (0 for the other kinds, timed per run)."""
    return (job.recipe.train.steps or 0) if job.kind == "pretrain" and job.recipe is not None else 0


class Eta:
    """The pretraining steps left × the seconds per step so far, plus the other runs left × the mean duration of
    their kind's finished runs; a kind none of whose runs has finished yet is named, not guessed."""

    def __init__(self, total: Counter, steps: int = 0, workers: int = 1):
        self.pending = Counter(total)  # kind -> runs not finished yet (the evaluations included)
        # pretraining runs differ in length (a budget sweep: 200 to 3,200 steps), so they are timed per step
        self.pending_steps = steps  # training steps of the pretraining runs not finished yet
        self.step_seconds = [0.0, 0]  # seconds and steps of the pretraining runs that ran
        self.seconds: dict[str, list[float]] = {}  # kind -> durations of the runs that ran (not reused)
        self.total = sum(total.values())
        self.workers = workers
        self.t0 = time.time()

    def finished(self, job: Job, seconds: float | None) -> None:
        """``job`` is done; ``seconds``: how long it ran (None: it did not run, or was reused)."""
        self.pending[job.kind] -= 1
        n = steps(job)
        self.pending_steps -= n
        if seconds is not None:
            self.seconds.setdefault(job.kind, []).append(seconds)
            if n:
                self.step_seconds[0] += seconds
                self.step_seconds[1] += n

    def estimate(self) -> tuple[float | None, list[str]]:
        """(seconds left, at this many workers; None when no kind left has a measured cost), the kinds left
        that have none."""
        left = sum(n for n in self.pending.values() if n > 0)
        est, timed, untimed = 0.0, False, []
        for kind, n in self.pending.items():
            if n <= 0:
                continue
            if kind == "pretrain" and self.step_seconds[1]:
                more = time_left(self.pending_steps, *self.step_seconds)
            else:
                more = time_left(n, sum(self.seconds.get(kind, ())), len(self.seconds.get(kind, ())))
            if more is None:
                untimed.append(kind)
                continue
            est, timed = est + more, True
        # runs at a time: no more workers than runs left keep busy
        return (est / max(1, min(self.workers, left)) if timed else None), untimed

    def text(self) -> str:
        left = sum(self.pending.values())
        if not left:
            return f" · all {self.total} done in {clock_time(time.time() - self.t0)}"
        est, untimed = self.estimate()
        if est is None:
            return f" · {left} to go"
        more = f" + the {', '.join(untimed)} runs (none timed yet)" if untimed else ""
        return f" · {left} to go, ETA {clock_time(est)}{more}"


def dry_run_estimate(jobs: list[Job], total: Counter, workers: int) -> str:
    """`experiment --dry-run`'s line on time: what is left, from the costs measured by the training runs already
    done in the experiment's folder (their summary.json, whole over all launches), or plainly that there are none.
    Evaluations and analyses are not timed: they are counted, done or left, and named when they are all that is
    left."""
    from ssmlm.experiment.execute import reusable  # what the experiment would reuse

    eta = Eta(total, sum(steps(j) for j in jobs), workers)
    done = 0
    for job in jobs:
        if (summary := reusable(job)) is None:
            continue
        timed = job.kind in ("pretrain", "finetune")
        eta.finished(job, summary.get("seconds_total", summary.get("seconds")) if timed else None)
        done += timed
    left = sum(n for n in eta.pending.values() if n > 0)
    if not left:
        return "time: every run is done already"
    est, untimed = eta.estimate()
    runs = f"{left} run{'s' if left > 1 else ''} to go"
    if est is None and set(untimed) <= {"evaluate", "analyze"}:
        nouns = {"evaluate": ("evaluation", "evaluations"), "analyze": ("analysis", "analyses")}
        kinds = " and ".join(f"{(n := eta.pending[k])} {nouns[k][n > 1]}" for k in untimed)
        return f"time: only {kinds} to go; the estimate times training runs only"
    if est is None:
        return f"time: no measured cost yet for the {runs}: run --seeds 1 first, then ask again"
    more = f", plus the {', '.join(untimed)} runs (none timed yet)" if untimed else ""
    at = f" at --jobs {workers}" if workers > 1 else ""
    return f"time: about {clock_time(est)} for the {runs}{at}{more} (from the {done} done here)"
