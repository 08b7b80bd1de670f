"""``progress_bar``: a rich Progress that fits the console, with a steady rate and ETA; ``phase``: what a bar's task
waits on while its count does not move."""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID
from rich.table import Column, Table
from rich.text import Text

from ssmlm.progress.clock import Clock, clock_time, rate_text
from ssmlm.progress.console import BAR_WIDTH, LOG_EVERY_S, SLOW_START_S, stderr_console
from ssmlm.progress.spinner import display_ended, display_started


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

    def __init__(
        self,
        columns: list[ProgressColumn],
        clocks: dict[TaskID, Clock],
        bar: BarColumn | None,
        bar_keep: int,
        skip: int,
        log_every: float | None,
        **kwargs,
    ):
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
            display_started(self)
        super().start()

    def stop(self) -> None:
        super().stop()
        self.stopped = True
        display_ended(self)

    # -- clocks and plain lines ---------------------------------------------------------------------------
    def add_task(
        self,
        description: str,
        start: bool = True,
        total: float | None = 100.0,
        completed: int = 0,
        visible: bool = True,
        **fields,
    ) -> TaskID:
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
    return FittedProgress(
        columns,
        clocks,
        bar,
        bar_keep,
        skip,
        None if quiet or terminal else log_every,
        console=console,
        disable=quiet or not terminal,
        refresh_per_second=4,
        get_time=get_time,
    )


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
