"""Experiment trackers (``train.trackers``): the rows the loop writes to metrics.jsonl, also to TensorBoard
(``RUN/tensorboard/``, through tensorboardX) and to Weights & Biases (``RUN/wandb/``; offline with
WANDB_MODE=offline).

A tracker is a loop hook: the loop hands it every metrics.jsonl row as it is written (``on_record``: training,
validation and controller rows, step and split included) and closes it at the end, on Ctrl-C and on an error
(``close``). Each numeric field of a row becomes the scalar ``<split>/<field>`` at the row's step (split
"train" for training rows). On a restart the tracker never shows a step twice: everything past the restored
step is discarded, as in metrics.jsonl.

Both packages are optional extras; ``check_available`` names the one to install before any work starts.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
import uuid
from pathlib import Path

from ssmlm.errors import UserError

# tracker -> (the module it needs, the ssmlm extra that installs it)
NEEDS = {"tensorboard": ("tensorboardX", "tracking"), "wandb": ("wandb", "wandb")}
SKIP_FIELDS = {"step", "split", "time", "applies_from"}  # bookkeeping, not metrics


def check_available(names: list[str]) -> None:
    """A one-line error, before any work, for a tracker whose package is not installed."""
    for name in names:
        module, extra = NEEDS[name]
        if importlib.util.find_spec(module) is None:
            raise UserError(f"train.trackers: {name} needs the {module} package: pip install 'ssmlm[{extra}]'")


def scalars(record: dict) -> dict[str, float]:
    """{tag: value} of a metrics.jsonl row: its numeric fields as '<split>/<field>' (split "train" when it has none)."""
    split = record.get("split", "train")
    return {
        f"{split}/{k}": float(v)
        for k, v in record.items()
        if k not in SKIP_FIELDS and isinstance(v, int | float) and not isinstance(v, bool)
    }


def open_trackers(names: list[str], run_dir: Path, restored: int | None, rows: list[dict], config: dict) -> list:
    """The trackers of ``names`` for a run that continues from step ``restored`` (None: starts afresh), whose
    metrics.jsonl (already cut back to that step) holds ``rows``; ``config``: the recipe, for W&B."""
    check_available(names)
    make = {
        "tensorboard": lambda: TensorBoard(run_dir, restored, rows),
        "wandb": lambda: WandB(run_dir, restored, config),
    }
    return [make[name]() for name in names]


class TensorBoard:
    """Event files in RUN/tensorboard/. A fresh start empties the folder; a restart from step s opens a new event
    file that purges steps > s (TensorBoard's purge_step), so the steps a killed launch logged after its last
    checkpoint disappear. A run that turns the tracker on later gets its earlier rows written first."""

    def __init__(self, run_dir: Path, restored: int | None, rows: list[dict]):
        from tensorboardX import SummaryWriter

        logdir = run_dir / "tensorboard"
        if restored is None:
            shutil.rmtree(logdir, ignore_errors=True)
        backfill = restored is not None and not logdir.exists()
        # flush_secs: someone watching in TensorBoard sees new points within seconds, not tensorboardX's 2 minutes.
        # TensorBoard reads a folder's event files in name order and the names hold the second they were made:
        # the suffix keeps two starts within one second in order.
        self.writer = SummaryWriter(
            str(logdir),
            purge_step=None if restored is None else restored + 1,
            flush_secs=10,
            filename_suffix=f".{time.time_ns()}",
        )
        if backfill:
            for row in rows:
                self.on_record(row)

    def on_record(self, record: dict) -> None:
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, record["step"], walltime=record.get("time"))

    def on_checkpoint(self, step: int) -> None:
        # on disk before the checkpoint can be restored: a later restart keeps these steps, so they must not be
        # lost with a kill's unflushed buffer
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()  # flushes
            self.writer = None

    def on_end(self, summary: dict) -> None:
        self.close()

    def on_interrupt(self, step: int) -> None:
        self.close()


class WandB:
    """A Weights & Biases run whose files live in RUN/wandb/ (WANDB_MODE=offline: nothing leaves the machine;
    `wandb sync RUN/wandb/offline-run-*` uploads later). A restart resumes the same W&B run (its id is kept in
    RUN/wandb/ssmlm-run-id) and skips the rows up to the step it had already logged; a fresh start makes a new
    one."""

    def __init__(self, run_dir: Path, restored: int | None, config: dict):
        import wandb

        root = run_dir / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        id_file = root / "ssmlm-run-id"
        if restored is None or not id_file.is_file():
            id_file.write_text(f"{run_dir.name}-{uuid.uuid4().hex[:8]}")
        try:
            project = os.environ.get("WANDB_PROJECT", "ssmlm")
            self.run = wandb.init(
                project=project,
                name=run_dir.name,
                id=id_file.read_text().strip(),
                resume="allow",
                dir=str(run_dir),
                config=config,
            )
        except Exception as e:  # no API key, no network, a bad project: one line, not wandb's traceback
            first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
            raise UserError(
                f"train.trackers: wandb could not start ({first}); run `wandb login`, or set "
                "WANDB_MODE=offline to log to RUN/wandb only"
            ) from None
        # W&B steps only go forward: a resumed W&B run has logged the steps before this one already (the same
        # values: the loop's resume is exact)
        self.first = int(getattr(self.run, "starting_step", 0) or 0)

    def on_record(self, record: dict) -> None:
        if record["step"] >= self.first:
            self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

    def on_end(self, summary: dict) -> None:
        self.close()

    def on_interrupt(self, step: int) -> None:
        self.close()
