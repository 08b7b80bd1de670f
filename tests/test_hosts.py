"""Runs of two real hosts (tests/hosts.py): a run location that only one host can see stops both at the start,
a host that dies stops the other with one line naming it, and a SIGTERM to one host stops both at one step with a
checkpoint that resumes to the same losses. Each starts two jax processes (~20-40 s on two cores)."""

import json
import os
import signal

import numpy as np
import pytest
from conftest import invoke, tiny_recipe
from hosts import Hosts, require_unshare

from ssmlm.hosts import NO_SHARED_DISK


def one_line(h: Hosts, i: int) -> str:
    """The host's one line saying why it stopped, and no traceback."""
    out = h.output(i)
    assert "Traceback" not in out, h.report()
    lines = h.errors(i)
    assert len(lines) == 1, h.report()
    return lines[0]


def test_private_disks_stop_every_host_at_the_start(tmp_path, corpus_file):
    require_unshare()
    disk = tmp_path / "disk"  # the same path on both hosts, a different folder behind it on each
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"out_dir": str(disk / "runs")})
    with Hosts(tmp_path, 2, env={"SSMLM_HOME": str(disk / "cache")}) as h:
        h.start(["pretrain", recipe, "--name", "x", "-q"], private=disk)
        assert h.wait(240) == [2, 2], h.report()
        for i in (0, 1):
            line = one_line(h, i)
            assert NO_SHARED_DISK in line and str(disk / "runs") in line, line
            assert "host 1 sees" in line, line
    assert not any((tmp_path / "disk.host0").rglob("tokenizer.json")), "no data work before the check"


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
def test_a_killed_host_stops_the_other_with_one_line(tmp_path, corpus_file):
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"steps": 100_000, "log_every": 1})
    metrics = tmp_path / "runs" / "x" / "metrics.jsonl"
    with Hosts(tmp_path, 2, env={"SSMLM_HEARTBEAT_TIMEOUT": "300"}) as h:
        h.start(["pretrain", recipe, "--name", "x", "-q"])
        h.until(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 2, 240, "training steps")
        h.signal(1, 9)  # SIGKILL: no word to anyone
        rc = h.wait(120)
        assert rc[0] not in (0, None) and rc[1] == -9, h.report()
        line = one_line(h, 0)
        assert line.startswith("error: host 1 stopped during training"), line


def losses(run) -> dict[int, float]:
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "split" not in r and "loss" in r}


@pytest.mark.slow  # two 2-host runs and a reference (~1-2 min on two cores); run with -m slow
def test_sigterm_to_one_host_stops_both_with_a_checkpoint_that_resumes(tmp_path, corpus_file):
    recipe = tiny_recipe(
        tmp_path / "r.yaml", corpus_file, model={"dropout": 0.0}, train={"steps": 60, "checkpoint_every": 1000}
    )
    os.chdir(tmp_path)
    invoke("pretrain", recipe, "--name", "single", "-q")
    run = tmp_path / "runs" / "multi"
    with Hosts(tmp_path, 2) as h:
        h.start(["pretrain", recipe, "--name", "multi", "-q"])
        h.until(lambda: (run / "metrics.jsonl").is_file() and len(losses(run)) >= 3, 240, "training steps")
        h.signal(1, signal.SIGTERM)
        assert h.wait(180) == [130, 130], h.report()
        for i in (0, 1):
            assert one_line(h, i).startswith("interrupted:"), h.report()
    stopped = max(losses(run))
    assert 3 <= stopped < 60
    with Hosts(tmp_path, 2) as h:  # resumed on the same (shared) disk
        h.start(["pretrain", recipe, "--name", "multi", "-q"])
        assert h.wait(300) == [0, 0], h.report()
    single, multi = losses(tmp_path / "runs" / "single"), losses(run)
    assert sorted(multi) == sorted(single)
    np.testing.assert_allclose([multi[s] for s in sorted(single)], [single[s] for s in sorted(single)], rtol=1e-5)
