"""End to end, as a user runs it: preprocess → pretrain → interrupt → resume → extend-length → finetune
→ evaluate → analyze, on a tiny config in a temp dir, checking the files and numbers each step leaves."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import english_lines, invoke


def metric_rows(run_dir: Path):
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def tiny_recipes(tmp_path, corpus_file):
    runs = tmp_path / "runs"
    (tmp_path / "tiny.yaml").write_text(
        f"""
base: default
name: tiny
model: {{hidden_size: 32, num_layers: 2, intermediate_size: 64, max_seq_length: 32, num_ssm: 16}}
data: {{source: "{corpus_file}", vocab_size: 200, validation_fraction: 0.1}}
objective: {{duplicate_factor: 2}}
train: {{steps: 300, batch_size: 8, learning_rate: 3.0e-3, log_every: 5, eval_every: 100, eval_batches: 2,
         checkpoint_every: 20, out_dir: "{runs}"}}
"""
    )
    (tmp_path / "tiny_extend.yaml").write_text(
        f"""
base: tiny.yaml
model: {{max_seq_length: 64}}
train: {{steps: 4, checkpoint_every: 2, eval_every: 0, out_dir: "{runs}"}}
"""
    )
    return tmp_path, runs


def write_task(path: Path, n: int, seed: int):
    """A generated sentence task: does the sentence mention an animal (1) or not (0)?"""
    rows = []
    for i, line in enumerate(english_lines(n, seed)):
        label = int(any(w in line.lower() for w in ("cat", "dog", "bird")))
        rows.append({"sentence": line, "label": label, "id": i})
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "sentence", "label"])
        w.writeheader()
        w.writerows(rows)


@pytest.mark.slow  # 60-90 s (CI time); each stage has its own default tests, the experiment tests chain them
def test_full_pipeline(tiny_recipes):
    tmp, runs = tiny_recipes
    os.chdir(tmp)

    # --- preprocess: a dataset with both splits and metadata; a second call reuses it
    out = json.loads(invoke("preprocess", tmp / "tiny.yaml", "-q").stdout)
    data_dir = Path(out["path"])
    meta = json.loads((data_dir / "metadata.json").read_text())
    assert meta["max_seq_length"] == 32 and meta["format_version"] == 3
    assert out["splits"] == meta["splits"] and out["tokens"] == meta["tokens"] and out["fill_rate"] > 0.5
    assert meta["splits"]["train"]["sequences"] > 0 and meta["splits"]["validation"]["sequences"] > 0
    stamp = (data_dir / "metadata.json").stat().st_mtime_ns
    assert json.loads(invoke("preprocess", tmp / "tiny.yaml", "-q").stdout)["path"] == str(data_dir)
    assert (data_dir / "metadata.json").stat().st_mtime_ns == stamp

    # --- pretrain in a real process, stopped by SIGTERM (a scheduler's notice; Ctrl-C: test_interrupt.py) after
    # its first checkpoint: it stops after the step with a checkpoint, as on Ctrl-C
    run_dir = runs / "tiny"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ssmlm", "pretrain", str(tmp / "tiny.yaml"), "-q"],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 240
    while not (run_dir / "checkpoints" / "20").is_dir() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output
    assert "run the same command again to resume" in output
    interrupted_at = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert 20 <= interrupted_at < 300

    # --- resume: the same command continues from the checkpoint, not from step 0
    res = invoke("pretrain", tmp / "tiny.yaml", "-q")
    assert f"from step {interrupted_at}" in res.output
    steps = [r["step"] for r in metric_rows(run_dir) if "split" not in r]
    assert steps == sorted(set(steps)) and steps[-1] == 300, "metrics log lost or repeated steps"
    assert steps == list(range(5, 301, 5))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["start_step"] == interrupted_at and summary["final_step"] == 300
    losses = [r["loss"] for r in metric_rows(run_dir) if "split" not in r]
    assert np.mean(losses[-5:]) < losses[0] - 1.0, "MLM loss did not fall"
    assert (run_dir / "loss.png").stat().st_size > 1000
    for name in ("recipe.yaml", "run.json", "tokenizer.json"):
        assert (run_dir / name).is_file()

    # --- extend-length: 32 → 64 tokens; position rows tiled from the source, SSM params unchanged
    invoke("extend-length", tmp / "tiny_extend.yaml", "--from", run_dir, "-q")
    ext_dir = runs / "tiny-L64"
    ext_summary = json.loads((ext_dir / "summary.json").read_text())
    assert ext_summary["final_step"] == 4 and np.isfinite(ext_summary["train"]["loss"])
    ext_meta = json.loads(
        (Path(json.loads((ext_dir / "run.json").read_text())["data_dir"]) / "metadata.json").read_text()
    )
    assert ext_meta["max_seq_length"] == 64

    # --- finetune on a generated CSV task, then evaluate it
    write_task(tmp / "train.csv", 400, seed=1)
    write_task(tmp / "val.csv", 100, seed=2)
    invoke(
        "finetune",
        "--ckpt",
        run_dir,
        "--train-file",
        tmp / "train.csv",
        "--validation-file",
        tmp / "val.csv",
        "--text-fields",
        "sentence",
        "--label-field",
        "label",
        "--set",
        "train.learning_rate=1e-3",
        "--set",
        f"train.out_dir={runs}",
        "-q",
    )
    ft_dir = runs / "tiny-train"
    ft_summary = json.loads((ft_dir / "summary.json").read_text())
    assert ft_summary["final_step"] == 3 * (400 // 16)
    # 37% of the validation sentences are positive. Across pretraining seeds this tiny run finetunes to 0.72-0.93
    # (before the objectives moved on the fly: 0.77-0.87), so the bar is "clearly learned", not one seed's luck.
    assert ft_summary["validation"]["accuracy"] > 0.7, ft_summary

    res = invoke("evaluate", "--ckpt", ft_dir)
    ev = json.loads((ft_dir / "eval" / "train-validation.json").read_text())
    assert ev["metrics"]["accuracy"] == pytest.approx(ft_summary["validation"]["accuracy"])
    assert "accuracy" in res.stdout

    res = invoke("evaluate", "--ckpt", run_dir)
    ev = json.loads((run_dir / "eval" / "mlm-validation.json").read_text())
    assert ev["step"] == 300 and ev["metrics"]["mlm_loss"] < 6.0

    # --- analyze kernels: a plot and the kernels themselves, equal to the checkpoint's S4D kernels
    invoke("analyze", "kernels", "--ckpt", run_dir)
    assert (run_dir / "analysis" / "kernels.png").stat().st_size > 1000
    k = np.load(run_dir / "analysis" / "kernels.npz")
    assert k["forward"].shape == (2, 32) and k["backward"].shape == (2, 32)
    from ssmlm.models import s4d
    from ssmlm.runs import open_run

    model, _ = open_run(run_dir).load_model()
    ssm = model.encoder.layers[1].ssm_b
    expected = s4d.s4d_kernel(ssm.A_re[...], ssm.A_im[...], ssm.C[...], ssm.log_step[...], 32)
    np.testing.assert_allclose(k["backward"][1], np.asarray(expected), rtol=1e-6)


def test_extend_length_keeps_learned_weights(tiny_recipes):
    """Extension copies every source parameter; position rows are tiled; training runs at the new length."""
    tmp, runs = tiny_recipes
    os.chdir(tmp)
    invoke("pretrain", tmp / "tiny.yaml", "--set", "train.steps=6", "--name", "short", "-q")
    invoke(
        "extend-length",
        tmp / "tiny_extend.yaml",
        "--from",
        runs / "short",
        "--set",
        "train.steps=1",
        "--set",
        "train.learning_rate=1e-12",
        "--set",
        "train.out_dir=" + str(runs),
        "-q",
    )
    from ssmlm.runs import open_run

    src, _ = open_run(runs / "short").load_model()
    ext, _ = open_run(runs / "short-L64").load_model()
    pos_src = np.asarray(src.encoder.embeddings.position.embedding[...])
    pos_ext = np.asarray(ext.encoder.embeddings.position.embedding[...])
    assert pos_ext.shape == (64, 32)
    np.testing.assert_allclose(pos_ext[:32], pos_src, atol=1e-6)
    np.testing.assert_allclose(pos_ext[32:], pos_src, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(ext.encoder.layers[0].ssm_f.C[...]), np.asarray(src.encoder.layers[0].ssm_f.C[...]), atol=1e-6
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["pretrain", "--set", "model.hiden_size=3"], "did you mean 'hidden_size'"),
        (["pretrain", "--set", "train.schedule=cosin"], "did you mean 'cosine'"),
        (["pretrain", "no_such_recipe"], "recipe not found"),
        (["pretrain", "--set", "data.source=/nonexistent/corpus.txt"], "no such file or directory"),
        (["finetune", "--ckpt", "/nonexistent/run", "--task", "sst2"], "not an ssmlm run directory"),
        (["evaluate", "--ckpt", "/nonexistent/run"], "not an ssmlm run directory"),
        (["analyze", "kernels", "--ckpt", "/nonexistent/run"], "not an ssmlm run directory"),
    ],
)
def test_user_errors_are_one_line(args, message, tmp_path):
    os.chdir(tmp_path)
    result = invoke(*args, code=None)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_unknown_task_and_offline_hub_task(tiny_recipes):
    tmp, runs = tiny_recipes
    os.chdir(tmp)
    invoke("pretrain", tmp / "tiny.yaml", "--set", "train.steps=2", "--name", "mini", "-q")
    r = invoke("finetune", "--ckpt", runs / "mini", "--task", "mnlii", code=None)
    assert r.exit_code == 2 and "unknown task 'mnlii'; did you mean 'mnli'?" in r.output
    r = invoke("finetune", "--ckpt", runs / "mini", "--task", "sst2", code=None)
    assert r.exit_code == 2 and "--train-file" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    # nothing was written for the failed finetune
    assert not (runs / "mini-sst2").exists()
