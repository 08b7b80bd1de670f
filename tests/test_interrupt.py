"""Ctrl-C: a run stops within seconds, even in the middle of Birdie's controller update (its reward model
fitting), prints one `interrupted:` line with the command that resumes it, exits 130, and the resumed run does
the evaluation that was cut short first, once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import invoke, tiny_recipe


def birdie_recipe(tmp_path: Path, corpus: Path, **controller) -> Path:
    """A tiny Birdie run of 6 steps: evaluations (and controller updates) at steps 1 and 5, the final one at 6."""
    recipe = {
        "base": "lm_tiny",
        "name": "birdie",
        "model": {
            "arch": "gated_ssm",
            "hidden_size": 32,
            "num_layers": 2,
            "state_size": 32,
            "num_heads": 2,
            "max_seq_length": 96,
        },
        "data": {"source": str(corpus), "vocab_size": 400},
        "objective": {"mixture": "birdie", "min_sample_space": 16, "controller": controller},
        "train": {
            "steps": 6,
            "batch_size": 4,
            "log_every": 1,
            "eval_every": 0,
            "eval_batches": 2,
            "checkpoint_every": 0,
            "out_dir": str(tmp_path / "runs"),
        },
    }
    path = tmp_path / "birdie.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steps(run_dir: Path, split: str) -> list[int]:
    return [r["step"] for r in rows(run_dir) if r.get("split", "train") == split]


def wait_for_row(proc, run_dir: Path, split: str, step: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if (run_dir / "metrics.jsonl").exists() and step in steps(run_dir, split):
            return
        time.sleep(0.02)
    raise AssertionError(f"no {split} row at step {step} (exit code {proc.poll()})")


def test_ctrl_c_during_the_controller_update_stops_at_once(tmp_path, corpus_file):
    # 3000 reward-model iterations: the update after the evaluation at step 5 takes seconds even once compiled,
    # so the signal lands inside it
    recipe = birdie_recipe(tmp_path, corpus_file, grok_iterations=3000)
    run_dir = tmp_path / "runs" / "birdie"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    args = ["pretrain", str(recipe), "-q"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ssmlm", *args],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    wait_for_row(proc, run_dir, "train", 5)  # the step is logged; its evaluation and update run now
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]  # a hang guard; the evaluation it cuts short is asserted below
    assert proc.returncode == 130, out
    assert "error:" not in out and "Traceback" not in out, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("interrupted:")]
    assert "stopped at step 5/6" in line
    assert line.endswith(f"run the same command again to resume: ssmlm {' '.join(args)}")
    meta = json.loads((run_dir / "checkpoints" / "5" / "meta" / "metadata").read_text())
    assert meta["evaluation_pending"] is True  # the update was cut short, not finished
    assert steps(run_dir, "validation") == [1] and steps(run_dir, "controller") == [0, 1]

    # the same command resumes: step 5's evaluation and update first, then the rest, each row once
    invoke(*args)
    assert steps(run_dir, "train") == [1, 2, 3, 4, 5, 6]
    assert steps(run_dir, "validation") == [1, 5, 6]
    assert steps(run_dir, "controller") == [0, 1, 5]
    assert json.loads((run_dir / "summary.json").read_text())["launches"] == 2


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
def test_sigterm_in_the_final_evaluation_saves_and_exits_without_plots(tmp_path, corpus_file):
    # a spot machine gives ~30 s between its notice and the kill: the checkpoint, then out; the plots wait
    recipe = tiny_recipe(
        tmp_path / "r.yaml", corpus_file, data={"validation_fraction": 0.3}, train={"steps": 6, "eval_batches": 0}
    )
    run_dir = tmp_path / "runs" / "r"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    args = ["pretrain", str(recipe), "-q"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ssmlm", *args],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    wait_for_row(proc, run_dir, "train", 6)  # the last step is logged: the final evaluation (it compiles) runs now
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("interrupted:")]
    assert "its evaluation is done first on resume" in line
    assert not (run_dir / "loss.png").exists() and not (run_dir / "summary.json").exists()
    assert json.loads((run_dir / "checkpoints" / "6" / "meta" / "metadata").read_text())["evaluation_pending"]

    invoke(*args)  # the next invocation evaluates, and draws the plot
    assert (run_dir / "loss.png").exists() and steps(run_dir, "validation") == [6]
