"""Two JAX processes on this machine, joined by a local coordinator (gloo collectives on CPU), run one
pretraining job: each reads only its half of every global batch, and together they take exactly the
steps a single process takes: to the bit, against one process with two devices (the same mesh)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import tiny_recipe
from flax import nnx
from hosts import free_port, one_process

from ssmlm.runs import open_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 25-40 s of two jax processes (CI time); run with -m slow
def test_two_processes_equal_one(tmp_path, corpus_file):
    recipe = tiny_recipe(
        tmp_path / "r.yaml", corpus_file, model={"dropout": 0.0}, train={"steps": 4, "checkpoint_every": 2}
    )
    os.chdir(tmp_path)
    one_process(["pretrain", recipe, "--name", "single", "-q"], tmp_path)

    port = free_port()
    procs = []
    for i in range(2):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SSMLM_COORDINATOR": f"127.0.0.1:{port}",
            "SSMLM_NUM_PROCESSES": "2",
            "SSMLM_PROCESS_ID": str(i),
        }
        cmd = [sys.executable, "-m", "ssmlm", "pretrain", str(recipe), "--name", "multi", "-q"]
        procs.append(
            subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)

    def losses(name):
        rows = [json.loads(ln) for ln in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        return [x["loss"] for x in rows if "split" not in x]

    assert losses("multi") == losses("single")
    a, _ = open_run(tmp_path / "runs/single").load_model()
    b, _ = open_run(tmp_path / "runs/multi").load_model()
    for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
