"""A bar's pace and ETA (Clock), the time left at a measured pace (time_left), and how a duration and a rate read."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class Clock:
    """A task's pace (seconds per unit) over its latest ``WINDOW`` blocks, where a block is the moves since the
    previous block's end, closed at the first move at least ``BLOCK_S`` seconds after it began: their seconds over
    their units, each block's seconds capped at ``CAP`` times the median block's pace. Moves up to the end of the
    ``skip``-th one are left out (they include compilation).

    Why blocks: a training loop dispatches steps asynchronously, so its count moves in bursts (eight steps in a
    millisecond, then a wait for the device); one move's time says nothing, a second's worth does. Why the cap: one
    slow block (another process, a garbage collection) passes without moving the ETA, as under a median, while a
    slowness that recurs (a sync every ten steps) still counts, which a median would leave out. Time while
    ``pause``d (an evaluation, a checkpoint save: see ``phase``) is left out, so the ETA is of the work the count
    measures and holds still meanwhile. Rate and ETA change only at a move."""

    added: float  # the time the task was added
    start: float  # its completed count then
    skip: int
    moves: int = 0
    last: tuple[float, float] | None = None  # (active time, completed) at the latest move
    block: tuple[float, float] | None = None  # (active time, completed) where the open block began
    blocks: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=Clock.WINDOW))  # (s, units)
    paused: float = 0.0  # seconds paused before the current pause
    since: float | None = None  # when the current pause began
    depth: int = 0  # pauses open (phases may nest)

    WINDOW: ClassVar[int] = 30
    BLOCK_S: ClassVar[float] = 1.0
    CAP: ClassVar[float] = 4.0

    def __post_init__(self):
        if self.skip == 0:
            self.block = (self.added, self.start)

    def active(self, now: float) -> float:
        """``now`` less the time paused so far."""
        return (self.since if self.since is not None else now) - self.paused

    def pause(self, now: float) -> None:
        self.depth += 1
        if self.depth == 1:
            self.since = now

    def resume(self, now: float) -> None:
        self.depth = max(self.depth - 1, 0)
        if self.depth == 0 and self.since is not None:
            self.paused += now - self.since
            self.since = None

    def see(self, completed: float, now: float) -> None:
        if completed <= (self.start if self.last is None else self.last[1]):
            return
        self.moves += 1
        t = self.active(now)
        self.last = (t, completed)
        if self.moves == self.skip:
            self.block = self.last
        elif self.block is not None and t - self.block[0] >= self.BLOCK_S:
            self.blocks.append((t - self.block[0], completed - self.block[1]))
            self.block = self.last

    def measured(self) -> tuple[float, float]:
        """(seconds, units) of the blocks measured, each block's seconds capped; (0, 0) before the first."""
        if not self.blocks:
            return 0.0, 0.0
        cap = self.CAP * statistics.median(s / n for s, n in self.blocks)
        return sum(min(s, cap * n) for s, n in self.blocks), sum(n for _, n in self.blocks)

    def pace(self) -> float | None:
        """Seconds per unit (None until a block is measured)."""
        seconds, units = self.measured()
        return seconds / units if units else None

    def rate(self) -> float | None:
        """Units per second."""
        pace = self.pace()
        return None if pace is None else 1 / max(pace, 1e-12)

    def eta(self, completed: float, total: float | None) -> float | None:
        return None if total is None else time_left(total - completed, *self.measured())


def time_left(left: float, seconds: float, done: float) -> float | None:
    """Seconds that ``left`` more units take at the pace measured so far, ``seconds`` for ``done`` units (None when
    nothing is measured yet, 0 when nothing is left): a bar's ETA and an experiment's (ssmlm.experiment.eta)."""
    if left <= 0:
        return 0.0
    return left * seconds / done if done else None


def clock_time(seconds: float | None) -> str:
    """A duration as a clock shows it, H:MM:SS ("-:--:--": not known): the bars' elapsed time and ETA, and every
    duration ssmlm prints (a run's wall time, an experiment's time left)."""
    if seconds is None:
        return "-:--:--"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def rate_text(rate: float | None) -> str:
    if rate is None:
        return "-/s"
    if rate >= 1:
        return f"{rate:,.1f}/s" if rate < 100 else f"{rate:,.0f}/s"
    return f"{1 / rate:,.1f}s/it"
