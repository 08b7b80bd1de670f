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

Modules: ``bars`` (progress_bar, its columns, phase), ``clock`` (the pace and ETA), ``spinner`` (activity) and
``console`` (the shared console and the timings of plain output).
"""

from ssmlm.progress.bars import FittedProgress, phase, progress_bar
from ssmlm.progress.clock import Clock, clock_time, rate_text, time_left
from ssmlm.progress.console import LOG_EVERY_S, PLAIN_AFTER_S, SLOW_START_S, console, stderr_console
from ssmlm.progress.spinner import Spin, activity

# what the rest of ssmlm imports from here; each module's other names are its own
__all__ = [
    "LOG_EVERY_S",
    "PLAIN_AFTER_S",
    "SLOW_START_S",
    "Clock",
    "FittedProgress",
    "Spin",
    "activity",
    "clock_time",
    "console",
    "phase",
    "progress_bar",
    "rate_text",
    "stderr_console",
    "time_left",
]
