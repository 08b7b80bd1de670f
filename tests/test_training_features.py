"""Training features a recipe can switch: gradient accumulation, the SSM parameter group, the
non-finite-loss guard, best-checkpoint keeping, the checkpoint manifest and the MFU estimate."""

import json
import os

import jax
import numpy as np
import pytest
from conftest import invoke, tiny_recipe
from flax import nnx

from ssmlm.models import build_mlm
from ssmlm.models.config import layers_scanned
from ssmlm.models.rules import path_name
from ssmlm.recipe import ModelConfig, TrainConfig
from ssmlm.runs import open_run
from ssmlm.train.optim import make_optimizer, param_rules


@pytest.fixture
def recipe(tmp_path, corpus_file):
    os.chdir(tmp_path)
    return tiny_recipe(
        tmp_path / "r.yaml",
        corpus_file,
        model={"dropout": 0.0},
        data={"validation_fraction": 0.2},
        train={"eval_every": 2, "eval_batches": 2},
    )


def train(recipe, name, *sets):
    args = ["pretrain", str(recipe), "--name", name, "-q"]
    for s in sets:
        args += ["--set", s]
    r = invoke(*args, code=None)
    return r


def params_of(run_dir):
    model, meta = open_run(run_dir).load_model()
    return nnx.state(model, nnx.Param), meta


def rows(run_dir):
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_gradient_accumulation_matches_the_whole_batch(recipe, tmp_path):
    assert train(recipe, "whole").exit_code == 0
    assert train(recipe, "accum", "train.grad_accum=4").exit_code == 0
    a, _ = params_of(tmp_path / "runs/whole")
    b, _ = params_of(tmp_path / "runs/accum")
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)
    r = train(recipe, "bad", "train.grad_accum=3")
    assert r.exit_code == 2 and "'train.batch_size' = 8: expected a multiple of train.grad_accum = 3" in r.output


def test_ssm_parameter_group():
    cfg = ModelConfig(vocab_size=30, hidden_size=8, num_layers=1, intermediate_size=16, max_seq_length=8, num_ssm=4)
    params = nnx.state(build_mlm(cfg), nnx.Param)
    train = TrainConfig(steps=10, warmup_steps=0, ssm_lr_multiplier=0.0, ssm_weight_decay=False)
    ssm = next(r for r in param_rules(cfg, train) if r.name == "ssm")
    names = [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    layer = "block" if layers_scanned(cfg) else "0"  # scanned layers: one stacked block
    expected = {
        f"encoder/layers/{layer}/{m}/{leaf}"
        for m in ("ssm_f", "ssm_b")
        for leaf in ("A_re", "A_im", "C", "D", "log_step")
    }
    assert {n for n in names if ssm.matches(n)} == expected
    # lr multiplier 0 freezes exactly the SSM parameters
    tx, _, _ = make_optimizer(train, 10, params, cfg)
    grads = jax.tree.map(np.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    for name, u in zip(names, jax.tree.leaves(updates), strict=True):
        assert (np.abs(np.asarray(u)).max() == 0) == (name in expected), name


def test_non_finite_steps_are_skipped_then_stop(recipe, tmp_path):
    r = train(recipe, "nan", "train.learning_rate=1e30", "train.max_skipped_steps=2", "train.warmup_steps=0")
    assert r.exit_code == 2 and "non-finite" in r.output and "Traceback" not in r.output
    logged = rows(tmp_path / "runs/nan")
    assert all(np.isfinite(x["loss"]) for x in logged if "loss" in x)
    assert sum(x.get("skipped", 0) for x in logged) >= 3


def test_keep_best_checkpoint_and_manifest(recipe, tmp_path):
    r = train(recipe, "best", "train.keep_checkpoints=1", "train.keep_best=mlm_loss", "train.steps=8")
    assert r.exit_code == 0, r.output
    run_dir = tmp_path / "runs/best"
    evals = {x["step"]: x["mlm_loss"] for x in rows(run_dir) if x.get("split") == "validation"}
    best = min(evals, key=evals.get)
    kept = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert 8 in kept and best in kept and len(kept) <= 2
    assert json.loads((run_dir / "summary.json").read_text())["best_checkpoint"] == best
    _, meta = params_of(run_dir)
    assert meta["recipe"]["model"]["hidden_size"] == 16 and len(meta["recipe_fingerprint"]) == 16
    assert len(meta["tokenizer_sha256"]) == 64 and meta["data_fingerprint"] and meta["step"] == 8


def test_mfu_is_logged_when_peak_is_known(recipe, tmp_path):
    assert train(recipe, "mfu", "train.peak_flops=1e13", "train.steps=2").exit_code == 0
    logged = [x for x in rows(tmp_path / "runs/mfu") if "mfu" in x]
    assert logged and all(0 < x["mfu"] < 1 for x in logged)
