"""A run whose home is a bucket (train.out_dir=gs://…, --ckpt gs://…): its records and checkpoints end up in the
bucket and nothing but logs on local disk; it resumes from the bucket bit-identically; the commands that read a
run read it there; a second writer is refused by the bucket's lock. Against the local GCS server (conftest)."""

import glob
import json
import os
import socket
import tempfile

import jax
import numpy as np
import pytest
from conftest import invoke, tiny_recipe
from flax import nnx

from ssmlm import paths
from ssmlm.errors import UserError
from ssmlm.lockfile import locked
from ssmlm.runs import open_run


def staged_folders() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "ssmlm-staged-*")))


def losses(url: str) -> list[tuple[int, float]]:
    rows = [json.loads(ln) for ln in paths.read_bytes(paths.join(url, "metrics.jsonl")).decode().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "split" not in r]


def params(url: str):
    model, _ = open_run(url).load_model()
    return jax.tree.leaves(nnx.state(model))


@pytest.fixture
def recipe(tmp_path, corpus_file, bucket):
    return tiny_recipe(
        tmp_path / "r.yaml", corpus_file, train={"steps": 6, "batch_size": 4, "out_dir": f"{bucket.url}/runs"}
    )


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
def test_a_run_in_a_bucket_resumes_there_as_if_never_stopped(recipe, bucket, tmp_path):
    os.chdir(tmp_path)
    before = staged_folders()
    invoke("pretrain", recipe, "--name", "straight", "-q")
    invoke("pretrain", recipe, "--name", "split", "--stop-after", "2", "-q")
    assert json.loads(paths.read_bytes(f"{bucket.url}/runs/split/summary.json"))["stopped_early"]
    invoke("pretrain", recipe, "--name", "split", "-q")

    keys = bucket.keys("runs/split")
    for name in ("recipe.yaml", "run.json", "tokenizer.json", "metrics.jsonl", "launches.json", "summary.json"):
        assert f"runs/split/{name}" in keys
    assert "runs/split/loss.png" in keys and "runs/split/LOCK" not in keys  # the lock released
    assert {k.split("/")[3] for k in keys if k.startswith("runs/split/checkpoints/")} >= {"2", "6"}
    assert not any(p.name.startswith("gs") for p in tmp_path.iterdir()) and not (tmp_path / "runs").exists()
    assert staged_folders() == before  # the staging folders removed

    a, b = losses(f"{bucket.url}/runs/straight"), losses(f"{bucket.url}/runs/split")
    assert [s for s, _ in b] == list(range(1, 7))
    assert a == b  # the same batches in the same order, to the bit
    launches = json.loads(paths.read_bytes(f"{bucket.url}/runs/split/launches.json"))["launches"]
    assert [x["start_step"] for x in launches] == [0, 2]
    for x, y in zip(params(f"{bucket.url}/runs/straight"), params(f"{bucket.url}/runs/split"), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_second_writer_of_a_bucket_run_is_refused_and_a_dead_holder_taken_over(bucket):
    run = f"{bucket.url}/runs/x"
    with locked(run, "run"):
        assert "runs/x/LOCK" in bucket.keys("runs")
        with pytest.raises(UserError, match=rf"^run {run} is in use by pid {os.getpid()} on "):
            with locked(run, "run"):
                pass
    assert "runs/x/LOCK" not in bucket.keys("runs")  # released
    dead = {"host": socket.gethostname(), "pid": 2**22 + 1, "since": 0}  # above Linux's pid_max: never alive
    paths.write_bytes(f"{run}/LOCK", json.dumps(dead).encode())
    said = []
    with locked(run, "run", say=said.append):
        assert json.loads(paths.read_bytes(f"{run}/LOCK"))["pid"] == os.getpid()
    assert said and said[0].startswith(f"lock: took over {run}/LOCK from pid {2**22 + 1}")
    other = {"host": "another-host", "pid": 1, "since": 0}  # another host's holder: only a person knows
    paths.write_bytes(f"{run}/LOCK", json.dumps(other).encode())
    with pytest.raises(UserError, match=rf"delete {run}/LOCK and run again$"):
        with locked(run, "run"):
            pass


def test_a_bucket_out_dir_that_cannot_be_used_is_one_line(tmp_path, corpus_file, bucket):
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file)
    os.chdir(tmp_path)
    r = invoke("pretrain", recipe, "--set", "train.out_dir=s3://b/runs", code=2)
    assert r.output.strip().startswith("error: train.out_dir 's3://b/runs'") and len(r.output.strip().splitlines()) == 1
    r = invoke("pretrain", recipe, "--set", "train.out_dir=gs://no-such-bucket-x/runs", code=2)
    assert "bucket gs://no-such-bucket-x does not exist" in r.output
    assert not any(p.name.startswith("gs") for p in tmp_path.iterdir())


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
def test_the_commands_that_read_a_run_read_it_in_the_bucket(tmp_path, corpus_file, bucket):
    """evaluate, analyze report and finetune --ckpt on a run that lives only in the bucket; their outputs land
    there too, and nothing but the cwd's own files stays local."""
    out = f"{bucket.url}/runs"
    recipe = tiny_recipe(
        tmp_path / "r.yaml",
        corpus_file,
        data={"validation_fraction": 0.2},
        train={"steps": 3, "batch_size": 4, "checkpoint_every": 0, "out_dir": out},
    )
    os.chdir(tmp_path)
    before = staged_folders()
    invoke("pretrain", recipe, "--name", "base", "-q")
    invoke("evaluate", "--ckpt", f"{out}/base")
    assert json.loads(paths.read_bytes(f"{out}/base/eval/mlm-validation.json"))["step"] == 3
    invoke("analyze", "report", "--ckpt", f"{out}/base")
    assert "runs/base/analysis/index.html" in bucket.keys("runs/base")
    r = invoke("analyze", "report", "--ckpt", f"{out}/base", "--out", f"{bucket.url}/reports/base")
    assert "reports/base/index.html" in bucket.keys("reports") and "ssmlm-out" not in r.output
    ft = ["--set", "train.steps=2", "--set", "train.batch_size=4", "--set", f"train.out_dir={out}", "-q"]
    invoke("finetune", "--ckpt", f"{out}/base", "--task", "builtin-order", *ft)
    info = json.loads(paths.read_bytes(f"{out}/base-builtin-order/run.json"))
    assert info["source"] == f"{out}/base"
    assert "runs/base-builtin-order/summary.json" in bucket.keys("runs/base-builtin-order")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "r.yaml"]
    from ssmlm import staging

    # left: only the read-only copy of the source's records, which the process removes when it exits
    assert staged_folders() - before <= {str(p.parent) for p in staging._fetched.values()}


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
def test_an_experiment_in_a_bucket_runs_there_and_a_second_invocation_reuses_it(tmp_path, corpus_file, bucket):
    """experiment --out gs://…: every run of it is a run in the bucket (checkpoints written there by Orbax), the
    report lands there, nothing stays local, a second invocation reuses every run; evaluate --out gs:// and
    results --out gs:// write their files there."""
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"steps": 3, "batch_size": 4})
    ft = [
        "task.train_file=" + str(_order_file(tmp_path, "train")),
        "task.validation_file=" + str(_order_file(tmp_path, "validation")),
    ]
    ft += ["task.text_fields=[sentence]", "task.label_field=label", "train.epochs=null", "train.steps=2"]
    ft += ["train.batch_size=8", "train.checkpoint_every=0"]
    spec = {
        "seeds": [0],
        "stages": ["pretrain", "finetune"],
        "metric": "finetune:accuracy",
        "reference": "random",
        "arms": {
            "pretrained": {"pretrain": {"recipe": str(recipe)}, "finetune": {"set": ft}},
            "random": {"pretrain": {"recipe": str(recipe)}, "finetune": {"set": ft, "init": "random"}},
        },
    }
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))
    os.chdir(tmp_path)
    own_files = sorted(p.name for p in tmp_path.iterdir())  # the test's own: nothing else may stay local
    assert own_files == ["corpus", "exp.yaml", "order-train.jsonl", "order-validation.jsonl", "r.yaml"]
    before = staged_folders()
    out = f"{bucket.url}/exp"
    r = invoke("experiment", tmp_path / "exp.yaml", "--out", out)
    assert f"wrote {out}/results.md" in r.output and "ssmlm-staged" not in r.output, r.output
    keys = bucket.keys("exp")
    for name in ("experiment.yaml", "results.md", "results.json", "results.png"):
        assert f"exp/{name}" in keys
    for run in ("pretrained/seed0/pretrain", "pretrained/seed0/finetune", "random/seed0/finetune"):
        assert f"exp/runs/{run}/summary.json" in keys and f"exp/runs/{run}/metrics.jsonl" in keys
        assert any(k.startswith(f"exp/runs/{run}/checkpoints/") for k in keys), run
    info = json.loads(paths.read_bytes(f"{out}/runs/pretrained/seed0/finetune/run.json"))
    assert info["source"] == f"{out}/runs/pretrained/seed0/pretrain"
    assert "ssmlm-staged" not in paths.read_bytes(f"{out}/results.json").decode()
    assert sorted(p.name for p in tmp_path.iterdir()) == own_files

    r = invoke("experiment", tmp_path / "exp.yaml", "--out", out)
    assert r.output.count("(reused)") == 3, r.output

    # a run of the experiment, read from the bucket by hand; outputs named by URL land there
    run = f"{out}/runs/pretrained/seed0/finetune"
    r = invoke("evaluate", "--ckpt", run, "--out", f"{bucket.url}/elsewhere/ft.json")
    assert f"wrote {bucket.url}/elsewhere/ft.json" in r.output
    assert json.loads(paths.read_bytes(f"{bucket.url}/elsewhere/ft.json"))["run"] == run
    invoke("evaluate", "--ckpt", run)  # RUN/eval/…, in the bucket
    from ssmlm import staging

    copies = {str(p.parent) for p in staging._fetched.values()}  # read-only copies, removed at the process' exit
    staging._fetched.clear()  # (a user's next command is a new process: it makes its own)
    r = invoke("results", run, "--out", f"{bucket.url}/elsewhere/table.md")
    assert f"wrote {bucket.url}/elsewhere/table.md" in r.output
    assert paths.read_bytes(f"{bucket.url}/elsewhere/table.md").decode().startswith("|")
    assert sorted(p.name for p in tmp_path.iterdir()) == own_files
    assert staged_folders() - before <= copies | {str(p.parent) for p in staging._fetched.values()}


def _order_file(tmp_path, split: str):
    from test_experiment import order_rows

    path = tmp_path / f"order-{split}.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps(r) + "\n" for r in order_rows(32, 1 if split == "train" else 2)))
    return path


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
def test_an_official_checkpoint_imported_into_a_bucket_is_a_run_there(tmp_path, bucket):
    from test_convert import official_config, official_params, write_official

    src = write_official(tmp_path / "BiGS_tiny", official_params(seed=0), official_config())
    os.chdir(tmp_path)
    url = f"{bucket.url}/runs/bigs_tiny"
    r = invoke("import-bigs", src, "--out", url)
    assert json.loads(r.output[r.output.index("{") :])["run"] == url
    keys = bucket.keys("runs/bigs_tiny")
    assert {"runs/bigs_tiny/run.json", "runs/bigs_tiny/tokenizer.json", "runs/bigs_tiny/recipe.yaml"} <= set(keys)
    assert any(k.endswith("commit_success.txt") for k in keys)  # Orbax's mark of a finished save in a bucket
    model, meta = open_run(url).load_model()
    assert meta["step"] == 0
    r = invoke("import-bigs", src, "--out", url, code=2)
    assert "already exists and is not empty" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["BiGS_tiny"]
