"""The console every command prints its progress and notes on, and the timings of plain (non-terminal) output."""

from __future__ import annotations

from rich.console import Console

console = stderr_console = Console(stderr=True)  # the console every command prints its progress and notes on

LOG_EVERY_S = 30.0  # without a terminal: seconds between progress lines
SLOW_START_S = 2.0  # without a terminal: a first update later than this gets its own line (it ended a compile)
PLAIN_AFTER_S = 2.0  # without a terminal: a background activity's line, once it has run this long
BAR_WIDTH = (10, 40)  # the bar's narrowest and widest; narrower than 10 it is left out
