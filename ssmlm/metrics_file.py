"""A run's metrics.jsonl read back: one JSON object per line, written by the training loop (ssmlm.train.logs)."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    """The file's rows, in order (none when there is no file). A line that is not a JSON object is left out: a kill
    while a row was written leaves the last line cut short, and the rows before it are whole."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
