"""Rich progress bars, shared by every long-running command.

``progress_bar`` gives a ``rich`` Progress that
- fits the console's width: when the columns do not fit, the least useful ones are left out whole (percentage,
  elapsed time, rate, the bar, then the caller's fields from the last) instead of being cut to "59/…";
- measures its rate and ETA from the end of the first ``skip`` updates on, so a first step's compilation does
  not count (a compiled step that took 20 s once says nothing about the next thousand), as the median pace of
  its recent seconds (Clock), so that bursts of asynchronously dispatched steps and a stray slow step do not
  swing it, and with the time of its ``phase``s (evaluations, checkpoint saves) left out: the ETA holds still
  while they run;
- without a terminal (a log file, CI) prints a plain line about every ``log_every`` seconds, one as soon as the
  first update ends after a slow start (compilation), and one at the end when it printed any before.

``activity`` is the same for work without a count (loading, compiling): a spinner with the elapsed time; a
``background`` one covers a command's start and steps aside while other bars and spinners are up. ``phase``
names what a bar's task waits on while its count does not move (an evaluation, a compile, a save).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from abc import abstractmethod
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID
from rich.spinner import Spinner as RichSpinner
from rich.table import Column, Table
from rich.text import Text

console = stderr_console = Console(stderr=True)  # the console every command prints its progress and notes on

LOG_EVERY_S = 30.0  # without a terminal: seconds between progress lines
SLOW_START_S = 2.0  # without a terminal: a first update later than this gets its own line (it ended a compile)
PLAIN_AFTER_S = 2.0  # without a terminal: a background activity's line, once it has run this long
BAR_WIDTH = (10, 40)  # the bar's narrowest and widest; narrower than 10 it is left out


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

    def pace(self) -> float | None:
        """Seconds per unit (None until a block is measured)."""
        if not self.blocks:
            return None
        cap = self.CAP * statistics.median(s / n for s, n in self.blocks)
        return sum(min(s, cap * n) for s, n in self.blocks) / sum(n for _, n in self.blocks)

    def rate(self) -> float | None:
        """Units per second."""
        pace = self.pace()
        return None if pace is None else 1 / max(pace, 1e-12)

    def eta(self, completed: float, total: float | None) -> float | None:
        if total is not None and completed >= total:
            return 0.0
        pace = self.pace()
        return None if pace is None or total is None else (total - completed) * pace


def clock_time(seconds: float | None) -> str:
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


class Field(ProgressColumn):
    """One of the fitted columns: its text from the task (``text``) and how long it survives a narrow console
    (``keep``: the higher, the later it is left out)."""

    def __init__(self, keep: int, style: str = ""):
        super().__init__(table_column=Column(no_wrap=True))
        self.keep, self.style = keep, style

    @abstractmethod
    def text(self, task: Task) -> str: ...

    def render(self, task: Task) -> Text:
        return Text(self.text(task), style=self.style)


class Description(Field):
    def text(self, task):
        return task.description


class Count(Field):
    def text(self, task):
        done = int(task.completed)
        if task.total is None:
            return f"{done}"
        total = f"{int(task.total)}"
        return f"{done:>{len(total)}}/{total}"


class Percent(Field):
    def text(self, task):
        return f"{task.percentage:>3.0f}%" if task.total else ""


class Named(Field):
    """A ``task.fields`` value under its name, e.g. "loss 3.2104"; a rate's unit follows its value, as it is
    read aloud ("294,129 tokens/s"), and is left out until it has one (not "- tokens/s")."""

    def __init__(self, name: str, keep: int):
        super().__init__(keep)
        self.name = name

    def text(self, task):
        value = task.fields.get(self.name, "-")
        if not self.name.endswith("/s"):
            return f"{self.name} {value}"
        return "" if value == "-" else f"{value} {self.name}"


class Elapsed(Field):
    def text(self, task):
        return clock_time(task.elapsed or 0.0)


class Steady(Field):
    """Rate or ETA from the task's Clock (kept by the FittedProgress that owns the column)."""

    def __init__(self, clocks: dict[TaskID, Clock], what: str, keep: int, style: str = ""):
        super().__init__(keep, style)
        self.clocks, self.what = clocks, what

    def text(self, task):
        clock = self.clocks.get(task.id)
        if self.what == "rate":
            return rate_text(clock.rate() if clock else None)
        return "eta " + clock_time(clock.eta(task.completed, task.total) if clock else None)


class FittedProgress(Progress):
    """A Progress whose row holds only the columns that fit the console whole (see the module doc), with a Clock
    per task and, where disabled for want of a terminal, plain lines (``log_every``)."""

    def __init__(self, columns: list[ProgressColumn], clocks: dict[TaskID, Clock], bar: BarColumn | None,
                 bar_keep: int, skip: int, log_every: float | None, **kwargs):  # fmt: skip
        self.clocks, self.bar, self.bar_keep, self.skip, self.log_every = clocks, bar, bar_keep, skip, log_every
        super().__init__(*columns, **kwargs)  # renders once: the attributes above first
        self.printed: dict[TaskID, float] = {}  # task -> when its last plain line was printed
        self.stopped = False

    # -- layout ------------------------------------------------------------------------------------------
    def fit(self, cells: dict[ProgressColumn, list[Text]], width: int) -> tuple[list[ProgressColumn], int]:
        """The columns to show, in their order, and the bar's width (0: no bar) for rows of ``cells``."""
        keep = dict.fromkeys(c for c in cells if any(t.cell_len for t in cells[c]))  # an empty column takes no room
        if self.bar is not None:
            keep[self.bar] = None

        def need() -> int:  # the columns' widths, the bar at its narrowest, one space between columns
            texts = sum(max(t.cell_len for t in cells[c]) for c in keep if c is not self.bar)
            return texts + (BAR_WIDTH[0] if self.bar in keep else 0) + len(keep) - 1

        rank = lambda c: self.bar_keep if c is self.bar else getattr(c, "keep", 0)  # noqa: E731
        while len(keep) > 1 and need() > width:
            del keep[min(keep, key=rank)]
        bar = min(BAR_WIDTH[1], width - need() + BAR_WIDTH[0]) if self.bar in keep else 0
        return [c for c in self.columns if c in keep], bar

    def make_tasks_table(self, tasks) -> Table:
        tasks = [t for t in tasks if t.visible]
        text_columns = [c for c in self.columns if isinstance(c, ProgressColumn) and c is not self.bar]
        cells = {c: [c(t) for t in tasks] for c in text_columns}
        if not tasks:
            return Table.grid()
        shown, bar_width = self.fit(cells, self.console.width)
        if self.bar in shown:
            self.bar.bar_width = bar_width
            cells[self.bar] = [self.bar(t) for t in tasks]
        columns = [Column(no_wrap=True, width=bar_width if c is self.bar else None) for c in shown]
        table = Table.grid(*columns, padding=(0, 1))
        for i in range(len(tasks)):
            table.add_row(*(cells[c][i] for c in shown))
        return table

    def start(self) -> None:
        if not self.disable:  # a background spinner (activity) steps aside while the bar is up (not for a hidden one)
            _display_started(self)
        super().start()

    def stop(self) -> None:
        super().stop()
        self.stopped = True
        _display_ended(self)

    # -- clocks and plain lines ---------------------------------------------------------------------------
    def add_task(self, description: str, start: bool = True, total: float | None = 100.0, completed: int = 0,
                 visible: bool = True, **fields) -> TaskID:  # fmt: skip
        task_id = super().add_task(description, start, total, completed, visible, **fields)
        self.clocks[task_id] = Clock(self.get_time(), completed, self.skip)
        return task_id

    def update(self, task_id: TaskID, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._moved(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._moved(task_id)

    def pause(self, task_id: TaskID) -> None:
        """Leave the time from now until ``resume`` out of the task's rate and ETA (they hold meanwhile)."""
        if task_id in self.clocks:
            self.clocks[task_id].pause(self.get_time())

    def resume(self, task_id: TaskID) -> None:
        if task_id in self.clocks:
            self.clocks[task_id].resume(self.get_time())

    def _moved(self, task_id: TaskID) -> None:
        task, clock, now = self._tasks[task_id], self.clocks.get(task_id), self.get_time()
        if clock is None:
            return
        moves = clock.moves
        clock.see(task.completed, now)
        if self.log_every is None or clock.moves == moves:
            return
        last = self.printed.get(task_id)
        first_after_slow_start = moves == 0 and now - clock.added >= SLOW_START_S
        finished = task.total is not None and task.completed >= task.total and last is not None
        if first_after_slow_start or finished or now - (last if last is not None else clock.added) >= self.log_every:
            self.printed[task_id] = now
            self.console.print(Text(self.line(task)), soft_wrap=True)

    def line(self, task: Task) -> str:
        """The plain progress line of ``task``: what each shown column would say, the bar left out."""
        parts = [c.text(task) for c in self.columns if isinstance(c, Field)]
        return " ".join(p for p in parts if p)


def progress_bar(
    quiet: bool = False,
    *fields: str,
    skip: int = 2,
    log_every: float = LOG_EVERY_S,
    console: Console | None = None,
    rate: bool = True,
    get_time: Callable[[], float] | None = None,
) -> FittedProgress:
    """A bar with count, steady rate and ETA and any extra ``task.fields`` given by name (e.g. loss; one named
    like a rate, "tokens/s", reads "294,129 tokens/s"), which fits the console's width; ``skip``: updates left
    out of the rate (they compile); ``rate``: False leaves the count's own rate out (when a field says it better).
    Without a terminal the bar is off and a plain line is printed every ``log_every`` seconds (see the module
    doc); ``quiet``: nothing. ``get_time``: the clock (default time.monotonic; tests pass their own)."""
    console = console or stderr_console
    clocks: dict[TaskID, Clock] = {}
    named = [Named(f, 70 - 5 * i) for i, f in enumerate(fields)]
    columns = [
        Description(100, "bold"),
        bar := BarColumn(),
        Count(90, "green"),
        Percent(20, "magenta"),
        *named,
        *([Steady(clocks, "rate", 40)] if rate else []),
        Elapsed(30, "yellow"),
        Steady(clocks, "eta", 85, "cyan"),
    ]
    terminal = console.is_terminal
    bar_keep = 62  # the bar is left out before the first two fields, after the others
    return FittedProgress(columns, clocks, bar, bar_keep, skip, None if quiet or terminal else log_every,
                          console=console, disable=quiet or not terminal, refresh_per_second=4,
                          get_time=get_time)  # fmt: skip


@contextmanager
def phase(bar: FittedProgress, task: TaskID, label: str, after: float | None = None) -> Iterator[Phase]:
    """Work inside a bar's task that moves no count (an evaluation, a compile, a checkpoint save), left out of
    its rate and ETA, which hold meanwhile. On a terminal the task's description reads "description: label" while
    it runs; without one, a plain line "description n/total:
    label…" once it has run ``after`` seconds (default SLOW_START_S), and one with its time when it ends.
    Yields the Phase: ``.set(label)`` moves on to its next part (also from a worker thread); after the context's
    end such calls change nothing (work dropped on a Ctrl-C may go on unobserved)."""
    current = Phase(bar, task, SLOW_START_S if after is None else after)
    bar.pause(task)  # the time it takes is not the count's: the rate and ETA hold (Clock)
    current.set(label)
    try:
        yield current
    finally:
        current.end()
        bar.resume(task)


class Phase:
    """See ``phase``."""

    def __init__(self, bar: FittedProgress, task: TaskID, after: float):
        self.bar, self.task, self.after = bar, task, after
        self.base = bar._tasks[task].description
        self.plain = bar.log_every is not None  # no terminal, not quiet: plain lines
        self.lock = threading.Lock()
        self.label, self.since, self.timer, self.printed, self.ended = "", 0.0, None, False, False

    def set(self, label: str) -> None:
        with self.lock:
            if self.ended:
                return
            self._close_part()
            self.label, self.since, self.printed = label, time.monotonic(), False
            if self.plain:
                self.timer = threading.Timer(self.after, self._slow, args=(label,))
                self.timer.daemon = True
                self.timer.start()
            elif not self.bar.disable:
                self.bar.update(self.task, description=f"{self.base}: {label}")

    def end(self) -> None:
        with self.lock:
            if self.ended:
                return
            self._close_part()
            self.ended = True
            if not self.plain and not self.bar.disable:
                self.bar.update(self.task, description=self.base)

    def _slow(self, label: str) -> None:
        with self.lock:
            if not self.ended and label == self.label and not self.bar.stopped:
                self.printed = True
                self._say(f"{label}…")

    def _close_part(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.printed:
            self._say(f"{self.label} took {time.monotonic() - self.since:.1f} s")

    def _say(self, what: str) -> None:
        task = self.bar._tasks[self.task]
        count = f" {int(task.completed)}/{int(task.total)}" if task.total else ""
        self.bar.console.print(Text(f"{self.base}{count}: {what}"), soft_wrap=True)


@contextmanager
def activity(
    label: str,
    quiet: bool = False,
    console: Console | None = None,
    background: bool = False,
    plain_after: float | None = PLAIN_AFTER_S,
) -> Iterator[Spin]:
    """A spinner with the elapsed time while work without a count runs (on a terminal; quiet: none). Yields the
    spinner: calling it ends it early (e.g. when the first output is ready to be written); ``.label`` may change.

    ``background``: a spinner for a command's start (imports, opening the run), over work that may show its own
    bars and spinners: it steps aside while they are up and comes back when they end; without a terminal its
    label is printed as a plain line once it has run ``plain_after`` seconds (None: never; a quick refusal stays
    one line), and each new label after that."""
    console = console or stderr_console
    spin = Spin(label, console, enabled=not quiet and console.is_terminal, background=background)
    if background and not quiet and not console.is_terminal and plain_after is not None:
        spin.plain_after(plain_after)
    stdout = sys.stdout
    if background:
        _BACKGROUND.append(spin)
        if spin.enabled and stdout.isatty():
            sys.stdout = _EndsSpin(stdout, spin)
    spin.show(not _shown_over(spin))
    try:
        yield spin
    finally:
        spin()
        if background:
            _BACKGROUND.remove(spin)
            if isinstance(sys.stdout, _EndsSpin):
                sys.stdout = stdout


_BACKGROUND: list[Spin] = []  # background spinners (activity), hidden while another display is up
_DISPLAYS: list[object] = []  # the bars and foreground spinners up now


def _shown_over(spin: Spin) -> bool:
    return spin in _BACKGROUND and bool(_DISPLAYS)


def _display_started(display: object) -> None:
    _DISPLAYS.append(display)
    for spin in _BACKGROUND:
        if spin is not display:
            spin.show(False)


def _display_ended(display: object) -> None:
    if display in _DISPLAYS:
        _DISPLAYS.remove(display)
    if not _DISPLAYS:
        for spin in _BACKGROUND:
            spin.show(True)


class Spin:
    """A transient spinner line, "label 0:00:12", on a terminal. Standard output is printed above it only when it
    is the same terminal (a redirected one keeps its own file); a background one ends at its first write instead
    (_EndsSpin)."""

    def __init__(self, label: str, console: Console, enabled: bool, background: bool = False):
        self._label, self.enabled, self.ended, self.start = label, enabled, False, time.monotonic()
        self.console, self.timer, self.printed = console, None, False
        text = _Ticking(lambda: Text(f"{self.label} {clock_time(time.monotonic() - self.start)}"))
        self.live = Live(RichSpinner("dots", text=text, style="status.spinner"), console=console, transient=True,
                         refresh_per_second=12.5, redirect_stdout=sys.stdout.isatty() and not background)  # fmt: skip

    @property
    def label(self) -> str:
        return self._label

    @label.setter
    def label(self, label: str) -> None:
        self._label = label
        if self.printed and not self.ended:  # without a terminal: each label after the first line, as it comes
            self._print()

    def plain_after(self, seconds: float) -> None:
        """Without a terminal: the label as a plain line once the work has run ``seconds`` (and each new one)."""
        self.timer = threading.Timer(seconds, self._print)
        self.timer.daemon = True
        self.timer.start()

    def _print(self) -> None:
        if not self.ended:
            self.printed = True
            self.console.print(Text(self.label + "…"), soft_wrap=True)

    def show(self, on: bool) -> None:
        if not self.enabled or self.ended or on == self.live.is_started:
            return
        if on:
            if self not in _BACKGROUND:
                _display_started(self)  # first: a live display started inside another is drawn within it
            self.live.start()
        else:
            self.live.stop()

    def __call__(self) -> None:
        """End the spinner (for good)."""
        if self.ended:
            return
        if self.timer is not None:
            self.timer.cancel()
        self.show(False)
        self.ended = True
        if self not in _BACKGROUND:
            _display_ended(self)


class _EndsSpin:
    """Standard output, on the spinner's terminal, while a background spinner is up: the first write ends the
    spinner, so the command's output is not drawn over. (Rich's own redirection does not do: click's echo finds
    the terminal's binary buffer behind it and writes there.)"""

    def __init__(self, stream, spin: Spin):
        self.stream, self.spin = stream, spin
        self.encoding, self.errors = stream.encoding, stream.errors

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            self.spin()
        return self.stream.write(text)

    def __getattr__(self, name: str):  # flush, isatty, fileno, …
        return getattr(self.stream, name)


class _Ticking:
    """A renderable that makes its text afresh at every refresh (the spinner's elapsed time)."""

    def __init__(self, make):
        self.make = make

    def __rich__(self):
        return self.make()
