"""benchmarks/transfer.py (the data of experiments/transfer.yaml) and the shipped experiment files."""

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import english_lines, load_benchmark

ROOT = Path(__file__).resolve().parent.parent


def test_passages_and_three_way_split():
    t = load_benchmark("transfer")
    pars = t.paragraphs("CHAPTER I\n\n" + "\n\n".join(" ".join(english_lines(k, seed=k)) for k in range(1, 40)))
    assert pars[0] == "CHAPTER I" and "\n" not in pars[1]
    train, val, test = t.split_document(pars)
    assert train + val + test == pars and len(train) == int(0.8 * len(pars)) and abs(len(val) - len(test)) <= 1
    ps = t.passages(pars)
    assert ps and all(40 <= len(p.split()) <= 80 for p in ps)
    assert "CHAPTER" not in " ".join(ps)


def test_prepared_data_keeps_test_text_out_of_pretraining_and_validation(tmp_path, monkeypatch):
    t = load_benchmark("transfer")
    monkeypatch.setattr(t, "PER_CLASS", {"train": 20, "validation": 8, "test": 8})
    monkeypatch.setattr(t, "ORDER", {"train": 96, "validation": 64, "test": 64})
    docs = {}
    for i, name in enumerate(["alpha", "beta", "gamma"]):
        lines = english_lines(1200, seed=i)
        docs[name] = [" ".join(lines[j : j + 4]) for j in range(0, len(lines), 4)]
    info = t.prepare_data(docs, tmp_path)
    read = lambda name: [json.loads(x) for x in (tmp_path / "tasks" / name).read_text().splitlines()]  # noqa: E731
    pre = " ".join(p.read_text() for p in (tmp_path / "pretrain").glob("*.txt"))
    for task, field in (("novels", "text"), ("order", "sentence")):
        val, test = read(f"{task}-val.jsonl"), read(f"{task}-test.jsonl")
        assert val and test and len(read(f"{task}.jsonl")) == info[task]["train"]
        assert not {r[field] for r in val} & {r[field] for r in test}
        if task == "novels":  # passages are text as written (order rows may be shuffled)
            assert all(r[field] not in pre for r in val + test)
    novels = read("novels-test.jsonl")
    assert sorted({r["label"] for r in novels}) == ["alpha", "beta", "gamma"] and len(novels) == 24
    b_val, b_test = read("builtin-order-val.jsonl"), read("builtin-order-test.jsonl")
    assert abs(len(b_val) - len(b_test)) <= 1 and not {r["sentence"] for r in b_val} & {r["sentence"] for r in b_test}


def test_transfer_families_have_bigs_parameter_count():
    """experiments/transfer.yaml's sizes: every family within 0.5% of BiGS's non-embedding parameters."""
    import jax
    from flax import nnx

    from ssmlm.experiment.spec import load_experiment
    from ssmlm.models import build_mlm
    from ssmlm.recipe import load_recipe

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRANSFER_DATA", "/nonexistent")
        mp.setenv("TRANSFER_CLASSES", "6")
        exp = load_experiment(ROOT / "experiments" / "transfer.yaml")
    counts = {}
    for fam in ("bigs", "stack_ssm", "gmlp", "bert"):
        s = exp.arms[f"{fam}-pretrained-novels"]["pretrain"]
        cfg = dataclasses.replace(load_recipe(s.recipe, list(s.set)).model, vocab_size=8192)  # the tokenizer's
        m = nnx.eval_shape(lambda cfg=cfg: build_mlm(cfg))
        n = lambda mod: sum(x.size for x in jax.tree.leaves(nnx.state(mod, nnx.Param)))  # noqa: E731
        counts[fam] = n(m.encoder) - n(m.encoder.embeddings)
    for c in counts.values():
        assert abs(c / counts["bigs"] - 1) < 0.005, counts


@pytest.mark.parametrize("name", ["smoke", "transfer", "birdie_fig1a", "birdie_fig1b"])
def test_shipped_experiment_files_load(name, monkeypatch):
    from ssmlm.experiment.spec import load_experiment

    monkeypatch.setenv("TRANSFER_DATA", "/nonexistent")
    monkeypatch.setenv("TRANSFER_CLASSES", "6")
    exp = load_experiment(ROOT / "experiments" / f"{name}.yaml")
    assert len(exp.seeds) >= 2 and all(exp.reference_of(a) in (None, *exp.arms) for a in exp.arms)
    if name.startswith("birdie"):  # the same design for every arm
        assert len({(a["finetune"], a["evaluate"], a["pretrain"].set) for a in exp.arms.values()}) == 1


def test_budget_table_cuts_intervals_at_the_accuracy_bounds(tmp_path):
    """A t-interval over 3 seeds can pass 100%; the budget table and plot show it cut at [0, 100]."""
    t = load_benchmark("transfer")
    iv = lambda m, lo, hi: {"n": 3, "mean": m, "low": lo, "high": hi}  # noqa: E731
    arms = {f"bigs-random-{task}": {"interval": iv(0.9, 0.8, 1.0)} for task in t.TASKS}
    arms["bigs-pretrained200-order"] = {"interval": iv(0.85, 0.69, 1.014), "difference": iv(-0.05, -0.2, 0.1)}
    table = t.budget({"arms": arms}, tmp_path)
    assert "85.0 [69.0, 100.0]; Δ -5.0 [-20.0, +10.0]" in table and "101.4" not in table
    assert (tmp_path / "budget.png").stat().st_size > 0


def test_budget_table_marks_intervals_that_are_not_estimable(tmp_path):
    """Equal accuracies over the seeds give a zero-width interval: the table says it is not estimable."""
    t = load_benchmark("transfer")
    flat = {"n": 3, "mean": 0.972, "low": 0.972, "high": 0.972, "estimable": False, "reason": "zero spread"}
    arms = {f"bigs-random-{task}": {"interval": flat} for task in t.TASKS}
    diff = {"n": 2, "mean": 0.02, "low": -0.1, "high": 0.14, "estimable": False, "reason": "n=2 < 3"}
    arms["bigs-pretrained200-order"] = {"interval": {"n": 3, "mean": 0.9, "low": 0.8, "high": 1.0}, "difference": diff}
    table = t.budget({"arms": arms}, tmp_path)
    assert "97.2 [not estimable: zero spread]" in table and "[97.2, 97.2]" not in table
    assert "Δ +2.0 [not estimable: n=2 < 3]" in table
