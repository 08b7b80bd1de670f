"""The same run on 1 CPU device and on 8 simulated devices (a 4x2 data x tensor mesh) gives the same
losses and parameters; a checkpoint written on 8 devices continues on 1, and the reverse."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import invoke, tiny_recipe
from flax import nnx

from ssmlm.runs import open_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def recipe(tmp_path, corpus_file):
    model = {"arch": "bert", "num_layers": 2, "num_heads": 2}
    return tiny_recipe(tmp_path / "r.yaml", corpus_file, model=model)


def on_8_devices(tmp_path, *args):
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ['XLA_FLAGS']} --xla_force_host_platform_device_count=8",
        "PYTHONPATH": str(ROOT),
    }
    r = subprocess.run(
        [sys.executable, "-m", "ssmlm", *map(str, args)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def losses(run_dir):
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "split" not in r]


def assert_same_params(a, b):
    ma, _ = open_run(a).load_model()
    mb, _ = open_run(b).load_model()
    for x, y in zip(jax.tree.leaves(nnx.state(ma)), jax.tree.leaves(nnx.state(mb)), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-5)


def test_one_device_equals_4x2_mesh(recipe, tmp_path):
    os.chdir(tmp_path)
    invoke("pretrain", recipe, "--name", "one", "-q")
    on_8_devices(
        tmp_path, "pretrain", recipe, "--name", "eight", "-q", "--set", "mesh.data=4", "--set", "mesh.tensor=2"
    )
    np.testing.assert_allclose(losses(tmp_path / "runs/one"), losses(tmp_path / "runs/eight"), rtol=1e-4)
    assert_same_params(tmp_path / "runs/one", tmp_path / "runs/eight")


@pytest.mark.slow  # 40-75 s; the mesh equivalence above runs by default (CI time)
def test_checkpoints_move_between_device_counts(recipe, tmp_path):
    os.chdir(tmp_path)
    invoke("pretrain", recipe, "--name", "straight", "-q")
    # 8 devices (fsdp 4 x tensor 2) for 3 steps, then 1 device for the rest
    on_8_devices(
        tmp_path,
        "pretrain",
        recipe,
        "--name",
        "moved",
        "-q",
        "--stop-after",
        "3",
        "--set",
        "mesh.data=1",
        "--set",
        "mesh.fsdp=4",
        "--set",
        "mesh.tensor=2",
    )
    invoke("pretrain", recipe, "--name", "moved", "-q")
    np.testing.assert_allclose(losses(tmp_path / "runs/straight"), losses(tmp_path / "runs/moved"), rtol=1e-4)
    assert_same_params(tmp_path / "runs/straight", tmp_path / "runs/moved")
    # and the reverse: 1 device for 3 steps, then 8
    invoke("pretrain", recipe, "--name", "back", "-q", "--stop-after", "3")
    on_8_devices(tmp_path, "pretrain", recipe, "--name", "back", "-q", "--set", "mesh.data=8")
    assert_same_params(tmp_path / "runs/straight", tmp_path / "runs/back")


def test_mesh_errors(recipe, tmp_path):
    os.chdir(tmp_path)
    r = invoke("pretrain", recipe, "--set", "mesh.data=2", code=None)
    assert r.exit_code == 2 and "does not use the 1 devices" in r.output
    assert not (tmp_path / "runs").exists()  # found before the run directory is written
    r = invoke("pretrain", recipe, "--set", "mesh.data=3", code=None)  # the batch of 8 cannot split 3 ways
    assert r.exit_code == 2 and "'train.batch_size' = 8: expected a multiple of" in r.output
    r = invoke("pretrain", recipe, "--set", "mesh.data=-1", "--set", "mesh.fsdp=-1", code=None)
    assert r.exit_code == 2 and "at most one axis to be -1" in r.output
