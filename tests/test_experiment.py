"""`ssmlm experiment FILE.yaml`: the file's one-line errors, resumption, a failed arm, grid selection on validation
with the report on test, the interval arithmetic (against scipy.stats) and `finetune --init random`."""

import contextlib
import json
import os
import random
import re
import signal
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import english_lines, invoke, tiny_recipe
from scipy import stats

from ssmlm.experiment import stats as xstats
from ssmlm.experiment.spec import ExperimentError, load_experiment
from ssmlm.progress import clock_time

ROOT = Path(__file__).resolve().parent.parent


def order_rows(n: int, seed: int) -> list[dict]:
    """Half original sentences (label 1), half word-shuffled (label 0)."""
    rng = random.Random(seed)
    rows = []
    for i, s in enumerate(english_lines(n, seed=seed)):
        words, label = s.split(), i % 2
        if label == 0:
            while words == s.split():
                rng.shuffle(words)
        rows.append({"sentence": " ".join(words), "label": label})
    return rows


@pytest.fixture
def setup(tmp_path, corpus_file):
    """A tiny pretraining recipe and a tiny local order task with train / validation / test files."""
    recipe = tiny_recipe(tmp_path / "tiny.yaml", corpus_file, train={"steps": 3})
    files = {}
    for split, seed in (("train", 1), ("validation", 2), ("test", 3)):
        files[split] = tmp_path / f"order-{split}.jsonl"
        files[split].write_text("".join(json.dumps(r) + "\n" for r in order_rows(48, seed)))
    finetune_set = [
        f"task.train_file={files['train']}",
        f"task.validation_file={files['validation']}",
        f"task.test_file={files['test']}",
        "task.text_fields=[sentence]",
        "task.label_field=label",
        "train.epochs=null",
        "train.steps=2",
        "train.batch_size=8",
        "train.log_every=1",
        "train.checkpoint_every=0",
    ]
    return {"recipe": str(recipe), "finetune_set": finetune_set, "tmp": tmp_path}


def write_experiment(setup, name="exp", **changes) -> Path:
    body = {
        "seeds": [0, 1],
        "stages": ["pretrain", "finetune"],
        "metric": "finetune:accuracy",
        "reference": "random",
        "arms": {
            "pretrained": {"pretrain": {"recipe": setup["recipe"]}, "finetune": {"set": setup["finetune_set"]}},
            "random": {
                "pretrain": {"recipe": setup["recipe"]},
                "finetune": {"set": setup["finetune_set"], "init": "random"},
            },
        },
        **changes,
    }
    path = setup["tmp"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def run_experiment(path: Path, out: Path, *extra: str):
    return invoke("experiment", path, "--out", out, *extra, code=None)


# ----------------------------------------------------------------------------- the file's errors


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"seeds": []}, "seeds: []: expected a non-empty list"),
        ({"seeds": [1, 1]}, "expected distinct seeds"),
        ({"stages": ["finetune", "pretrain"]}, "stages: ['finetune', 'pretrain']: expected consecutive stages"),
        ({"stages": ["pretrain", "train"]}, "stages: unknown stage 'train'"),
        ({"metric": "accuracy"}, "metric: 'accuracy': expected STAGE:FIELD"),
        ({"metric": "evaluate:accuracy"}, "stage 'evaluate' is not in stages"),
        ({"reference": "nope"}, "reference: 'nope' is not an arm (arms: pretrained, random)"),
        ({"goal": "up"}, "goal: 'up': expected max or min"),
        ({"bounds": [1, 0]}, "bounds: [1, 0]: expected [LOW, HIGH] with LOW < HIGH"),
        ({"bounds": 1}, "bounds: 1: expected [LOW, HIGH]"),
        ({"bounds": [True, 2]}, "bounds: [True, 2]: expected [LOW, HIGH]"),
        ({"colour": 1}, "colour: unknown key"),
        ({"grid": {"finetune": {"train.learning_rate": [1e-3, 1e-4]}}}, "grid: the best point is selected on "),
    ],
)
def test_spec_errors_are_one_line_naming_file_and_field(setup, change, expected):
    path = write_experiment(setup, **change)
    with pytest.raises(ExperimentError) as e:
        load_experiment(path)
    msg = str(e.value)
    assert msg.startswith(str(path) + ": ") and expected in msg and "\n" not in msg, msg


def test_spec_errors_in_arms_and_recipes(setup):
    exp = yaml.safe_load(write_experiment(setup).read_text())
    cases = [
        (("random", "finetune", "init"), "rand", "arms.random.finetune.init: 'rand': expected pretrained or random"),
        (("random", "finetune", "lr"), 1, "arms.random.finetune.lr: unknown key"),
        (("random", "finetune", "set"), ["train.batch_size=0"], "arms.random.finetune: --set: 'train.batch_size'"),
    ]
    for (arm, stage, key), value, expected in cases:
        body = json.loads(json.dumps(exp))
        body["arms"][arm][stage][key] = value
        path = setup["tmp"] / "bad.yaml"
        path.write_text(yaml.safe_dump(body))
        with pytest.raises(ExperimentError, match=None) as e:
            load_experiment(path)
        assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    # through the CLI: one line, exit 2, nothing written
    body = json.loads(json.dumps(exp))
    body["arms"]["pretrained"].pop("pretrain")
    path = setup["tmp"] / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    r = run_experiment(path, setup["tmp"] / "out")
    assert r.exit_code == 2 and r.output.strip().count("\n") == 0, r.output
    assert "arms.pretrained: has no pretrain section" in r.output and not (setup["tmp"] / "out").exists()


def test_a_grid_without_a_test_split_is_refused(setup):
    no_test = [s for s in setup["finetune_set"] if not s.startswith("task.test_file")]
    arms = {
        a: {"pretrain": {"recipe": setup["recipe"]}, "finetune": {"set": no_test}, "evaluate": {"split": "test"}}
        for a in ("pretrained", "random")
    }
    path = write_experiment(
        setup,
        stages=["pretrain", "finetune", "evaluate"],
        metric="evaluate:accuracy",
        arms=arms,
        grid={"finetune": {"train.learning_rate": [1e-3, 1e-4]}},
    )
    with pytest.raises(ExperimentError, match="a grid needs a test split to report on: set task.test_file"):
        load_experiment(path)
    for a in arms.values():
        a["finetune"]["set"] = setup["finetune_set"]
    arms["random"]["evaluate"]["split"] = "validation"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "arms": arms}))
    with pytest.raises(ExperimentError, match="arms.random.evaluate.split: 'validation': a grid is selected on"):
        load_experiment(path)
    # phone books draw a test split of their own: no test file to set
    for a in arms.values():
        a["finetune"] = {"recipe": "phonebook_tiny", "task": "phonebook"}
        a["evaluate"] = {"task": "phonebook", "split": "test", "limit": 4}
    path.write_text(
        yaml.safe_dump({**yaml.safe_load(path.read_text()), "arms": arms, "metric": "evaluate:all_correct"})
    )
    assert load_experiment(path).arms["random"]["evaluate"].split == "test"


# ----------------------------------------------------------------------------- the intervals


@pytest.mark.parametrize("values", [[0.61, 0.64], [0.5, 0.52, 0.58, 0.49], [1.0, 2.0, 4.0, 8.0, 16.0, 3.0]])
def test_t_interval_matches_scipy(values):
    iv = xstats.t_interval(values)
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
    assert iv.method == "t" and iv.n == len(values)
    assert iv.mean == pytest.approx(np.mean(values)) and (iv.low, iv.high) == pytest.approx((lo, hi), rel=1e-12)
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert (iv.low, iv.high) == pytest.approx((ci.low, ci.high), rel=1e-12)
    assert xstats.t_interval([0.7]).low is None  # one seed: no interval


def test_paired_difference_matches_scipy_ttest_rel():
    arm = {0: 0.71, 1: 0.66, 2: 0.74, 3: 0.69}
    ref = {3: 0.60, 0: 0.65, 1: 0.61, 2: 0.70, 9: 0.1}  # seed 9 has no partner: left out
    d = xstats.paired_difference(arm, ref)
    a, b = [arm[s] for s in range(4)], [ref[s] for s in range(4)]
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert d.n == 4 and d.mean == pytest.approx(np.mean(np.subtract(a, b)))
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high), rel=1e-12)


def test_bootstrap_from_five_seeds_matches_scipy_percentile_bootstrap():
    values = [0.61, 0.64, 0.58, 0.70, 0.66, 0.59]
    iv = xstats.mean_interval(values)
    assert iv.method == "bootstrap" and xstats.mean_interval(values[:4]).method == "t"
    ref = stats.bootstrap(
        (values,), np.mean, confidence_level=0.95, n_resamples=20_000, method="percentile", random_state=1
    ).confidence_interval
    assert iv.low == pytest.approx(ref.low, abs=0.006) and iv.high == pytest.approx(ref.high, abs=0.006)
    assert iv == xstats.mean_interval(values)  # a fixed generator: the same values give the same interval


# ----------------------------------------------------------------------------- running


def test_experiment_runs_and_second_invocation_reuses_every_run(setup):
    path = write_experiment(setup)
    out = setup["tmp"] / "out"
    r = run_experiment(path, out)
    assert r.exit_code == 0, r.output
    assert "[6/6] done" in r.output and "ETA" in r.output
    res = json.loads((out / "results.json").read_text())
    for arm in ("pretrained", "random"):
        a = res["arms"][arm]
        assert a["status"] == "ok" and len(a["values"]) == 2 and a["interval"]["method"] == "t"
    assert res["arms"]["pretrained"]["difference"]["n"] == 2 and res["arms"]["random"]["difference"] is None
    for f in ("results.md", "results.csv", "results.png"):
        assert (out / f).is_file()
    assert "| pretrained | 2 |" in r.output and "Δ vs random (paired)" in r.output
    # the random arm did not pretrain; its manifest says init: random
    info = json.loads((out / "runs/random/seed0/finetune/run.json").read_text())
    assert info["init"] == "random" and info["source"] is None
    assert not (out / "runs/random/seed0/pretrain").exists()
    summaries = sorted(out.glob("runs/*/seed*/*/summary.json"))
    assert len(summaries) == 6
    before = {p: p.stat().st_mtime_ns for p in summaries}
    r2 = run_experiment(path, out)
    assert r2.exit_code == 0, r2.output
    assert r2.output.count("(reused)") == 6
    assert {p: p.stat().st_mtime_ns for p in summaries} == before
    assert (
        json.loads((out / "results.json").read_text())["arms"]["pretrained"]["values"]
        == res["arms"]["pretrained"]["values"]
    )
    # --jobs 2: worker processes reuse the same runs, and a run's "start" line appears when it starts (at most
    # two running at once), not when it is queued
    r3 = run_experiment(path, out, "--jobs", "2")
    assert r3.exit_code == 0, r3.output
    assert r3.output.count("(reused)") == 6
    running, counts = 0, []
    for line in r3.output.splitlines():
        running += (" start " in line) - (" done " in line)
        assert running <= 2, r3.output
        if m := re.match(r"\[(\d+)/6\] (start|done) ", line):
            counts.append(int(m[1]))
    # every line counts the runs done, so the count never goes back even when two runs start before one ends
    assert counts[0] == 0 and counts[-1] == 6 and counts == sorted(counts), r3.output


def test_a_failing_arm_is_reported_failed_and_the_others_still_run(setup):
    broken = [*setup["finetune_set"], "task.text_fields=[no_such_column]"]
    path = write_experiment(setup, seeds=[0])
    body = yaml.safe_load(path.read_text())
    body["arms"]["broken"] = {"pretrain": {"recipe": setup["recipe"]}, "finetune": {"set": broken}}
    path.write_text(yaml.safe_dump(body))
    out = setup["tmp"] / "out"
    r = run_experiment(path, out)
    assert r.exit_code == 1, r.output
    res = json.loads((out / "results.json").read_text())
    b = res["arms"]["broken"]
    assert b["status"] == "failed" and "no_such_column" in b["error"] and b["interval"] is None
    assert res["arms"]["pretrained"]["status"] == res["arms"]["random"]["status"] == "ok"
    assert "FAILED finetune broken seed 0" in r.output and "| broken | – | failed |" in r.output
    assert "- broken failed: " in (out / "results.md").read_text()
    assert list((out / "errors").glob("*.txt"))  # the traceback is kept


def test_dry_run_counts_finished_evaluations_and_analyses_as_done(setup):
    """A finished file's --dry-run said 'no measured cost yet for the 2 runs to go': its evaluation and analysis
    were never counted as done. They are now, as the experiment would reuse them, and when only they are left
    the line says so rather than asking for --seeds 1."""
    path = write_experiment(setup, seeds=[0], stages=["finetune", "evaluate", "analyze"], metric="evaluate:accuracy")
    body = yaml.safe_load(path.read_text())
    body["arms"] = {"random": body["arms"]["random"]}
    body["arms"]["random"].update(evaluate={"split": "test"}, analyze={"kernels": {"layers": "0"}})
    path.write_text(yaml.safe_dump(body))
    out = setup["tmp"] / "out"
    dry = lambda: run_experiment(path, out, "--dry-run").output.splitlines()[-1]  # noqa: E731
    assert dry() == "time: no measured cost yet for the 3 runs to go: run --seeds 1 first, then ask again"
    r = run_experiment(path, out)
    assert r.exit_code == 0 and "plus 1 evaluation." in r.output, r.output
    assert dry() == "time: every run is done already"
    (evaluation,) = (out / "runs/random/seed0/finetune/eval").glob("*-test.json")
    evaluation.unlink()
    (marker,) = (out / "runs/random/seed0/finetune/analysis").glob(".experiment-*.json")
    marker.unlink()
    assert dry() == "time: only 1 evaluation and 1 analysis to go; the estimate times training runs only"


def test_grid_is_selected_on_validation_and_reported_on_test(setup):
    arms = {
        a: {
            "pretrain": {"recipe": setup["recipe"]},
            "finetune": {"set": setup["finetune_set"], **({"init": "random"} if a == "random" else {})},
            "evaluate": {"split": "test"},
        }
        for a in ("pretrained", "random")
    }
    grid = {"finetune": {"train.learning_rate": [1e-5, 3e-3]}}
    path = write_experiment(
        setup, stages=["pretrain", "finetune", "evaluate"], metric="evaluate:accuracy", arms=arms, grid=grid, seeds=[0]
    )
    out = setup["tmp"] / "out"
    r = run_experiment(path, out)
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    for arm, a in res["arms"].items():
        runs = {i: out / f"runs/{arm}/seed0/finetune-g{i}" for i in range(2)}
        val = {i: json.loads((runs[i] / "summary.json").read_text())["validation"]["accuracy"] for i in runs}
        best = max(val, key=lambda i: (val[i], -i))  # the earliest point wins a tie
        assert [row["selected"] for row in a["grid"]] == [i == best for i in range(2)]
        assert a["selected"] == f"train.learning_rate={grid['finetune']['train.learning_rate'][best]}"
        # the reported number is the selected run's test evaluation, and only that run was evaluated
        (test_file,) = (runs[best] / "eval").glob("*-test.json")  # TASK-test.json
        test = json.loads(test_file.read_text())
        assert test["split"] == "test" and a["values"] == {"0": test["metrics"]["accuracy"]}
        assert not (runs[1 - best] / "eval").exists()


def test_finetune_init_random_records_it_and_starts_from_a_fresh_model(setup):
    """`ssmlm finetune --init random`: the architecture of --recipe's model, the weights a fresh model of the
    seed (frozen here by a rule with lr multiplier 0, so the saved weights are the initial ones)."""
    from flax import nnx

    from ssmlm.objectives.tasks import HEADS
    from ssmlm.runs import open_run

    freeze = 'train.param_rules=[{pattern: ".*", lr_multiplier: 0}]'
    args = ["finetune", "--init", "random", "--recipe", setup["recipe"], "--name", "rand", "-q"]
    sets = [x for s in [*setup["finetune_set"], "train.seed=7", freeze] for x in ("--set", s)]
    closing = " ".join(invoke(*args, *sets).output.split())  # (the summary's title may wrap)
    assert "finetune → " in closing and "from random initialisation (the architecture of recipe" in closing
    # task.test_file was given: the closing table says whose split it shows, and how to score the test split
    assert "the table is the validation split; score the test split: ssmlm evaluate --ckpt" in closing
    run = open_run(setup["tmp"] / "runs" / "rand")
    assert run.info["init"] == "random" and run.info["source"] is None and run.recipe.train.seed == 7
    saved, _ = run.load_model()
    fresh = HEADS["classify"].build(run.recipe.model, 2, 7)
    a, b = (dict(nnx.to_flat_state(nnx.state(m, nnx.Param))) for m in (saved, fresh))
    assert a.keys() == b.keys()
    assert all(np.array_equal(np.asarray(a[k].get_value()), np.asarray(b[k].get_value())) for k in a)
    # lr 0 stays refused
    r = invoke(*args, *sets, "--set", "train.learning_rate=0", code=None)
    assert r.exit_code == 2 and "train.learning_rate" in r.output


@pytest.mark.slow
def test_the_shipped_smoke_experiment(tmp_path):
    """experiments/smoke.yaml as a user runs it (about 3 minutes on 2 cores): both arms finish."""
    r = run_experiment(ROOT / "experiments" / "smoke.yaml", tmp_path / "smoke")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "smoke" / "results.json").read_text())
    assert all(a["status"] == "ok" and len(a["values"]) == 2 for a in res["arms"].values())


# ----------------------------------------------------------------------------- anchors, ${VAR}, references


def test_anchor_lists_splice_env_vars_expand_and_per_arm_references(setup, monkeypatch):
    """x-* keys hold anchors, a list inside `set` is spliced in, ${NAME} is the environment's, and `reference`
    may map each arm to its own reference; a missing variable or an unknown arm is one line naming the field."""
    common = setup["finetune_set"]
    text = f"""
x-common:
  ft: &ft {json.dumps(common)}
seeds: [0, 1]
stages: [pretrain, finetune]
metric: finetune:accuracy
reference: {{a: random, b: random}}
arms:
  a:
    pretrain: {{recipe: "${{TINY_RECIPE}}"}}
    finetune: {{set: [*ft, train.learning_rate=1.0e-3]}}
  b:
    pretrain: {{recipe: {setup["recipe"]}}}
    finetune: {{set: [*ft, "train.steps=${{FT_STEPS}}"]}}
  random:
    pretrain: {{recipe: {setup["recipe"]}}}
    finetune: {{set: *ft, init: random}}
"""
    path = setup["tmp"] / "anchors.yaml"
    path.write_text(text)
    monkeypatch.delenv("FT_STEPS", raising=False)
    with pytest.raises(ExperimentError, match=r"arms.b.finetune.set: 'train.steps=\$\{FT_STEPS\}': environment var"):
        load_experiment(path)
    monkeypatch.setenv("FT_STEPS", "3")
    path.write_text(text.replace('"${TINY_RECIPE}"', setup["recipe"]))
    exp = load_experiment(path)
    assert exp.arms["a"]["finetune"].set == (*common, "train.learning_rate=1.0e-3")
    assert exp.arms["b"]["finetune"].set[-1] == "train.steps=3"
    assert exp.arms["random"]["finetune"].set == tuple(common)
    assert [exp.reference_of(a) for a in ("a", "b", "random")] == ["random", "random", None]
    path.write_text(text.replace("b: random}", "b: nope}").replace('"${TINY_RECIPE}"', setup["recipe"]))
    with pytest.raises(ExperimentError, match=r"reference.b: 'nope' is not an arm"):
        load_experiment(path)


def test_per_arm_references_in_the_report():
    """Each arm's paired difference is to its own reference; the table says which."""
    from ssmlm.experiment.report import markdown, summarize
    from ssmlm.experiment.spec import Experiment, Metric

    exp = Experiment(
        Path("x.yaml"),
        (0, 1, 2),
        ("finetune",),
        Metric("finetune", "accuracy", "max"),
        {"a1": "a0", "b1": "b0"},
        dict.fromkeys(["a0", "a1", "b0", "b1"], {}),
        {},
    )
    vals = {"a0": [0.5, 0.6, 0.7], "a1": [0.6, 0.8, 0.7], "b0": [0.1, 0.1, 0.2], "b1": [0.1, 0.2, 0.2]}
    arms = {k: {"status": "ok", "error": None, "values": dict(enumerate(v)), "runs": {}} for k, v in vals.items()}
    res = summarize(exp, arms, 1.0)
    assert res["arms"]["a1"]["difference"]["mean"] == pytest.approx(0.1)
    assert res["arms"]["b1"]["difference"]["mean"] == pytest.approx(1 / 30)
    assert res["arms"]["a0"]["difference"] is None and res["arms"]["a1"]["reference"] == "a0"
    md = markdown(res)
    assert "Δ vs its reference (paired)" in md and "| +0.1 vs a0 |" in md


def test_intervals_past_the_metrics_bounds_are_cut_in_the_table_and_plot_not_in_the_json(setup, tmp_path):
    """Three seeds of an accuracy near 1: the t-interval reaches past 1. results.md and the plot cut it at the
    metric's bounds (an accuracy's [0, 1] by default) and say so; .json and .csv keep it as computed."""
    from ssmlm.experiment.report import markdown, summarize, write
    from ssmlm.experiment.spec import Experiment, Metric

    bounds = lambda **change: load_experiment(write_experiment(setup, **change)).metric.bounds  # noqa: E731
    assert bounds() == (0.0, 1.0)  # finetune:accuracy
    assert bounds(bounds=None) is None  # `bounds: null`
    assert bounds(metric="pretrain:loss") is None
    assert bounds(metric="finetune:f1", bounds=[0, 100]) == (0.0, 100.0)
    exp = Experiment(
        Path("x.yaml"),
        (0, 1, 2),
        ("finetune",),
        Metric("finetune", "accuracy", "max", (0.0, 1.0)),
        "a",
        {"a": {}, "b": {}},
        {},
    )
    vals = {"a": [0.6, 0.9, 0.99], "b": [0.5, 0.5, 0.52]}
    arms = {k: {"status": "ok", "error": None, "values": dict(enumerate(v)), "runs": {}} for k, v in vals.items()}
    res = summarize(exp, arms, 1.0)
    high = res["arms"]["a"]["interval"]["high"]
    assert high > 1.0  # the t-interval as computed
    md = markdown(res)
    assert f"[{res['arms']['a']['interval']['low']:.4g}, 1]* t" in md, md
    assert "*: cut at the metric's bounds [0, 1]" in md
    paths = write(res, tmp_path)
    assert json.loads(paths["json"].read_text())["arms"]["a"]["interval"]["high"] == high
    assert f"{high}" in paths["csv"].read_text()
    # nothing past the bounds: no mark, no note
    arms["a"]["values"] = {0: 0.6, 1: 0.62, 2: 0.64}
    md = markdown(summarize(exp, arms, 1.0))
    assert "*" not in md, md


def test_seeds_option_runs_the_first_n_seeds(setup):
    r = run_experiment(write_experiment(setup), setup["tmp"] / "out", "--seeds", "1", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "seed 0" in r.output and "seed 1" not in r.output
    r = run_experiment(write_experiment(setup), setup["tmp"] / "out", "--seeds", "0")
    assert r.exit_code == 2 and "--seeds = 0: expected" in r.output


def test_analyze_stage_runs_each_arms_analysis_once(setup):
    """stages ending in analyze: `ssmlm analyze NAME` on every arm × seed's last run (RUN/analysis), reused on the
    next invocation; an unknown analysis or option is one line naming the field."""
    path = write_experiment(setup, seeds=[0], stages=["finetune", "evaluate", "analyze"], metric="evaluate:accuracy")
    body = yaml.safe_load(path.read_text())
    body["arms"] = {"random": body["arms"]["random"]}  # init: random (the pretrain section gives the architecture)
    body["arms"]["random"].update(evaluate={"split": "test"}, analyze={"kernels": {"layers": "0"}})
    bad = json.loads(json.dumps(body))
    bad["arms"]["random"]["analyze"] = {"kernel": {}}
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ExperimentError, match=r"arms.random.analyze.kernel: unknown analysis; expected one of"):
        load_experiment(path)
    bad["arms"]["random"]["analyze"] = {"kernels": {"colour": 1}}
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ExperimentError, match=r"arms.random.analyze.kernels.colour: unknown option"):
        load_experiment(path)
    path.write_text(yaml.safe_dump(body))
    out = setup["tmp"] / "out"
    plan = run_experiment(path, out, "--dry-run").output
    assert f"evaluate random seed 0 (test): {out}/runs/random/seed0/finetune/eval" in plan, plan
    assert f"analyze kernels random seed 0: {out}/runs/random/seed0/finetune/analysis" in plan, plan
    r = run_experiment(path, out)
    assert r.exit_code == 0, r.output
    assert "[3/3] done analyze kernels random seed 0" in r.output
    run = out / "runs" / "random" / "seed0" / "finetune"
    assert list((run / "analysis").glob("kernels*.png")), sorted((run / "analysis").iterdir())
    assert len(list((run / "eval").glob("*-test.json"))) == 1
    r2 = run_experiment(path, out)
    assert r2.exit_code == 0 and r2.output.count("(reused)") == 3, r2.output


def test_the_eta_times_pretraining_per_step_and_names_what_is_not_timed_yet():
    """A budget sweep's pretraining runs differ 16x in length: the ETA is per step, and finetuning runs that
    have not been timed yet are named rather than costed as pretraining runs."""
    from collections import Counter
    from types import SimpleNamespace

    from ssmlm.experiment.plan import Job
    from ssmlm.experiment.runner import Outcome, Runner

    def pre(key, steps):
        return Job(key, "pretrain", key, Path(key), SimpleNamespace(train=SimpleNamespace(steps=steps)))

    jobs = [pre("a", 200), pre("b", 800), pre("c", 3200)]
    lines = []
    r = Runner(Path("."), Counter(pretrain=3, finetune=2), steps=4200, echo=lines.append)
    r._finish(jobs[0], Outcome(True, {}, 20.0))  # 0.1 s per step
    assert lines[-1].endswith("4 to go, ETA 0:06:40 + the finetune runs (none timed yet)"), lines[-1]
    r._finish(jobs[1], Outcome(True, {}, 0.0, reused=True))  # reused: no time, its steps are no longer to go
    assert "ETA 0:05:20 +" in lines[-1], lines[-1]
    r._finish(Job("f", "finetune", "f", Path("f")), Outcome(True, {}, 30.0))
    assert lines[-1].endswith("2 to go, ETA 0:05:50"), lines[-1]
    # a run resumed at step 150 of 200 ran 50 steps in its 5 s: 0.1 s per step, as if it had run whole
    lines.clear()
    r = Runner(Path("."), Counter(pretrain=2), steps=1000, echo=lines.append)
    r._finish(jobs[0], Outcome(True, {"start_step": 150, "final_step": 200, "total_steps": 200}, 5.0))
    assert lines[-1].endswith("1 to go, ETA 0:01:20"), lines[-1]


# ----------------------------------------------------------------------------- the order of work


def test_the_plan_finishes_seed_0_of_every_arm_before_seed_1_starts(setup):
    """2 arms × 3 seeds, pretrain → finetune → evaluate: seed 0's whole chain of every arm comes first (the
    --dry-run lists the runs in the order they run), so an experiment stopped early holds complete pairs."""
    path = write_experiment(
        setup, seeds=[0, 1, 2], stages=["pretrain", "finetune", "evaluate"], metric="evaluate:accuracy"
    )
    r = run_experiment(path, setup["tmp"] / "out", "--dry-run")
    assert r.exit_code == 0, r.output
    runs = [line.split(":")[0] for line in r.output.splitlines() if " seed " in line]
    chain = lambda s: [
        f"pretrain pretrained seed {s}",
        f"finetune pretrained seed {s}",  # noqa: E731
        f"evaluate pretrained seed {s} (validation)",
        f"finetune random seed {s}",
        f"evaluate random seed {s} (validation)",
    ]
    assert runs == chain(0) + chain(1) + chain(2), r.output


def test_a_free_worker_takes_the_first_run_whose_inputs_are_ready():
    """With --jobs 2 and seed 0's pretraining running, the second worker takes seed 0's random-init finetuning
    (its pretrained finetuning waits), then seed 1's pretraining; a run whose input failed is not run."""
    from collections import Counter

    from ssmlm.experiment.plan import Job
    from ssmlm.experiment.runner import Outcome, Runner

    def job(key, *deps):
        return Job(key, key.split()[0], key, Path(key), deps=deps)

    queue = [
        job("pretrain a 0"),
        job("finetune a 0", "pretrain a 0"),
        job("finetune r 0"),
        job("pretrain a 1"),
        job("finetune a 1", "pretrain a 1"),
        job("finetune r 1"),
    ]
    jobs, lines = {j.key: j for j in queue}, []
    runner = Runner(Path("."), Counter(pretrain=2, finetune=4), jobs=2, echo=lines.append)
    assert runner._next(queue).key == "pretrain a 0"  # running from here on
    assert runner._next(queue).key == "finetune r 0"  # not "finetune a 0": its pretraining is still going
    runner._finish(jobs["finetune r 0"], Outcome(True, {}, 1.0))  # done: the next free worker takes
    assert runner._next(queue).key == "pretrain a 1"
    runner._finish(jobs["pretrain a 0"], Outcome(False, error="boom"))
    assert runner._next(queue).key == "finetune r 1"  # finetune a 0 is recorded as not run, a 1 still waits
    assert runner.done["finetune a 0"].ok is False and "not run: pretrain a 0 failed" in lines[-1], lines
    assert [j.key for j in queue] == ["finetune a 1"]


# ----------------------------------------------------------------------------- what can be concluded


def test_intervals_from_two_pairs_or_no_spread_are_not_estimable(tmp_path):
    """Two seeds whose paired differences are both -38/600 used to print Δ -0.0633 [-0.0633, -0.0633]. An
    interval from fewer than 3 values, or from equal values, is marked not estimable with the reason, in the
    table, results.json and .csv; the point estimate stays, and so does the interval as computed."""
    from ssmlm.experiment.report import markdown, summarize, write
    from ssmlm.experiment.spec import Experiment, Metric

    metric = Metric("finetune", "accuracy", "max", (0.0, 1.0))
    exp = Experiment(Path("x.yaml"), (0, 1), ("finetune",), metric, "random", {"bigs": {}, "random": {}}, {})
    rnd = {0: 0.61, 1: 0.64}
    arms = {"bigs": {0: rnd[0] - 38 / 600, 1: rnd[1] - 38 / 600}, "random": rnd}
    arms = {k: {"status": "ok", "error": None, "values": v, "runs": {}} for k, v in arms.items()}
    res = summarize(exp, arms, 1.0)
    d = res["arms"]["bigs"]["difference"]
    assert d["mean"] == pytest.approx(-38 / 600) and d["estimable"] is False
    assert d["reason"] == "n=2 < 3; zero spread"
    iv = res["arms"]["random"]["interval"]
    assert iv["estimable"] is False and iv["reason"] == "n=2 < 3" and iv["low"] is not None  # kept as computed
    md = markdown(res)
    assert "| bigs | 2 | 0.5617 | not estimable (n=2 < 3) | -0.06333 | not estimable (n=2 < 3; zero spread) |" in md
    assert "Not estimable: an interval from fewer than 3 values" in md and "[" not in md.split("|---")[1], md
    paths = write(res, tmp_path)
    assert json.loads(paths["json"].read_text())["arms"]["bigs"]["difference"]["reason"] == "n=2 < 3; zero spread"
    import csv

    rows = {r["arm"]: r for r in csv.DictReader(paths["csv"].open())}
    assert rows["bigs"]["diff_estimable"] == "False" and rows["bigs"]["diff_reason"] == "n=2 < 3; zero spread"
    assert paths["png"].is_file()
    # three seeds: estimable, unless every value is the same
    exp = Experiment(Path("x.yaml"), (0, 1, 2), ("finetune",), metric, "random", {"bigs": {}, "random": {}}, {})
    arms["random"]["values"] = {0: 0.61, 1: 0.64, 2: 0.58}
    arms["bigs"]["values"] = {0: 0.9, 1: 0.9, 2: 0.9}
    res = summarize(exp, arms, 1.0)
    assert (
        res["arms"]["random"]["interval"]["estimable"] is True and res["arms"]["random"]["interval"]["reason"] is None
    )
    assert res["arms"]["bigs"]["interval"]["reason"] == "zero spread"
    assert res["arms"]["bigs"]["difference"]["estimable"] is True  # the differences do spread
    assert "| random | 3 | 0.61 | [" in markdown(res)
    assert xstats.t_interval([0.7]).reason == "n=1 < 3"


def write_one_arm(setup, name: str, pretrain_recipe: str, seeds: list[int]) -> Path:
    """A file of one arm, pretraining only, and no reference."""
    body = {
        "seeds": seeds,
        "stages": ["pretrain"],
        "metric": "pretrain:mlm_loss",
        "arms": {"bigs": {"pretrain": {"recipe": pretrain_recipe}}},
    }
    path = setup["tmp"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_a_file_of_one_arm_runs_without_comparisons(setup):
    two = yaml.safe_load(write_experiment(setup).read_text())
    del two["reference"]
    (setup["tmp"] / "two.yaml").write_text(yaml.safe_dump(two))
    with pytest.raises(ExperimentError, match=r"two.yaml: reference: missing: the arm the others are compared with"):
        load_experiment(setup["tmp"] / "two.yaml")
    path = write_one_arm(setup, "one", setup["recipe"], [0, 1])
    out = setup["tmp"] / "out"
    plan = run_experiment(path, out, "--dry-run").output
    assert "reference none (one arm: no comparisons)" in plan
    assert "time: no measured cost yet for the 2 runs to go: run --seeds 1 first, then ask again" in plan, plan
    assert run_experiment(path, out, "--seeds", "1").exit_code == 0
    # the dry run's estimate: the measured seconds per step of seed 0 × the steps of seed 1 (as long), one at a time
    measured = json.loads((out / "runs" / "bigs" / "seed0" / "pretrain" / "summary.json").read_text())
    plan = run_experiment(path, out, "--dry-run", "--jobs", "2").output
    about = clock_time(measured["seconds_total"])
    assert f"time: about {about} for the 1 run to go at --jobs 2 (from the 1 done" in plan
    r = run_experiment(path, out)
    assert r.exit_code == 0, r.output
    assert "experiment one: 1 arm × 2 seeds, 2 runs" in r.output
    assert "| arm | n | mean | 95% CI |\n" in r.output and "Δ" not in r.output, r.output
    assert "| bigs | 2 |" in r.output and "not estimable (n=2 < 3)" in r.output
    res = json.loads((out / "results.json").read_text())
    assert res["reference"] is None and res["arms"]["bigs"]["difference"] is None
    assert len(res["arms"]["bigs"]["values"]) == 2 and "Δ" not in (out / "results.md").read_text()
    assert "warning" not in r.output  # these rows are full
    assert "time: every run is done already" in run_experiment(path, out, "--dry-run").output


def test_empty_arms_are_named_before_the_reference_they_leave_out(tmp_path):
    """`arms: {}` is the mistake, not the `reference` a file of no arms cannot name."""
    body = {"seeds": [0], "stages": ["pretrain"], "metric": "pretrain:mlm_loss", "arms": {}}
    (tmp_path / "none.yaml").write_text(yaml.safe_dump(body))
    with pytest.raises(ExperimentError, match=r"none.yaml: arms: expected a non-empty mapping, got \{\}"):
        load_experiment(tmp_path / "none.yaml")


def test_each_runs_warnings_are_shown_once_and_kept_in_results_md(setup):
    """Documents of one short sentence fill a third of each 32-token row: `ssmlm pretrain` says so, and the
    experiment (without --verbose) shows it once, under the run's line, and in results.md, from summary.json."""
    short = setup["tmp"] / "short.jsonl"
    short.write_text("".join(json.dumps({"text": t}) + "\n" for t in english_lines(80, seed=5)))
    recipe = tiny_recipe(setup["tmp"] / "short.yaml", short, train={"steps": 2})
    path = write_one_arm(setup, "warns", str(recipe), [0])
    out = setup["tmp"] / "out"
    r = run_experiment(path, out)
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "runs/bigs/seed0/pretrain/summary.json").read_text())
    (warning,) = summary["warnings"]
    assert warning.startswith("packing: the training rows are ") and "[yellow]" not in warning
    lines = r.output.splitlines()
    at = lines.index("  warning: " + warning)  # under the run's line, once
    assert "done pretrain bigs seed 0" in lines[at - 1] and r.output.count(warning) == 1, r.output
    assert "1 run gave warnings: above, under each run's line, and in results.md" in r.output
    assert f"- pretrain bigs seed 0: {warning}" in (out / "results.md").read_text()
    res = json.loads((out / "results.json").read_text())
    assert [(w["arm"], w["seed"], w["stage"], w["warning"]) for w in res["warnings"]] == [
        ("bigs", 0, "pretrain", warning)
    ]
    r = run_experiment(path, out)  # reused: the warning comes from summary.json, once again
    assert r.exit_code == 0 and "(reused)" in r.output and r.output.count(warning) == 1, r.output


def start_long_experiment(setup, corpus_file, name: str, prefix: list[str], **popen):
    """Start `ssmlm experiment --jobs 2` on two 100,000-step pretrainings in a session of its own (a signal sent to
    its pid reaches the parent only, as `kill PID` does); return once both runs are training."""
    import subprocess
    import time

    long = tiny_recipe(setup["tmp"] / f"long-{name}.yaml", corpus_file, train={"steps": 100000})
    body = {
        "seeds": [0, 1],
        "stages": ["pretrain"],
        "metric": "pretrain:loss",
        "reference": "a",
        "arms": {"a": {"pretrain": {"recipe": str(long)}}},
    }
    path = setup["tmp"] / f"long-exp-{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    out = setup["tmp"] / f"out-{name}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [*prefix, "experiment", str(path), "--out", str(out), "--jobs", "2"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, **popen)
    metrics = [out / f"runs/a/seed{s}/pretrain/metrics.jsonl" for s in (0, 1)]
    try:
        deadline = time.time() + 300
        while not all(m.is_file() and m.read_text().count("\n") >= 2 for m in metrics):
            assert time.time() < deadline and proc.poll() is None, proc.communicate()[0]
            time.sleep(0.1)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc, [out / f"runs/a/seed{s}/pretrain/checkpoints" for s in (0, 1)]


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_ctrl_c_to_the_parent_alone_stops_every_worker_with_a_checkpoint(setup, corpus_file, signum):
    """`--jobs 2` with SIGINT or SIGTERM sent to the experiment's process only (kill -INT, kill, a scheduler): the
    parent passes SIGINT on, each running run stops after its step with a checkpoint, and the command exits 130 in
    seconds (it used to wait for the workers to finish their whole runs), also when started with SIGINT ignored."""
    import subprocess
    import sys

    # started with SIGINT ignored, as a job started with `&` from a script is (and as everything is under a CI
    # runner started that way): `kill -INT` must stop it all the same
    shim = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); sys.argv[0] = 'ssmlm'; "
        "runpy.run_module('ssmlm', run_name='__main__')"
    )
    proc, checkpoints = start_long_experiment(
        setup,
        corpus_file,
        signum,
        [sys.executable, "-c", shim],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        os.kill(proc.pid, getattr(signal, signum))
        text = proc.communicate(timeout=120)[0]  # a hang guard, not a speed: the workers stop after one step
    finally:
        if proc.poll() is None:  # a failure above: no 100,000-step runs left behind (the workers watch the parent)
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, text
    for c in checkpoints:
        assert any(c.iterdir()), text


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc")
def test_workers_of_a_killed_parent_checkpoint_and_exit(setup, corpus_file):
    """The experiment's process killed outright (SIGKILL, an out-of-memory kill): each pool worker stops its run
    after the step with a checkpoint, then exits instead of waiting for work that will never come."""
    import subprocess
    import sys
    import time

    proc, checkpoints = start_long_experiment(
        setup,
        corpus_file,
        "kill",
        [sys.executable, "-m", "ssmlm"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def children() -> list[int]:
        pids = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid:
                    pids.append(int(d.name))
            except (OSError, IndexError, ValueError):  # a process that ended meanwhile
                pass
        return pids

    def alive(pid: int) -> bool:  # an exited worker nobody reaped yet (a zombie) counts as gone
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    workers: list[int] = []
    try:
        workers = [p for p in children() if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(workers) == 2, workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 120
        while any(map(alive, workers)) and time.time() < deadline:
            time.sleep(0.2)
        left = [p for p in workers if alive(p)]
        assert not left, f"workers still running {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in workers:  # a failure above: nothing left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    for c in checkpoints:
        assert any(c.iterdir())


def test_a_local_task_may_be_named_in_the_file(setup):
    """``task: NAME`` beside task.train_file names a local task (as ``finetune --task NAME --train-file``); without
    a file the name must be a known task."""
    arms = {
        a: {"pretrain": {"recipe": setup["recipe"]}, "finetune": {"task": "polarity", "set": setup["finetune_set"]}}
        for a in ("pretrained", "random")
    }
    exp = load_experiment(write_experiment(setup, arms=arms))
    assert exp.arms["pretrained"]["finetune"].task == "polarity"
    for a in arms.values():
        a["finetune"]["set"] = []
    with pytest.raises(ExperimentError, match=r"arms\.\w+\.finetune\.task: unknown task 'polarity'"):
        load_experiment(write_experiment(setup, arms=arms))


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
def test_a_diverged_run_is_a_failed_arm_and_is_never_reused_as_done(setup, corpus_file):
    diverging = tiny_recipe(
        setup["tmp"] / "diverging.yaml",
        corpus_file,
        train={"steps": 12, "learning_rate": 1e6, "warmup_steps": 0, "log_every": 4, "checkpoint_every": 2},
    )
    path = write_one_arm(setup, "nan", str(diverging), [0])
    out = setup["tmp"] / "out"
    for _ in (1, 2):  # the second invocation runs it again (from its newest checkpoint), not "reused"
        r = run_experiment(path, out)
        assert r.exit_code == 1, r.output
        assert "FAILED pretrain bigs seed 0" in r.output and "training diverged by step" in r.output, r.output
        assert "reused" not in r.output
    (summary,) = out.rglob("summary.json")
    assert json.loads(summary.read_text())["failed"].startswith("diverged:")
