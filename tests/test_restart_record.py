"""Restarts keep the record straight: every start cuts metrics.jsonl back to the restored checkpoint's step (none:
empty), atomically; a save cut short by a kill is reported in one line, not as Orbax's warning; summary.json
counts the run's starts and the seconds they trained together."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from test_interrupt import birdie_recipe, steps, wait_for_row
from typer.testing import CliRunner

from ssmlm.cli import app
from ssmlm.runs.checkpoint import _quiet_unfinished_saves
from ssmlm.train.logs import MetricsLog

runner = CliRunner()


def test_killed_before_its_first_checkpoint_then_run_again_logs_every_step_once(tmp_path, corpus_file):
    recipe = birdie_recipe(tmp_path, corpus_file)
    run_dir = tmp_path / "runs" / "birdie"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    args = ["pretrain", str(recipe), "-q"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ssmlm", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_row(proc, run_dir, "train", 3)  # logged: steps 1-3, the controller's first two rows
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()], "killed too late"
    assert steps(run_dir, "controller") == [0, 1]
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "lo')  # a row the kill cut short
    (run_dir / "checkpoints" / "3.orbax-checkpoint-tmp").mkdir()  # a save the kill cut short

    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "resume: removed the unfinished checkpoint at step 3 (interrupted while saving)" in r.output
    assert "WARNING" not in r.output and "not finalized" not in r.output
    for split in ("train", "validation", "controller"):  # strictly increasing: nothing repeated
        s = steps(run_dir, split)
        assert s == sorted(set(s)), (split, s)
    assert steps(run_dir, "train") == [1, 2, 3, 4, 5, 6]
    assert steps(run_dir, "validation") == [1, 5, 6]
    assert steps(run_dir, "controller") == [0, 1, 5]
    mixture = runner.invoke(app, ["analyze", "mixture", "--ckpt", str(run_dir), "--json"])
    assert mixture.exit_code == 0, mixture.output
    assert json.loads(mixture.stdout)["evaluations"] == 2  # the updates at steps 1 and 5
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["launches"] == 2
    # the killed start counts what it saved (every 2 s; killed sooner: 0)
    assert summary["seconds_total"] >= summary["seconds"] > 0


def test_restart_cuts_the_log_back_to_the_restored_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    written = [
        {"step": 0, "split": "controller"},
        {"step": 1, "loss": 2.0},
        {"step": 2, "loss": 1.5},
        {"step": 2, "split": "validation"},
        {"step": 3, "loss": 1.0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in written) + '{"step": 4, "lo')
    log = MetricsLog(path)
    log.restart(2)
    assert log.rows() == written[:4]  # validation and controller rows up to the step stay, the torn row goes
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # the temporary file was renamed over it
    log.restart(None)  # no checkpoint restored: everything is trained again
    assert log.rows() == []


def test_orbax_warning_on_an_unfinished_save_becomes_one_line(capsys):
    _quiet_unfinished_saves()
    absl = logging.getLogger("absl")
    absl.warning(
        "Attempted to create temporary directory %s which already exists. Removing existing directory "
        "since it is not finalized.",
        "/x/runs/a/checkpoints/7.orbax-checkpoint-tmp",
    )
    err = capsys.readouterr().err
    assert err.strip() == "resume: removed the unfinished checkpoint at step 7 (interrupted while saving)"
    assert len(absl.filters) == len({type(f) for f in absl.filters})  # installed once
