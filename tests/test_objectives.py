"""Objectives on the fly: MLM static and dynamic masking, the typed batch, a non-MLM objective trained
through the ordinary loop, and a controller whose state survives a resume exactly."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from conftest import tiny_recipe

from ssmlm import objectives
from ssmlm.data.loader import ArrayTable, Batches
from ssmlm.objectives import make_batch
from ssmlm.objectives.mlm import MLM, RowRandom, row_keys
from ssmlm.recipe import ObjectiveConfig, load_recipe

IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
VOCAB = 100


def rows(n=64, length=32, seed=0):
    """[CLS] w… [SEP] then padding, with varied lengths."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, length), np.int32)
    for i in range(n):
        k = rng.integers(4, length - 1)
        out[i, 0], out[i, 1 : k + 1], out[i, k + 1] = 2, rng.integers(5, VOCAB, k), 3
    return out


def mlm(**kw):
    return MLM(ObjectiveConfig(**kw), IDS, VOCAB, 32, seed=7)


def table(tokens):
    return ArrayTable({"tokens": tokens, "row": np.arange(len(tokens))})


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_mlm_masking_rules(masking):
    """15% of the real tokens chosen (at most max_predictions), 80/10/10, specials and padding never chosen."""
    base = rows(4000, seed=1)
    obj = mlm(masking=masking, max_predictions=5, duplicate_factor=1)
    data = obj.train_examples(table(base))
    b = obj.train_batch(data[np.arange(len(base))], step=3)
    pos, lab, w = b.target_positions, b.targets, b.loss_weights
    n_real = (base != 0).sum(1)
    expected = np.minimum(5, np.minimum(np.maximum(1, np.rint(0.15 * n_real)), n_real - 2))
    assert (w.sum(1) == expected).all()
    r, s = np.nonzero(w)
    chosen = base[r, pos[r, s]]
    assert not np.isin(chosen, [0, 2, 3]).any()  # never [PAD], [CLS], [SEP]
    assert (lab[r, s] == chosen).all() and (lab[w == 0] == 0).all()
    new = b.tokens[r, pos[r, s]]
    frac_mask, frac_same = (new == 4).mean(), (new == chosen).mean()
    assert abs(frac_mask - 0.8) < 0.02 and abs(frac_same - 0.1 - 0.9 / VOCAB) < 0.02
    assert not np.isin(new[(new != 4) & (new != chosen)], [0, 1, 2, 3]).any()  # random words are not specials
    untouched = np.ones_like(base, bool)
    untouched[r, pos[r, s]] = False
    assert (b.tokens[untouched] == base[untouched]).all()
    assert (b.segment_ids == (base != 0)).all()


def test_static_masking_is_fixed_per_copy_and_dynamic_changes_per_step():
    base = rows(32)
    static = mlm(masking="static", duplicate_factor=3)
    ex = static.train_examples(table(base))
    assert len(ex) == 3 * 32
    idx = np.arange(96)
    a = static.train_batch(ex[idx], step=0)
    b = static.train_batch(ex[idx], step=500)  # the step that draws a copy does not matter
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.target_positions[:32], a.target_positions[32:64])  # copies differ
    dynamic = mlm(masking="dynamic")
    d = dynamic.train_examples(table(base))
    x1, x2 = dynamic.train_batch(d[np.arange(32)], 1), dynamic.train_batch(d[np.arange(32)], 2)
    assert not np.array_equal(x1.target_positions, x2.target_positions)  # a new mask every step
    again = mlm(masking="dynamic").train_batch(d[np.arange(32)], 1)  # reproducible from (seed, step)
    np.testing.assert_array_equal(x1.tokens, again.tokens)
    # a row's mask does not depend on the other rows of its batch
    one = dynamic.train_batch(d[np.array([5])], 1)
    np.testing.assert_array_equal(one.tokens[0], x1.tokens[5])


def test_row_random_depends_only_on_key():
    keys = row_keys(1, 2, np.arange(10))
    a = RowRandom(keys).random((10, 7))
    b = RowRandom(keys[3:5]).random((2, 7))
    np.testing.assert_array_equal(a[3:5], b)
    u = RowRandom(row_keys(0, np.arange(20000))).random((20000, 8))
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01


def test_make_batch_checks_shapes():
    t = np.ones((2, 8), np.int32)
    b = make_batch(t, np.zeros((2, 3)), np.ones((2, 3)), target_positions=np.zeros((2, 3)))
    assert b.positions.shape == (2, 8) and (b.positions[1] == np.arange(8)).all()
    with pytest.raises(ValueError, match="segment_ids"):
        make_batch(t, np.zeros((2, 3)), np.ones((2, 3)), segment_ids=np.ones((2, 7)))
    with pytest.raises(ValueError, match="target_positions"):
        make_batch(t, np.zeros((2, 3)), np.ones((2, 3)), target_positions=np.zeros((2, 4)))
    leaves = jax.tree.leaves(b)  # a pytree: jit, device_put and tree.map take it whole
    assert len(leaves) == 6


def test_dataset_fingerprint_ignores_masking(tmp_path, corpus_file):
    from ssmlm.data.preprocess import preprocess

    r1 = load_recipe(str(tiny_recipe(tmp_path / "a.yaml", corpus_file, objective={"duplicate_factor": 1})))
    other = {"duplicate_factor": 4, "masked_lm_prob": 0.3, "masking": "dynamic"}
    r2 = load_recipe(str(tiny_recipe(tmp_path / "b.yaml", corpus_file, objective=other)))
    assert preprocess(r1.data, 32, quiet=True) == preprocess(r2.data, 32, quiet=True)


def test_next_token_objective_trains_bigs_through_the_loop(tmp_path, corpus_file):
    """The loop does not assume MLM: a recipe's `objective: {kind: next_token}` trains a tiny BiGS."""
    from ssmlm.train.drive import pretrain

    path = tiny_recipe(
        tmp_path / "r.yaml",
        corpus_file,
        objective={"kind": "next_token"},
        train={"steps": 30, "batch_size": 8, "learning_rate": 3e-3, "log_every": 5},
    )
    summary = pretrain(load_recipe(str(path)), tmp_path / "runs/nt", quiet=True)
    rows_ = [json.loads(ln) for ln in (tmp_path / "runs/nt/metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in rows_ if "split" not in r]
    assert train[-1] < train[0] - 0.5
    assert "lm_loss" in summary["validation"] and "predicted_tokens" in summary["validation"]


class CountingController:
    """A toy controller: its state is a mixture weight it nudges after every evaluation; batches read it."""

    def init_state(self):
        return {"weight": np.float32(0.5), "updates": np.int32(0)}

    def update(self, state, step, metrics):
        loss = float(next(v for k, v in metrics.items() if k.endswith("_loss")))
        return {"weight": np.float32(state["weight"] * 0.5 + 0.1 * loss), "updates": np.int32(state["updates"] + 1)}


def _controlled_run(recipe, run_dir, stop_after=None, seen=None):
    """Pretrain with a controller whose state decides the dynamic-masking step offset of each batch."""
    from ssmlm.data.loader import TokenRows
    from ssmlm.data.preprocess import preprocess, read_metadata
    from ssmlm.models import build_mlm, with_vocab
    from ssmlm.train import loop

    data_dir = preprocess(recipe.data, recipe.seq_len, quiet=True)
    meta = read_metadata(data_dir)
    import dataclasses

    recipe = dataclasses.replace(recipe, model=with_vocab(recipe.model, meta["vocab_size"]))
    obj = objectives.build(ObjectiveConfig(masking="dynamic"), meta["special_ids"], meta["vocab_size"], 32, 0)
    sampler = Batches(TokenRows(data_dir, "train"), recipe.train.batch_size, 0)

    def batches(step, state):
        # the state changes the batch: a different mask stream while its weight is above 0.5
        shift = int(float(state["weight"]) * 1000)
        if seen is not None:
            seen[step] = shift
        return obj.train_batch(sampler(step), step + shift, None)

    from ssmlm.train.parts.mlm import token_eval_data

    stage = loop.Stage(
        "pretrain",
        build_mlm(recipe.model, 0),
        obj.loss,
        batches,
        recipe.train.steps,
        recipe.train.batch_size * 32,
        obj.eval,
        token_eval_data(data_dir, obj, 8, 2),
        obj.score,
        controller=CountingController(),
    )
    return loop.run(stage, recipe, run_dir, quiet=True, stop_after=stop_after)


def test_controller_state_is_checkpointed_and_resume_is_exact(tmp_path, corpus_file):
    os.chdir(tmp_path)
    path = tiny_recipe(
        tmp_path / "r.yaml", corpus_file, train={"steps": 12, "batch_size": 8, "eval_every": 3, "checkpoint_every": 4}
    )
    recipe = load_recipe(str(path))
    seen_a, seen_b = {}, {}
    _controlled_run(recipe, tmp_path / "straight", seen=seen_a)
    _controlled_run(recipe, tmp_path / "split", stop_after=5, seen=seen_b)  # stops at 5, inside a lag window
    _controlled_run(recipe, tmp_path / "split", seen=seen_b)
    assert len(set(seen_a.values())) >= 3  # the controller really changed the batches
    assert {s: seen_b[s] for s in seen_a} == seen_a  # every step saw the same state
    la = [json.loads(ln) for ln in (tmp_path / "straight/metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(ln) for ln in (tmp_path / "split/metrics.jsonl").read_text().splitlines()]
    key = lambda r: (r["step"], r.get("loss", r.get("mlm_loss")))  # noqa: E731
    assert [key(r)[0] for r in la] == [key(r)[0] for r in lb]
    assert [key(r)[1] for r in la] == pytest.approx([key(r)[1] for r in lb], rel=1e-6)
    # an update after step s applies from s + CONTROL_LAG on (batches in flight never change)
    from ssmlm.train.control import CONTROL_LAG

    assert seen_a[3 + CONTROL_LAG - 1] == seen_a[1] != seen_a[3 + CONTROL_LAG]


def test_evaluation_compiles_once(tmp_path, corpus_file):
    """Every evaluation of a run reuses one compiled step (it used to recompile each time)."""
    from ssmlm.train import loop

    calls = []
    original = loop.make_eval_step

    def counting(eval_fn, graphdef):
        calls.append(1)
        return original(eval_fn, graphdef)

    loop.make_eval_step = counting
    try:
        from ssmlm.train.drive import pretrain

        path = tiny_recipe(tmp_path / "r.yaml", corpus_file, train={"steps": 6, "eval_every": 2, "eval_batches": 2})
        pretrain(load_recipe(str(path)), tmp_path / "runs/ev", quiet=True)
    finally:
        loop.make_eval_step = original
    rows_ = [json.loads(ln) for ln in (tmp_path / "runs/ev/metrics.jsonl").read_text().splitlines()]
    assert sum(r.get("split") == "validation" for r in rows_) == 3 and len(calls) == 1


def test_unsharded_step_donates_parameters():
    from flax import nnx

    from ssmlm.models import build_mlm
    from ssmlm.objectives.losses import token_prediction_loss
    from ssmlm.recipe import ModelConfig, TrainConfig
    from ssmlm.train.loop import make_train_step
    from ssmlm.train.optim import make_optimizer

    cfg = ModelConfig(vocab_size=50, hidden_size=16, num_layers=1, intermediate_size=32, max_seq_length=16, num_ssm=4)
    graphdef, params = nnx.split(build_mlm(cfg), nnx.Param)
    tx = make_optimizer(TrainConfig(steps=10, warmup_steps=0), 10, params, cfg).tx
    step = make_train_step(token_prediction_loss, tx, graphdef, 0)
    t = np.full((2, 16), 7)
    b = make_batch(t, t[:, :3], np.ones((2, 3)), target_positions=np.tile([1, 2, 3], (2, 1)))
    lowered = step.lower(params, tx.init(params), b, 0)
    params_and_state = jax.tree.leaves(lowered.args_info[0][:2])
    batch_and_step = jax.tree.leaves(lowered.args_info[0][2:])
    assert params_and_state and all(a.donated for a in params_and_state)
    assert not any(a.donated for a in batch_and_step)
