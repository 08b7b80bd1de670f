"""A local task's labels: the values its files hold (numbers, text, -1/1, "pos"/"neg") and the one map that turns
them into class ids 0..k-1, or, for a regression task, the numbers they spell.

The map is the training file's distinct values, sorted (numbers numerically, then text), so that every read of
the same file gives the same map: -1 → 0, 1 → 1; "neg" → 0, "pos" → 1. A finetuned run records it
(run.json ``label_names``); evaluation maps with it and predictions are reported in its values. A value is
compared by what it spells: 1, 1.0 and "1" are one label.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

from ssmlm.errors import DataError

SHOWN = 10  # values spelled out in a message or in the label line; the rest are counted
WIDE = 30  # characters of a label the label line shows
NULLS = {"nan", "null"}  # how pandas (NaN in a csv) and JSON writers spell an empty cell
# A label column holds few distinct, short values: more distinct values than MANY (or MANY_SHARE of the rows), or a
# median length over LONG characters, is a text column (a sentence per row), whatever the flags said.
MANY, MANY_SHARE, LONG = 50, 0.2, 30


def as_number(value) -> float | None:
    """The number a label spells (a number, or text such as '-1' or '0.5'); None when it spells none."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        try:
            x = float(value.strip())
        except ValueError:
            return None
        return x if math.isfinite(x) else None
    return None


def missing(value) -> bool:
    """An empty cell: no label (a test row's, or a mistake elsewhere); 'nan' and 'null' are how writers spell one."""
    return (
        value is None
        or (isinstance(value, str) and (not value.strip() or value.strip().lower() in NULLS))
        or (isinstance(value, float) and math.isnan(value))
    )


def blank(value) -> bool:
    """An empty text cell (a text's 'nan' may be the word, so only None, NaN and blanks)."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or (isinstance(value, float) and math.isnan(value))


def require(values: Sequence, field: str, at: Callable[[int], str]) -> None:
    """Every row has a label (a training or validation file's): the first empty cell is refused, as it reads."""
    for i, v in enumerate(values):
        if missing(v):
            reads = f" (the cell reads {v.strip()!r})" if isinstance(v, str) and v.strip() else ""
            raise DataError(f"{at(i)}: no label in column '{field}'{reads}")


def same_spelling(values: Sequence, field: str, at: Callable[[int], str], seen: dict) -> None:
    """Labels that differ only in the spaces around them (' 1' and '1', 'pos ' and 'pos') would be read as one
    label: refused, naming both, rather than merged unseen. ``seen``: stripped label → (spelling, where), shared
    across a task's files."""
    for i, v in enumerate(values):
        if isinstance(v, str) and not missing(v):
            first, where = seen.setdefault(v.strip(), (v, at(i)))
            if first != v:
                raise DataError(
                    f"{at(i)}: label {v!r} in column '{field}' differs from {first!r} ({where}) only in the spaces "
                    "around it; make them one spelling"
                )


def shape(values: Sequence) -> tuple[int, int, int]:
    """(rows with a value, distinct values, median length in characters) of a column."""
    cells = sorted((str(v).strip() for v in values if not missing(v)), key=len)
    return len(cells), len(set(cells)), len(cells[len(cells) // 2]) if cells else 0


def label_like(values: Sequence) -> bool:
    """Whether a column looks like labels: few distinct values (relative to its rows), short ones."""
    rows, distinct, median = shape(values)
    return rows > 0 and distinct <= max(MANY, MANY_SHARE * rows) and median <= LONG


def key(value) -> tuple:
    """What identifies a label, and its place in the sorted map: numbers first by value, then text."""
    x = as_number(value)
    return (0, x, "") if x is not None else (1, 0.0, str(value).strip())


def spell(value, quote: bool = True) -> str:
    """A label as a message shows it: numbers as numbers, text quoted (``quote``), an empty cell as 'missing'."""
    if missing(value):
        return "missing"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if isinstance(value, int | float) or not quote else repr(value)


def cut(text: str) -> str:
    """A label cut to WIDE characters, so that a listing of sentences stays one readable line."""
    return text if len(text) <= WIDE else text[: WIDE - 1] + "…"


def listing(values: Sequence) -> str:
    shown = ", ".join(cut(spell(v)) for v in values[:SHOWN])
    return shown + (f", … ({len(values)} in all)" if len(values) > SHOWN else "")


def label_map(values: Sequence, field: str, where: str, num_labels: int | None, at: Callable[[int], str]) -> list:
    """The sorted distinct labels of a training file (each as the file first spells it); ``num_labels`` (given by
    the user, else None) must be their count."""
    first: dict[tuple, object] = {}
    for i, v in enumerate(values):
        if missing(v):
            raise DataError(f"{at(i)}: no label in column '{field}'")
        first.setdefault(key(v), v)
    names = [first[k] for k in sorted(first)]
    if num_labels is not None and num_labels != len(names):
        raise DataError(
            f"--num-labels {num_labels} (task.num_labels), but {where} holds {len(names)} distinct "
            f"label(s) in column '{field}': {listing(names)}"
        )
    if len(names) < 2:
        raise DataError(
            f"{where}: column '{field}' holds one label only ({listing(names)}); a classifier needs at "
            "least two (for regression pass --num-labels 1)"
        )
    fractional = next((v for v in names if (x := as_number(v)) is not None and not x.is_integer()), None)
    if num_labels is None and fractional is not None:
        raise DataError(
            f"{where}: column '{field}' holds numbers that are not whole ({spell(fractional)}); for "
            f"regression pass --num-labels 1, to use its {len(names)} values as classes "
            f"--num-labels {len(names)}"
        )
    return names


def to_ids(values: Sequence, names: Sequence, field: str, at: Callable[[int], str], optional: bool) -> list[int]:
    """Class ids of ``values`` by the map ``names``; an empty cell is -1 where labels are ``optional`` (a test
    file's), a mistake elsewhere; a value the map lacks is one."""
    index = {key(v): i for i, v in enumerate(names)}
    ids = []
    for i, v in enumerate(values):
        if missing(v):
            if not optional:
                raise DataError(f"{at(i)}: no label in column '{field}'")
            ids.append(-1)
        elif (c := index.get(key(v))) is None:
            raise DataError(
                f"{at(i)}: label {spell(v)} in column '{field}' is not one of the training labels ({listing(names)})"
            )
        else:
            ids.append(c)
    return ids


def to_class_ids(values: Sequence, num_labels: int, field: str, at: Callable[[int], str], optional: bool) -> list:
    """Labels that are already class ids (a known task's file read without its training file: evaluation of a
    hub-trained run on a local file): whole numbers in [0, num_labels); empty or -1 where ``optional``."""
    ids = []
    for i, v in enumerate(values):
        x = None if missing(v) else as_number(v)
        if optional and (missing(v) or x == -1):
            ids.append(-1)
        elif x is None or not x.is_integer() or not 0 <= x < num_labels:
            raise DataError(f"{at(i)}: label {spell(v)} in column '{field}': expected a class id 0 to {num_labels - 1}")
        else:
            ids.append(int(x))
    return ids


def to_numbers(values: Sequence, field: str, at: Callable[[int], str], optional: bool) -> list[float]:
    """A regression task's labels as numbers; an empty cell is NaN (unscored) where ``optional``."""
    out = []
    for i, v in enumerate(values):
        if missing(v) and optional:
            out.append(math.nan)
        elif (x := as_number(v)) is None:
            raise DataError(
                f"{at(i)}: label {spell(v)} in column '{field}' is not "
                "a number; a regression task (num_labels = 1) needs numeric labels"
            )
        else:
            out.append(x)
    return out


def balance(names: Sequence, ids: Sequence[int]) -> str:
    """``labels: -1 → 0 (1,402), 1 → 1 (1,398)``: the map and how many training rows each class has (the first
    SHOWN classes, each cut to WIDE characters: one line however many or long the labels)."""
    counts = Counter(ids)
    parts = [f"{cut(spell(v, quote=False))} → {i} ({counts.get(i, 0):,})" for i, v in enumerate(names[:SHOWN])]
    more = f", … and {len(names) - SHOWN:,} more" if len(names) > SHOWN else ""
    return "labels: " + ", ".join(parts) + more


def typed(values: list) -> list:
    """A text column's cells as numbers when every one spells a number (a csv's -1/1 labels are the numbers
    -1 and 1, as a JSON file's would be), whole numbers as int; otherwise the cells as they are."""
    numbers = [None if missing(v) else as_number(v) for v in values]
    if any(x is None and not missing(v) for x, v in zip(numbers, values, strict=True)):
        return values
    return [None if x is None else int(x) if x.is_integer() else x for x in numbers]
