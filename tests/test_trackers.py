"""train.trackers: TensorBoard event files (read back with TensorBoard's own reader) hold the same scalars as
metrics.jsonl, across a restart too; a tracker whose package is missing, or an unknown one, is one line."""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
from conftest import invoke, tiny_recipe

from ssmlm.train.trackers import TensorBoard


def tensorboard_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value}, as TensorBoard shows them (a restart's purge applied)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def logged_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """The same view of metrics.jsonl."""
    out: dict[str, dict[int, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        split = row.get("split", "train")
        for k, v in row.items():
            if k not in ("step", "split", "time", "applies_from") and isinstance(v, int | float):
                out.setdefault(f"{split}/{k}", {})[row["step"]] = float(v)
    return out


def test_tensorboard_holds_the_metrics_of_a_stopped_and_resumed_run(tmp_path, corpus_file):
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"steps": 6, "batch_size": 4, "eval_every": 2})
    os.chdir(tmp_path)
    for more in (["--stop-after", "3"], []):
        invoke("pretrain", recipe, "-q", "--set", "train.trackers=[tensorboard]", *more)
    run_dir = tmp_path / "runs" / "r"
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one file per start
    shown, logged = tensorboard_scalars(run_dir / "tensorboard"), logged_scalars(run_dir)
    assert {"train/loss", "train/lr", "validation/mlm_loss"} <= set(shown)
    assert shown.keys() == logged.keys()
    for tag, points in logged.items():
        assert shown[tag].keys() == points.keys(), tag
        for step, value in points.items():
            assert shown[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-12), (tag, step)
    assert sorted(shown["train/loss"]) == [1, 2, 3, 4, 5, 6]
    assert sorted(shown["validation/mlm_loss"]) == [2, 4, 6]


def test_a_restart_hides_the_steps_logged_after_the_restored_checkpoint(tmp_path):
    rows = [{"step": s, "loss": 10.0 - s, "time": time.time()} for s in range(1, 7)]
    first = TensorBoard(tmp_path, None, [])
    for row in [*rows, {"step": 6, "split": "validation", "mlm_loss": 3.0}]:  # killed after step 6; saved: 3
        first.on_record(row)
    first.close()
    second = TensorBoard(tmp_path, 3, rows[:3])
    for s in (4, 5):  # the same steps again, other values (say, other timings)
        second.on_record({"step": s, "loss": 100.0 + s})
    second.close()
    shown = tensorboard_scalars(tmp_path / "tensorboard")
    assert shown["train/loss"] == {1: 9, 2: 8, 3: 7, 4: 104, 5: 105}
    assert shown.get("validation/mlm_loss", {}) == {}  # not evaluated again yet: gone, not left from before

    fresh = TensorBoard(tmp_path, None, [])  # no checkpoint restored: the run starts over
    fresh.on_record({"step": 1, "loss": 1.0})
    fresh.close()
    assert tensorboard_scalars(tmp_path / "tensorboard")["train/loss"] == {1: 1.0}

    later = TensorBoard(tmp_path / "later", 3, rows[:3])  # turned on at a restart: the rows so far first
    later.close()
    assert tensorboard_scalars(tmp_path / "later" / "tensorboard")["train/loss"] == {1: 9, 2: 8, 3: 7}


def test_tracker_mistakes_are_one_line_before_any_work(tmp_path, corpus_file):
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file)
    r = invoke("pretrain", recipe, "--set", "train.trackers=[tensorbord]", code=None)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "train.trackers[0]" in r.output and "did you mean 'tensorboard'" in r.output, r.output
    r = invoke("pretrain", recipe, "--set", "train.trackers=[tensorboard, tensorboard]", code=None)
    assert r.exit_code == 2 and "each tracker at most once" in r.output, r.output
    if importlib.util.find_spec("wandb") is None:
        started = time.monotonic()
        r = invoke("pretrain", recipe, "--set", "train.trackers=[wandb]", code=None)
        assert r.exit_code == 2, r.output
        assert r.output.strip().splitlines()[-1] == (
            "error: train.trackers: wandb needs the wandb package: pip install 'ssmlm[wandb]'"
        )
        assert time.monotonic() - started < 10 and not (tmp_path / "runs").exists()  # before any data work


def test_wandb_offline_writes_into_the_run_directory(tmp_path, corpus_file, monkeypatch):
    pytest.importorskip("wandb")  # an optional extra, not in the test extra
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"steps": 3, "batch_size": 4})
    invoke("pretrain", recipe, "-q", "--set", "train.trackers=[wandb]")
    assert list((tmp_path / "runs" / "r" / "wandb").glob("offline-run-*/*.wandb"))
