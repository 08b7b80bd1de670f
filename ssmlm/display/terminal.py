"""How numbers and tables read on a terminal (80 columns included): one format for a metric's value, table
titles that break between words, and any command's nested result (a dict of numbers, paths and lists) as tables.

``metric_text`` is the one place a metric's value is written for a person: counts (``masked_tokens``,
``examples``, ``skipped``: a name whose last word counts things) as integers, other numbers to four decimals.
``titled`` gives a rich Table a title that breaks at spaces only: the table is made wide enough for the title
(up to the console's width), and a single word longer than a line (a deep run path) stands on a line of its own,
shortened from the left with "…" so that its end, the run's name, stays. ``result_tables`` lays out a result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from rich.console import Console
from rich.table import Table
from rich.text import Text

MAX_ROWS = 30  # rows of a list shown in a result's table

# the last word of a metric's name that makes it a count of things (masked_tokens, num_examples, items, ...)
COUNT_WORDS = frozenset(
    "tokens examples items count steps skipped rows documents books questions pairs words chunks shards runs "
    "launches n".split()
)


def is_count(name: str) -> bool:
    words = [w for w in re.split(r"[\s_./-]+", name.lower()) if w]
    return bool(words) and (words[-1] in COUNT_WORDS or words[0] in ("n", "num"))


def metric_text(name: str, value) -> str:
    """``value`` of the metric ``name`` as a person reads it: a count as an integer ("2,275"; a mean of counts
    that is not whole to one decimal), another number to four decimals (four digits and an exponent when it is
    very large or small), anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "–" if value is None else str(value)
    if not math.isfinite(value):
        return str(value)
    if isinstance(value, int) or is_count(name):
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"
    if value and not 1e-3 <= abs(value) < 1e5:  # FLOPs, tiny learning rates: four digits and the exponent
        return f"{value:.4g}"
    return f"{value:.4f}"


def fit_title(title: str, width: int) -> Text:
    """``title`` whose words each fit ``width`` cells: a longer one keeps its end, after "…"."""
    words = [w if len(w) <= width else "…" + w[len(w) - width + 1 :] for w in title.split(" ")]
    return Text(" ".join(words))


def titled(title: str, console: Console | None = None, **kwargs) -> Table:
    """A Table (``kwargs`` as rich's) whose title breaks only between words: at least as wide as the title, up
    to the console's width."""
    width = (console or Console()).width
    text = fit_title(title, width)
    kwargs.setdefault("title_justify", "left")
    return Table(title=text, min_width=min(text.cell_len, width), **kwargs)


# ----------------------------------------------------------------------------- a result as tables


def _scalar(value) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _flat(value, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted name, value) for every scalar under ``value``; a list of scalars is one value, joined."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flat(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, list | tuple) and not all(_scalar(v) for v in value):
        for i, v in enumerate(value):
            yield from _flat(v, f"{prefix}[{i}]")
    elif isinstance(value, list | tuple):
        yield prefix, ", ".join(metric_text(prefix, v) for v in value)
    else:
        yield prefix, value


def _rows_table(title: str, rows: list[dict], console: Console) -> Table:
    """A list of flat records as one table, a column per key (its words apart, so that a narrow column breaks
    between them); the first MAX_ROWS rows, and a caption saying how many more there are."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    more = len(rows) - MAX_ROWS
    t = titled(title, console, caption=f"… {more} more rows (--json: all of them)" if more > 0 else None)
    for k in keys:
        numeric = all(isinstance(r.get(k), int | float) or r.get(k) is None for r in rows)
        t.add_column(k.replace("_", " "), justify="right" if numeric else "left", overflow="fold")
    for r in rows[:MAX_ROWS]:
        t.add_row(*(metric_text(k, r.get(k)) for k in keys))
    return t


def result_tables(result: dict, title: str, console: Console | None = None) -> list[Table]:
    """``result`` as tables: its top-level scalars (and nested dicts, flattened to dotted names) in one
    name/value table under ``title``; each list of records (dicts of scalars) as a table of its own, a column per
    field. Numbers go through ``metric_text``."""
    console = console or Console()
    main = titled(title, console, show_header=False)
    main.add_column("name", overflow="fold")
    main.add_column("value", overflow="fold")
    sections = []
    for key, value in result.items():
        if (
            isinstance(value, list)
            and value
            and all(isinstance(r, dict) and all(map(_scalar, r.values())) for r in value)
        ):
            sections.append(_rows_table(str(key), value, console))
            continue
        for name, v in _flat(value, str(key)):
            main.add_row(name, metric_text(name, v))
    return ([main] if main.row_count else []) + sections
