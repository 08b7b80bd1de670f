"""One pretraining run serving a sweep of budgets: train.keep_steps keeps checkpoints outside the rotation,
`finetune --step N` starts from one of them (train.init_step, recorded in run.json), and `evaluate --entries`
scores phone books of another size than the finetuning books — on a tiny language model, through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import english_lines, invoke

from ssmlm.checks import checkpoint_steps
from ssmlm.data.phonebook import books

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A 6-step tiny LM run keeping steps 2 and 4 besides the newest one, stopped at step 3 and resumed."""
    tmp = tmp_path_factory.mktemp("init-step")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for i in range(12):  # phone books in the corpus: the tokenizer learns their digits and names
        text = english_lines(20, seed=i) + [b.prompt + "\n" + b.response for b in books(2, i, entries=(2, 4))]
        (corpus / f"doc{i:02d}.txt").write_text("\n".join(text) + "\n")
    recipe = {
        "base": "lm_tiny",
        "name": "pre",
        "model": {"hidden_size": 16, "num_layers": 1, "state_size": 16, "num_heads": 2, "max_seq_length": 128},
        "data": {"source": str(corpus), "vocab_size": 400},
        "objective": {"mixture": "clm", "min_sample_space": 16},
        "train": {
            "steps": 6,
            "batch_size": 2,
            "log_every": 1,
            "eval_every": 0,
            "checkpoint_every": 0,
            "keep_checkpoints": 1,
            "keep_steps": [2, 4],
            "out_dir": str(tmp / "runs"),
        },
    }
    (tmp / "pre.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp / "runs" / "pre"
    invoke("pretrain", tmp / "pre.yaml", "-q", "--stop-after", 3)
    stopped = checkpoint_steps(run)
    invoke("pretrain", tmp / "pre.yaml", "-q")  # resumes from step 3, its newest checkpoint
    return tmp, run, stopped


def test_kept_steps_survive_the_rotation_and_resume(pretrained):
    _, run, stopped = pretrained
    assert stopped == [2, 3]  # a kept step, then the one to resume from
    assert checkpoint_steps(run) == [2, 4, 6]  # 3 rotated away (keep_checkpoints 1), 2 and 4 kept
    assert json.loads((run / "summary.json").read_text())["final_step"] == 6


def _params(run: Path, step: int | None = None) -> dict:
    import jax
    from flax import nnx

    from ssmlm.runs import open_run

    model, _ = open_run(run).load_model(step)
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def _phonebook_recipe(tmp: Path) -> Path:
    recipe = {
        "base": "phonebook_tiny",
        "task": {
            "max_seq_length": 256,
            "phonebook": {"train_books": 8, "validation_books": 2, "entries": [2, 2], "queries": [1, 1]},
        },
        # a learning rate too small to move a weight: the finetuned run's weights are the ones it loaded
        "train": {"steps": 1, "batch_size": 2, "learning_rate": 1e-30, "eval_every": 0, "checkpoint_every": 0},
    }
    recipe["train"]["out_dir"] = str(tmp / "runs")
    path = tmp / "pb.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def finetuned(pretrained):
    tmp, run, _ = pretrained
    invoke("finetune", "--ckpt", run, "--task", "phonebook", "--recipe", _phonebook_recipe(tmp), "--step", 4, "-q")
    return tmp / "runs" / "pre-step4-phonebook"


def test_finetune_starts_from_the_step_asked_for(pretrained, finetuned):
    tmp, run, _ = pretrained
    info = json.loads((finetuned / "run.json").read_text())
    assert info["init_step"] == 4 and info["source"] == str(run)
    assert yaml.safe_load((finetuned / "recipe.yaml").read_text())["train"]["init_step"] == 4
    tuned, at4, at6 = _params(finetuned), _params(run, 4), _params(run, 6)
    assert tuned.keys() == at4.keys()
    assert all(np.allclose(tuned[k], at4[k], rtol=0, atol=1e-12) for k in tuned)
    assert any(not np.allclose(tuned[k], at6[k], rtol=0, atol=1e-6) for k in tuned)
    # without --step: the newest checkpoint, and run.json says which it was
    invoke("finetune", "--ckpt", run, "--task", "phonebook", "--recipe", tmp / "pb.yaml", "--name", "newest", "-q")
    assert json.loads((tmp / "runs" / "newest" / "run.json").read_text())["init_step"] == 6


def test_a_step_not_kept_is_one_line_before_jax(pretrained, tmp_path):
    _, run, _ = pretrained
    empty = tmp_path / "empty"  # a run directory without checkpoints
    empty.mkdir()
    for name in ("run.json", "recipe.yaml"):
        shutil.copy(run / name, empty / name)
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from ssmlm.cli import app\n"
        "for ckpt in sys.argv[1:]:\n"
        "    r = CliRunner().invoke(app, ['finetune', '--ckpt', ckpt, '--task', 'phonebook', '--step', '3'])\n"
        "    print(r.exit_code, r.output.strip().splitlines())\n"
        "print(sorted(m for m in ('jax', 'flax', 'orbax') if m in sys.modules))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(run), str(empty)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0].startswith(f"2 ['error: --step 3: {run} has checkpoints at steps 2, 4, 6"), lines[0]
    assert lines[1].startswith(f"2 ['error: --step 3: {empty} has no checkpoints"), lines[1]
    assert lines[2] == "[]"


def test_recipe_and_option_mistakes(pretrained):
    tmp, run, _ = pretrained
    r = invoke("pretrain", tmp / "pre.yaml", "--set", "train.keep_steps=[2, 0]", code=2)
    assert "'train.keep_steps' = [2, 0]" in r.output and len(r.output.strip().splitlines()) == 1
    r = invoke("finetune", "--ckpt", run, "--task", "phonebook", "--step", 2, "--init", "random", code=2)
    assert "--init random" in r.output and len(r.output.strip().splitlines()) == 1


def test_evaluate_on_books_of_another_size(finetuned):
    invoke("evaluate", "--ckpt", finetuned, "--task", "phonebook", "--entries", 4, "--limit", 2)
    result = json.loads((finetuned / "eval" / "phonebook-e4-validation.json").read_text())
    assert result["entries"] == [4, 4] and len(result["records"]) == 2
    assert [r["entries"] for r in result["records"]] == [4, 4]
    assert not (finetuned / "eval" / "phonebook-validation.json").exists()
    r = invoke("evaluate", "--ckpt", finetuned, "--task", "squad_v2", "--entries", 4, code=2)
    assert "--task phonebook" in r.output and len(r.output.strip().splitlines()) == 1
    r = invoke("evaluate", "--ckpt", finetuned, "--task", "phonebook", "--entries", "5-3", code=2)
    assert "LO-HI" in r.output and len(r.output.strip().splitlines()) == 1
