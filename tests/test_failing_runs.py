"""A run that fails never looks like success: diverging steps stop it with one `error:` line and a summary.json
that says failed (no checkpoint of non-finite weights), a skipped step is never logged as a loss of 0, a
metrics.jsonl removed under the run stops it, a full disk stops it at once with the newest complete checkpoint
intact, and an experiment does not reuse a failed run as done. Every fault is real: a learning rate that
diverges, a removed file, a full tmpfs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import english_lines, invoke, tiny_recipe

from ssmlm.errors import Diverged, UserError
from ssmlm.recipe import load_recipe
from ssmlm.runs import open_run
from ssmlm.train import drive
from ssmlm.train.hooks import LogLine, loss_text

DIVERGE = ["train.learning_rate=1e6", "train.warmup_steps=0", "train.steps=12", "train.log_every=4"]


@pytest.fixture
def recipe(tmp_path, corpus_file):
    os.chdir(tmp_path)
    return tiny_recipe(tmp_path / "r.yaml", corpus_file, model={"dropout": 0.0}, train={"checkpoint_every": 2})


def sets(*pairs: str) -> list[str]:
    return [arg for p in pairs for arg in ("--set", p)]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def finite_checkpoints(run_dir: Path) -> list[int]:
    """The run's checkpoint steps; each loads, with finite parameters."""
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    for step in steps:
        from flax import nnx

        model, meta = open_run(run_dir).load_model(step=step)
        assert meta["step"] == step
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return steps


def test_a_diverging_run_fails_and_keeps_its_last_finite_checkpoint(recipe, tmp_path):
    r = invoke("pretrain", recipe, "--name", "nan", "-q", *sets(*DIVERGE), code=None)
    assert r.exit_code == 2, r.output
    (line,) = error_lines(r.output)
    assert "Traceback" not in r.output
    assert "training diverged by step" in line and "in a row" in line and "lower train.learning_rate" in line
    run_dir = tmp_path / "runs" / "nan"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"].startswith("diverged: training diverged by step")
    logged = [x for x in rows(run_dir) if x.get("split") is None]
    assert len({x["step"] for x in logged}) == len(logged)  # no row twice
    assert any(x.get("skipped") for x in logged)
    for x in logged:  # a window of skipped steps has no loss; no loss is a 0 standing for skipped steps
        assert "loss" not in x or (np.isfinite(x["loss"]) and x["loss"] > 0), x
    assert not any(x["loss"] == 0 for x in logged if "loss" in x)
    kept = finite_checkpoints(run_dir)
    failed_at = int(line.split("diverged by step ")[1].split("/")[0])
    assert kept and max(kept) < failed_at
    assert f"the newest checkpoint is step {max(kept)}" in line

    # the same command again resumes from that checkpoint and fails the same way, never with exit 0
    again = invoke("pretrain", recipe, "--name", "nan", "-q", *sets(*DIVERGE), code=None)
    assert again.exit_code == 2 and len(error_lines(again.output)) == 1
    assert "failed" in json.loads((run_dir / "summary.json").read_text())


def test_a_diverging_finetune_fails_the_same_way(tiny_encoder, tmp_path):
    os.chdir(tmp_path)
    rows_ = ["sentence,label"] + [f"{s},{int('cat' in s)}" for s in english_lines(32, 3)]
    (tmp_path / "task.csv").write_text("\n".join(rows_) + "\n")
    args = ["finetune", "--ckpt", tiny_encoder, "--train-file", tmp_path / "task.csv", "--text-fields", "sentence"]
    args += ["--label-field", "label", "-q", *sets("train.learning_rate=1e30", "train.warmup_steps=0")]
    r = invoke(*args, *sets("train.epochs=8", "train.log_every=2", f"train.out_dir={tmp_path / 'runs'}"), code=None)
    assert r.exit_code == 2, r.output
    (line,) = error_lines(r.output)
    assert "training diverged by step" in line
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["failed"].startswith("diverged:")


def test_the_bar_says_skipped_never_a_zero_loss():
    assert loss_text(LogLine({}, 1e-3, 1.0, None, skipped=4, good=0), None) == "skipped (4)"
    assert loss_text(LogLine({}, 1e-3, 1.0, None, skipped=4, good=0), 3.0) == "skipped (4)"
    assert loss_text(LogLine({}, 1e-3, 1.0, None, skipped=1, good=3), 2.5) == "2.5000 (1 skipped)"
    assert loss_text(LogLine({}, 1e-3, 1.0, None), 2.5) == "2.5000"


class RemoveLog:
    """A user hook that deletes the run's metrics.jsonl once the given step is logged."""

    def __init__(self, run_dir: Path, at: int):
        self.run_dir, self.at = run_dir, at

    def on_log(self, step: int, record: dict) -> None:
        if step == self.at:
            (self.run_dir / "metrics.jsonl").unlink()


def test_a_metrics_log_removed_under_the_run_stops_it(recipe, tmp_path):
    run_dir = tmp_path / "runs" / "gone"
    with pytest.raises(UserError) as e:
        drive.pretrain(load_recipe(recipe), run_dir, quiet=True, hooks=[RemoveLog(run_dir, 2)])
    assert not isinstance(e.value, Diverged)
    message = str(e.value)
    assert "\n" not in message and "metrics.jsonl was removed while the run wrote it" in message
    assert "rows before step 3 are lost" in message
    assert not (run_dir / "metrics.jsonl").exists()  # nothing written after the loss


def filled(mount: Path) -> None:
    """Write into ``mount`` until it is full."""
    with (mount / "filler").open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


class FillDisk:
    """A user hook that fills the disk once the given step's checkpoint is started."""

    def __init__(self, mount: Path, at: int):
        self.mount, self.at = mount, at

    def on_checkpoint(self, step: int) -> None:
        if step == self.at:
            filled(self.mount)


@pytest.fixture
def tmpfs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_stops_the_run_at_once_and_keeps_the_newest_checkpoint(recipe, tmpfs, capfd):
    run_dir = tmpfs / "run"
    r = load_recipe(recipe, ["train.steps=12"])
    with pytest.raises(UserError) as e:
        drive.pretrain(r, run_dir, quiet=True, hooks=[FillDisk(tmpfs, 4)])
    message = str(e.value)
    assert "\n" not in message, message
    assert "free space (or fix the permissions) and run the same command again to resume" in message
    err = capfd.readouterr().err
    assert "Traceback" not in err and "RESOURCE_EXHAUSTED" not in err.replace(message, ""), err
    assert "Event loop is closed" not in err, err
    kept = finite_checkpoints(run_dir)
    assert kept and max(kept) <= 4 and f"step {max(kept)}, is kept" in message
    logged = [x["step"] for x in rows(run_dir) if x.get("split") is None]
    assert max(logged) <= 6  # stopped at once: within a save's time of the full disk, not at the end

    # space again: the same command resumes from the kept checkpoint and finishes
    (tmpfs / "filler").unlink()
    summary = drive.pretrain(r, run_dir, quiet=True)
    assert summary["final_step"] == 12 and summary["start_step"] == max(kept)
    logged = [x["step"] for x in rows(run_dir) if x.get("split") is None]
    assert logged == list(range(1, 13))
