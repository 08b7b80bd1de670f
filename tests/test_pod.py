"""A pod on one machine: two real hosts, each with a disk of its own (tests/hosts.py: private mount namespaces),
keep their corpus, data cache and run in a bucket (the local GCS server of tests/conftest.py). They preprocess
the corpus together and train, one is SIGKILLed mid-run and the other stops with one line, and the same command
resumes from the bucket to the losses and parameters, to the bit, of one uninterrupted process with two devices
(the same mesh, so the same program)."""

import json
import os

import jax
import numpy as np
import pytest
from conftest import tiny_recipe
from flax import nnx
from hosts import Hosts, one_process, require_unshare

from ssmlm import paths
from ssmlm.runs import open_run


def losses(url: str) -> dict[int, float]:
    rows = [json.loads(ln) for ln in paths.read_bytes(paths.join(url, "metrics.jsonl")).decode().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "split" not in r and "loss" in r}


def committed(bucket, run: str, step: int) -> bool:
    return f"runs/{run}/checkpoints/{step}/commit_success.txt" in bucket.keys(f"runs/{run}/checkpoints")


@pytest.mark.slow  # two 2-host runs and a reference (~1-2 min on two cores); .ci/run runs it with -m slow
def test_two_hosts_without_a_shared_disk_survive_a_killed_host_and_resume_from_the_bucket(
    tmp_path, corpus_file, bucket
):
    require_unshare()
    out = f"{bucket.url}/runs"
    for f in sorted(corpus_file.iterdir()):  # the corpus in the bucket too: no host reads a local file
        paths.upload(f, f"{bucket.url}/corpus/{f.name}")
    recipe = tiny_recipe(
        tmp_path / "r.yaml",
        f"{bucket.url}/corpus/*.txt",
        model={"dropout": 0.0},
        train={"steps": 12, "checkpoint_every": 4, "log_every": 1, "out_dir": out},
    )
    os.chdir(tmp_path)
    one_process(["pretrain", recipe, "--name", "single", "-q"], tmp_path)
    disk = tmp_path / "disk"  # each host's own folder behind this path: its cwd, nothing shared but the bucket
    env = {
        "SSMLM_HEARTBEAT_TIMEOUT": "300",
        "SSMLM_HOME": f"{bucket.url}/home",  # the data cache in the bucket, preprocessed by both hosts
        "SSMLM_LOCAL_CACHE": str(disk / "cache"),  # each host's local copies of the shards, on its own disk
    }
    args = ["pretrain", recipe, "--name", "multi", "-q"]
    with Hosts(tmp_path, 2, env=env) as h:
        h.start(args, private=disk, cwd=disk)
        h.until(lambda: committed(bucket, "multi", 4), 300, "the step-4 checkpoint in the bucket")
        h.signal(1, 9)  # SIGKILL: no word to anyone
        rc = h.wait(180)
        assert rc[0] not in (0, None) and rc[1] == -9, h.report()
        (line,) = h.errors(0)
        assert line.startswith("error: host 1 stopped"), h.report()
    assert any(k.endswith("/metadata.json") for k in bucket.keys("home"))  # the dataset, finished in the bucket
    for i in (0, 1):  # on each host's own disk: its copies of the shards, and no run folder
        own = tmp_path / f"disk.host{i}"
        assert any(own.rglob("*.npy")) and not (own / "runs").exists() and not (own / "gs:").exists()
    with Hosts(tmp_path, 2, env=env) as h:  # the same command, resumed from the bucket
        h.start(args, private=disk, cwd=disk)
        assert h.wait(300) == [0, 0], h.report()
        assert "resuming" in h.output(0), h.report()
    single, multi = losses(f"{out}/single"), losses(f"{out}/multi")
    assert sorted(multi) == sorted(single) == list(range(1, 13))
    assert multi == single
    a, _ = open_run(f"{out}/single").load_model()
    b, _ = open_run(f"{out}/multi").load_model()
    for x, y in zip(jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    launches = json.loads(paths.read_bytes(f"{out}/multi/launches.json"))["launches"]
    assert [x["start_step"] for x in launches][-1] >= 4
