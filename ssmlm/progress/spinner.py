"""``activity``: a spinner with the elapsed time for work without a count (loading, compiling); a background one
covers a command's start and steps aside while other bars and spinners are up."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner as RichSpinner
from rich.text import Text

from ssmlm.progress.clock import clock_time
from ssmlm.progress.console import PLAIN_AFTER_S, stderr_console


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


def display_started(display: object) -> None:
    _DISPLAYS.append(display)
    for spin in _BACKGROUND:
        if spin is not display:
            spin.show(False)


def display_ended(display: object) -> None:
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
        self.live = Live(
            RichSpinner("dots", text=text, style="status.spinner"),
            console=console,
            transient=True,
            refresh_per_second=12.5,
            redirect_stdout=sys.stdout.isatty() and not background,
        )

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
                display_started(self)  # first: a live display started inside another is drawn within it
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
            display_ended(self)


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
