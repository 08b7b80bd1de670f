"""The run's two logs, kept by the training loop: metrics.jsonl (``MetricsLog``: a row per logged step,
evaluation and controller update, cut back to the restored checkpoint's step on every start, so that no row is
ever repeated) and launches.json (``Launches``: the run's starts and the seconds each trained, for the summary)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ssmlm import staging
from ssmlm.errors import UserError
from ssmlm.metrics_file import read_metrics
from ssmlm.runs import atomic_write
from ssmlm.train.hooks import emit


class MetricsLog:
    """metrics.jsonl, appended to row by row; each row also goes to the ``listeners``' on_record (the hooks)."""

    def __init__(self, path: Path, enabled: bool = True, listeners: list | None = None):
        self.path = path
        self.enabled = enabled
        self.listeners = listeners if listeners is not None else []
        self.size: int | None = None  # bytes the log holds as this run left it (None: not yet known)

    def rows(self) -> list[dict]:
        """The rows written so far; a line cut short by a kill (only ever the last) is left out."""
        return [row for row in read_metrics(self.path) if isinstance(row.get("step"), int)]

    def restart(self, step: int | None) -> None:
        """Keep only the rows up to ``step``, the restored checkpoint's (None: no row), training, validation and
        controller rows alike: the steps after it are trained (and logged) again. Written to a temporary file and
        renamed over the log, so a kill at any moment leaves either the old log or the cut one."""
        if not self.enabled:
            return
        if not self.path.exists():
            self.size = 0
            return
        keep = [row for row in self.rows() if step is not None and row["step"] <= step]
        text = "".join(json.dumps(row) + "\n" for row in keep)
        atomic_write(self.path, text)
        self.size = len(text.encode())

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        line = (json.dumps(record) + "\n").encode()
        # A log removed or cut while the run writes it would silently lose the rows before this one: the record of
        # the run is no longer whole, so the run stops rather than go on writing a partial one.
        found = self.path.stat().st_size if self.path.exists() else None
        if self.size is not None and (found or 0) != self.size:
            state = "was removed" if found is None else f"changed size ({found} bytes where this run wrote {self.size})"
            raise UserError(
                f"{self.path} {state} while the run wrote it: rows before step {record['step']} are lost; restore "
                "the file, or train again in a new run (--name), for a whole record"
            )
        with self.path.open("ab") as f:
            f.write(line)
        if self.size is not None:
            self.size += len(line)
        staging.sync(self.path.parent, at_most_every_s=staging.LOG_SYNC_S)  # a run in a bucket: now and then
        emit(self.listeners, "on_record", record)


class Launches:
    """RUN/launches.json: each start of the run (the step it began at, the step it reached, the seconds it trained),
    rewritten every SAVE_EVERY_S seconds while it trains, so that a start ended by a kill is counted too."""

    SAVE_EVERY_S = 2.0

    def __init__(self, path: Path, start_step: int, enabled: bool):
        self.path, self.enabled = path, enabled
        self.past = self._read() if enabled else []
        self.t0, self.ended = time.time(), False
        self.this = {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "start_step": start_step,
            "step": start_step,
            "seconds": 0.0,
        }
        self.save()

    def _read(self) -> list[dict]:
        try:
            launches = json.loads(self.path.read_text())["launches"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        return [x for x in launches if isinstance(x, dict)] if isinstance(launches, list) else []

    def update(self, step: int, force: bool = False) -> None:
        if self.ended:
            return
        now = time.time()
        self.this.update(step=step, seconds=round(now - self.t0, 2))
        if force or now - self.saved_at >= self.SAVE_EVERY_S:
            self.save()

    def end(self, step: int) -> None:
        """The launch's final entry (the first call counts: the summary's numbers are the file's)."""
        self.update(step, force=True)
        self.ended = True

    def save(self) -> None:
        self.saved_at = time.time()
        if self.enabled:
            atomic_write(self.path, json.dumps({"launches": [*self.past, self.this]}, indent=1))

    def summary(self) -> dict:
        """The run's starts so far (this one included) and the seconds they trained together."""
        past = sum(float(x.get("seconds", 0) or 0) for x in self.past)
        return {"launches": len(self.past) + 1, "seconds_total": round(past + self.this["seconds"], 2)}
