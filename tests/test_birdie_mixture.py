"""Birdie's dynamic mixture inside the training loop: per-configuration validation losses feed the controller,
its action steers the batches, its state is saved and restored with every checkpoint (a resumed run makes the
same choices as an uninterrupted one), it is logged, and `analyze mixture` draws it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import invoke


def birdie_recipe(tmp_path, corpus, steps=12, **controller):
    recipe = {
        "base": "lm_tiny",
        "name": "birdie",
        "model": {"arch": "gated_ssm", "hidden_size": 32, "num_layers": 2, "state_size": 32, "max_seq_length": 128},
        "data": {"source": str(corpus), "vocab_size": 400},
        "objective": {
            "mixture": "birdie",
            "min_sample_space": 16,
            # evaluations at round(s·0.02) for the paper's s = 10, 50, 250, 500, …: steps 1, 5, 10; control from 5
            "controller": {
                "eval_scale": 0.02,
                "validation_rows": 1,
                "proposals": 64,
                "grok_iterations": 5,
                "width": 16,
                "state_size": 16,
                "layers": 1,
                **controller,
            },
        },
        "train": {
            "steps": steps,
            "batch_size": 4,
            "log_every": 1,
            "eval_every": 0,
            "eval_batches": 1,
            "checkpoint_every": 3,
            "out_dir": str(tmp_path / "runs"),
        },
    }
    path = tmp_path / "birdie.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def records(run, split):
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("split") == split]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.conftest import english_lines

    tmp = tmp_path_factory.mktemp("birdie")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"doc{i:02d}.txt").write_text("\n".join(english_lines(30, seed=i)) + "\n")
    recipe = birdie_recipe(tmp, corpus)
    invoke("pretrain", recipe, "-q", "--name", "whole")
    invoke("pretrain", recipe, "-q", "--name", "split", "--stop-after", 7)  # stops between evaluations 5 and 10
    invoke("pretrain", recipe, "-q", "--name", "split")
    return tmp / "runs"


def test_controller_learns_from_per_configuration_losses(runs):
    run = runs / "whole"
    val = records(run, "validation")
    assert [r["step"] for r in val] == [1, 5, 10, 12]  # the scaled paper schedule, then the final evaluation
    configs = json.loads((run / "run.json").read_text()).get("configs") or None
    n = sum(1 for k in val[0] if k.startswith("config_loss_"))
    assert n > 20  # the grid's configurations that fit 128 tokens, each with its own loss
    assert configs is None or len(configs) == n
    assert all(np.isfinite(r[f"config_loss_{i}"]) for r in val for i in range(n))
    ctrl = records(run, "controller")
    assert [r["step"] for r in ctrl] == [0, 1, 5, 10]  # the start action, then one per evaluation before the end
    assert [r["applies_from"] for r in ctrl] == [0, 3, 7, 12]  # CONTROL_LAG = 2
    shares = [np.array([v for k, v in r.items() if k.startswith("share/")]) for r in ctrl]
    assert all(abs(s.sum() - 1) < 1e-6 for s in shares)
    # before control starts (step 5) the action stays the start action; from step 5 on the controller chooses
    np.testing.assert_allclose(shares[1], shares[0], atol=1e-7)
    assert np.abs(shares[2] - shares[0]).max() > 1e-3


def test_resumed_run_makes_the_same_choices(runs):
    whole, split = runs / "whole", runs / "split"
    a, b = records(whole, "controller"), records(split, "controller")
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], str):
                assert ra[k] == rb[k]
            else:
                assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-9), k
    la = [r["loss"] for r in records(whole, None) if "loss" in r]
    lb = [r["loss"] for r in records(split, None) if "loss" in r]
    np.testing.assert_allclose(lb, la, rtol=1e-5)


def test_analyze_mixture_writes_the_logged_shares(runs, tmp_path):
    run = runs / "whole"
    invoke("analyze", "mixture", "--ckpt", run, "--out", tmp_path)
    table = pd.read_csv(tmp_path / "mixture.csv")
    ctrl = records(run, "controller")
    assert list(table["applies_from"]) == [r["applies_from"] for r in ctrl]
    for col in [c for c in table.columns if c.startswith("share/")]:
        np.testing.assert_allclose(table[col], [r[col] for r in ctrl], rtol=1e-9)
    assert (tmp_path / "mixture.png").stat().st_size > 10_000


def test_analyze_mixture_on_a_fixed_mixture_run_is_a_clear_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "recipe.yaml").write_text("name: x\n")
    r = invoke("analyze", "mixture", "--ckpt", tmp_path, code=None)
    assert r.exit_code != 0 and "objective.mixture: birdie" in r.output and "Traceback" not in r.output


def test_report_entry_only_where_the_run_made_choices(runs, tmp_path):
    # a run finetuned from a Birdie run keeps its source's recipe but logged no controller records of its own:
    # the report leaves the mixture out instead of showing an error
    import shutil

    from ssmlm.analyze.mixture import for_report
    from ssmlm.runs import open_run

    entry = for_report(open_run(runs / "whole"), tmp_path / "a")
    # every record but the first (the initial action, step 0) follows an evaluation
    assert entry["numbers"]["controller updates"] == len(records(runs / "whole", "controller")) - 1
    copy = tmp_path / "finetuned"
    shutil.copytree(runs / "whole", copy)
    rows = [ln for ln in (copy / "metrics.jsonl").read_text().splitlines() if '"controller"' not in ln]
    (copy / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    assert for_report(open_run(copy), tmp_path / "b") is None
