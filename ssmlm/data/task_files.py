"""A local task file (csv, tsv, jsonl/json, parquet) read into columns, with where each row is in the file, so that
a bad value is reported by file and line.

csv and tsv are read here (Python's csv module): a first row that names the columns (the default), or none
(``task.header: false``, `--no-header`), when the columns are named by their 0-based position ("0", "1", …). A
first row that looks like data where column names were expected is refused with the flag to pass, rather than
guessed: a header-less file read with a header would lose its first row and find none of its columns.
"""

from __future__ import annotations

import csv
import dataclasses
import random
from pathlib import Path

from ssmlm.data.labels import as_number
from ssmlm.errors import DataError

KINDS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
csv.field_size_limit(2**31 - 1)  # long documents in one cell


@dataclasses.dataclass
class Table:
    path: Path
    columns: dict[str, list]
    lines: list[int] | None  # each row's line in the file; None: rows are counted (parquet, a JSON list)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()), []))

    def at(self, i: int) -> str:
        """Where row ``i`` is, for a message: 'FILE: line N' (or 'row N')."""
        return f"{self.path}: line {self.lines[i]}" if self.lines else f"{self.path}: row {i + 1}"

    def take(self, rows: list[int]) -> Table:
        cols = {k: [v[i] for i in rows] for k, v in self.columns.items()}
        return Table(self.path, cols, [self.lines[i] for i in rows] if self.lines else None)


def read_task_file(path: str, where: str, header: bool = True, expected: tuple[str, ...] = ()) -> Table:
    """One split's file as columns. ``where`` names the setting it came from (task.train_file); ``expected``: the
    columns the task reads, to tell a header-less csv/tsv from one with other column names."""
    from ssmlm.data.sources import json_rows, load_table

    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"{where} '{path}': no such file")
    kind = KINDS.get(p.suffix)
    if kind is None:
        raise DataError(f"{where} '{path}': unsupported file type; expected one of {sorted(KINDS)}")
    if kind in ("csv", "tsv"):
        return _read_csv(p, kind, header, expected)
    if kind == "json":  # read here, so that a malformed row is reported with its line
        numbered = list(json_rows(p))
        keys = list(dict.fromkeys(k for _, row in numbered for k in row))
        lines = [n for n, _ in numbered] if numbered and numbered[0][0] else None  # 0: items of a JSON list
        return Table(p, {k: [row.get(k) for _, row in numbered] for k in keys}, lines)
    return Table(p, load_table(p, kind).to_dict(), None)


def _read_csv(p: Path, kind: str, header: bool, expected: tuple[str, ...]) -> Table:
    # tsv: tab-separated with no quoting, as GLUE's files are (a quote character is text); csv: quoted as usual
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if kind == "tsv" else {}
    rows, lines = [], []
    try:
        with p.open(encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, **dialect)
            start = 1
            for row in reader:
                if any(cell.strip() for cell in row):
                    rows.append(row)
                    lines.append(start)
                start = reader.line_num + 1
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise DataError(f"{p}: line {reader.line_num}: could not be read as {kind} ({e})") from None
    if not rows:
        raise DataError(f"{p}: holds no rows")
    if kind == "csv" and _tab_separated(rows):
        raise DataError(
            f"{p}: this file looks tab-separated (line {lines[0]} holds tabs, no commas): name it .tsv, or separate "
            "its fields with commas"
        )
    if header:
        names, rows, lines = [c.strip() for c in rows[0]], rows[1:], lines[1:]
        if expected and not set(expected) <= set(names) and _looks_like_data(names, rows):
            shown = ",".join(names)
            shown = shown if len(shown) <= 40 else shown[:39] + "…"
            raise DataError(
                f"{p}: the first row ({shown}) looks like data, not column names; pass {_by_position(rows)} "
                "(task.header: false) to read columns by position, or add a "
                f"header row naming the columns {', '.join(expected)}"
            )
    else:
        names = [str(i) for i in range(len(rows[0]))]
    for row, line in zip(rows, lines, strict=True):
        if len(row) != len(names):
            first = "the header has" if header else "the first row has"
            if len(row) < len(names):
                why = "a field is missing"
            else:  # more fields than names: an unquoted separator inside a text
                why = "quote text holding commas" if kind == "csv" else "a tab inside a text splits it"
            raise DataError(f"{p}: line {line} has {_fields(len(row))}, {first} {len(names)} ({why})")
    return Table(p, {n: [r[j] for r in rows] for j, n in enumerate(names)}, lines)


def _fields(n: int) -> str:
    return f"{n} field" + ("" if n == 1 else "s")


def _tab_separated(rows: list[list[str]]) -> bool:
    """A file read as csv whose rows are one field each, holding tabs: tab-separated under a .csv name."""
    head = rows[:100]
    return all(len(r) == 1 for r in head) and sum("\t" in r[0] for r in head) > len(head) // 2


def _by_position(rows: list[list[str]]) -> str:
    """The flags that read a header-less file: --no-header, and where the label is not the last column (the
    default) but another one looks like labels (labels.label_like; a polarity file with its label first), the
    columns by position."""
    from ssmlm.data.labels import label_like

    width = len(rows[0])
    cols = [[r[j] for r in rows if len(r) == width] for j in range(width)]
    like = [j for j, c in enumerate(cols) if label_like(c)]
    if len(like) != 1 or like[0] == width - 1 or not 1 <= width - 1 <= 2:
        return "--no-header (text first, label last)"
    text = ",".join(str(j) for j in range(width) if j != like[0])
    return f"--no-header --label-field {like[0]} --text-fields {text}"


def _looks_like_data(first: list[str], rows: list[list[str]]) -> bool:
    """A first row is data rather than column names when one of its cells is a number or a value its column
    holds further down (a label such as 'pos' or 1): column names are neither."""
    if any(as_number(c) is not None for c in first):
        return True
    seen = [set() for _ in first]
    for row in rows[:1000]:
        for j, cell in enumerate(row[: len(first)]):
            seen[j].add(cell.strip())
    return any(c and c in s for c, s in zip(first, seen, strict=True))


def positions(n_columns: int, text_fields, label_field, path: Path) -> tuple[tuple[str, ...], str]:
    """A header-less file's text and label columns by 0-based position (given as 0 or "0"); by default the first
    column(s) are text and the last is the label."""

    def pos(v, what: str) -> str:
        s = str(v).strip()
        if not s.isdigit() or int(s) >= n_columns:
            raise DataError(
                f"{what} = {v!r}: {path} has no header, so columns are named by 0-based position (0 to {n_columns - 1})"
            )
        return str(int(s))

    label = pos(label_field, "task.label_field") if label_field is not None else str(n_columns - 1)
    if text_fields:
        return tuple(pos(v, "task.text_fields") for v in text_fields), label
    text = tuple(str(i) for i in range(n_columns) if str(i) != label)
    if not 1 <= len(text) <= 2:
        raise DataError(
            f"{path} has {n_columns} columns and no header: say which hold the text with --text-fields "
            "(0-based positions, e.g. 0 or 0,1) and the label with --label-field"
        )
    return text, label


def hold_out(train: Table, fraction: float, seed: int) -> tuple[Table, Table]:
    """(train, validation): a seeded random ``fraction`` of the training rows held out, both in file order."""
    n = len(train)
    k = max(1, round(n * fraction))
    if k >= n:
        raise DataError(
            f"task.validation_fraction = {fraction}: holds out all {n} rows of {train.path}; "
            "lower it or pass --validation-file"
        )
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return train.take(sorted(order[k:])), train.take(sorted(order[:k]))
