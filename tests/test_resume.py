"""Exact resume: stopping and continuing gives the same run as going straight through; a killed run
resumes from its last complete checkpoint."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import invoke, tiny_recipe

from ssmlm.runs import open_run


@pytest.fixture
def recipe(tmp_path, corpus_file):
    return tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"steps": 8, "batch_size": 4})


def losses(run_dir: Path):
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "split" not in r]


def test_stop_and_resume_equals_straight_run(recipe, tmp_path):
    os.chdir(tmp_path)
    invoke("pretrain", recipe, "--name", "straight", "-q")
    invoke("pretrain", recipe, "--name", "split", "--stop-after", "3", "-q")
    assert json.loads((tmp_path / "runs/split/summary.json").read_text())["stopped_early"]
    invoke("pretrain", recipe, "--name", "split", "--stop-after", "2", "-q")
    invoke("pretrain", recipe, "--name", "split", "-q")
    a, b = losses(tmp_path / "runs/straight"), losses(tmp_path / "runs/split")
    assert [s for s, _ in b] == list(range(1, 9))
    np.testing.assert_allclose([v for _, v in a], [v for _, v in b], rtol=1e-6)  # same batches, same order
    ma, _ = open_run(tmp_path / "runs/straight").load_model()
    mb, _ = open_run(tmp_path / "runs/split").load_model()
    from flax import nnx

    for x, y in zip(jax.tree.leaves(nnx.state(ma)), jax.tree.leaves(nnx.state(mb)), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


@pytest.mark.slow  # CI time; test_restart_record kills a run by default
def test_sigkill_resumes_from_last_complete_checkpoint(recipe, tmp_path):
    """Checkpoint every step so the kill very likely lands inside an (asynchronous) save."""
    os.chdir(tmp_path)
    run_dir = tmp_path / "runs/killed"
    args = [
        sys.executable,
        "-m",
        "ssmlm",
        "pretrain",
        str(recipe),
        "--name",
        "killed",
        "-q",
        "--set",
        "train.steps=400",
        "--set",
        "train.checkpoint_every=1",
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        done = [p for p in (run_dir / "checkpoints").glob("*") if p.name.isdigit()] if run_dir.exists() else []
        if done and max(int(p.name) for p in done) >= 5:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    r = invoke(*args[3:], "--stop-after", "1")
    assert "resuming" in r.output
    resumed_from = int(re.search(r"from\s+step\s+(\d+)", r.output).group(1))
    assert resumed_from >= 5
    steps = [s for s, _ in losses(run_dir)]
    assert steps == list(range(1, resumed_from + 2))  # nothing lost, nothing repeated
