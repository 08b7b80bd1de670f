"""One writer per run directory and per dataset: a second writer is refused (a run) or waits (a dataset), and the
lock of a writer that died is taken over. Real processes, real lock files."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import corpus_dir, tiny_recipe

from ssmlm.errors import UserError
from ssmlm.lockfile import NAME, locked

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def ssmlm(args, tmp_path, **kw):
    return subprocess.Popen([sys.executable, "-m", "ssmlm", *map(str, args)], cwd=tmp_path, env=ENV, text=True, **kw)


def wait_for(path_glob, proc, root):
    """The first file matching ``path_glob`` under ``root`` once ``proc`` has made it."""
    while proc.poll() is None:
        found = sorted(root.glob(path_glob))
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"no {path_glob} (exit code {proc.returncode}): {proc.communicate()}")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_holders_lock_is_taken_over_and_another_hosts_is_not(tmp_path):
    lock = tmp_path / NAME
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead_pid(), "since": 0, "command": "ssmlm x"}))
    said = []
    with locked(tmp_path, "run", say=said.append):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(UserError, match=f"^run {tmp_path} is in use by pid {os.getpid()} on "):
            with locked(tmp_path, "run"):  # a second writer, even in this process
                pass
    assert len(said) == 1 and said[0].startswith(f"lock: took over {lock} from pid ")
    assert said[0].endswith("(ssmlm x), which is no longer running")
    assert not lock.exists()  # released: nothing left for the next writer to read

    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": 0}))
    with pytest.raises(UserError) as e:
        with locked(tmp_path, "run"):
            pass
    assert str(e.value).endswith(
        f"pid 1 on elsewhere since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(0))}; "
        f"if that process is gone, delete {lock} and run again"
    )


def test_a_second_pretrain_of_one_run_is_refused_and_the_first_finishes_cleanly(tmp_path):
    recipe = tiny_recipe(
        tmp_path / "r.yaml",
        corpus_dir(tmp_path / "corpus", 12, 20),
        data={"validation_fraction": 0.25},
        train={"steps": 3, "checkpoint_every": 1},
    )
    run = tmp_path / "runs" / "dup"
    first = ssmlm(
        ["pretrain", recipe, "-q", "--name", "dup"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    wait_for("runs/dup/checkpoints/1", first, tmp_path)  # Orbax renames a save's folder to its step once complete
    first.send_signal(signal.SIGSTOP)  # holds its lock, paused: the second start cannot miss it
    try:
        second = ssmlm(
            ["pretrain", recipe, "-q", "--name", "dup"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        out = second.communicate(timeout=300)[0]
        # a reader takes no lock: the live run's newest committed checkpoint is evaluated meanwhile
        reader = ssmlm(["evaluate", "--ckpt", run], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        read = reader.communicate(timeout=300)[0]
    finally:
        first.send_signal(signal.SIGCONT)
    assert reader.returncode == 0, read
    assert json.loads((run / "eval" / "mlm-validation.json").read_text())["step"] >= 1
    assert second.returncode == 2, out
    assert "Traceback" not in out, out
    assert [ln for ln in out.splitlines() if ln.startswith("error:")] == [
        f"error: run {run} is in use by pid {first.pid} on {socket.gethostname()} since "
        + out.split(" since ")[1].split(" (")[0]
        + f" (__main__.py pretrain {recipe} -q --name dup); if that process is gone, delete {run / NAME} and run again"
    ]
    assert first.wait(timeout=300) == 0, first.communicate()[0]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]  # each step once
    (launch,) = json.loads((run / "launches.json").read_text())["launches"]
    assert launch["start_step"] == 0 and launch["step"] == 3
    assert not (run / NAME).exists()


def test_a_second_preprocess_of_one_dataset_waits_and_reuses_it(tmp_path):
    home = tmp_path / "home"
    ENV["SSMLM_HOME"] = str(home)
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_dir(tmp_path / "corpus", 12, 20))
    first = ssmlm(["preprocess", recipe, "-q"], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lock = wait_for(f"data/*/{NAME}", first, home)
    first.send_signal(signal.SIGSTOP)
    second = ssmlm(["preprocess", recipe], tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = second.stderr.readline()  # its first line: it waits (rather than tokenising the corpus again)
    finally:
        first.send_signal(signal.SIGCONT)
    assert line.startswith(f"waiting for dataset {lock.parent}: in use by pid {first.pid} on "), line
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0 and first.wait(timeout=300) == 0, err
    assert "tokenizer: training" not in err  # the second read what the first wrote
    assert json.loads(out[out.index("{") :])["path"] == str(lock.parent)
    assert not lock.exists()
