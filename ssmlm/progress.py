"""Rich progress bars, shared by every long-running command."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)


def progress_bar(quiet: bool = False, *fields: str) -> Progress:
    """A bar with count, rate-derived ETA and any extra ``task.fields`` given by name (e.g. loss)."""
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        *[TextColumn(f"{f} {{task.fields[{f}]}}") for f in fields],
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]
    # On a non-terminal (CI logs) rich prints nothing for transient bars; keep it quiet there.
    disable = quiet or not sys.stderr.isatty()
    return Progress(*columns, console=console, disable=disable, refresh_per_second=4)
