"""Two JAX processes on this machine, joined by a local coordinator (gloo collectives on CPU), run one
pretraining job: each reads only its half of every global batch, and together they take exactly the
steps a single process takes: to the bit, against one process with two devices (the same mesh)."""

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import tiny_recipe
from flax import nnx
from hosts import Hosts, one_process

from ssmlm.runs import open_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 25-40 s of two jax processes (CI time); run with -m slow
def test_two_processes_equal_one(tmp_path, corpus_file):
    recipe = tiny_recipe(
        tmp_path / "r.yaml", corpus_file, model={"dropout": 0.0}, train={"steps": 4, "checkpoint_every": 2}
    )
    os.chdir(tmp_path)
    one_process(["pretrain", recipe, "--name", "single", "-q"], tmp_path)

    with Hosts(tmp_path, 2) as h:  # a hang fails within the timeout, with each host's stacks and output
        h.start(["pretrain", recipe, "--name", "multi", "-q"], cwd=tmp_path)
        assert h.wait(timeout=300) == [0, 0], h.report()

    def losses(name):
        rows = [json.loads(ln) for ln in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        return [x["loss"] for x in rows if "split" not in x]

    assert losses("multi") == losses("single")
    a, _ = open_run(tmp_path / "runs/single").load_model()
    b, _ = open_run(tmp_path / "runs/multi").load_model()
    for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
