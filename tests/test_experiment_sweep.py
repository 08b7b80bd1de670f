"""A budget sweep (`budgets:` and `probes:` in an experiment file): one pretraining run per arm × seed that keeps
every budget's checkpoint and serves each probe's finetuning from it; the file's one-line errors; the plan, the
dry run and the ETA; an end-to-end tiny sweep that a second invocation reuses entirely."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import corpus_dir, invoke

from ssmlm.experiment.eta import steps
from ssmlm.experiment.plan import build_plan, dry_run_lines
from ssmlm.experiment.spec import ExperimentError, load_experiment

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "experiments" / "birdie_budget.yaml"


def tiny_lm_recipe(tmp: Path, name: str, arch: str, mixture: str) -> Path:
    body = {
        "base": "lm_tiny",
        "name": name,
        "model": {"arch": arch, "hidden_size": 16, "num_layers": 1, "state_size": 16, "num_heads": 2,
                  "max_seq_length": 320},
        "data": {"source": str(corpus_dir(tmp / "corpus", 12, 20)), "vocab_size": 300},
        "objective": {"mixture": mixture, "min_sample_space": 16},
        "train": {"batch_size": 2, "log_every": 1, "eval_every": 0, "checkpoint_every": 0},
    }  # fmt: skip
    if arch == "transformer_lm":
        body["model"].pop("state_size")
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


PROBE = [
    "task.max_seq_length=320",
    "task.phonebook.digits=2",
    "task.phonebook.queries=[1, 1]",
    "task.phonebook.train_books=16",
    "task.phonebook.validation_books=4",
    "train.steps=2",
    "train.batch_size=2",
    "train.eval_every=0",
    "train.checkpoint_every=0",
]


def sweep_file(tmp: Path, **changes) -> Path:
    body = {
        "seeds": [0],
        "stages": ["pretrain", "finetune", "evaluate"],
        "metric": "evaluate:number_accuracy",
        "budgets": [4, 2],
        "reference": {"ssm-birdie": "ssm-clm"},
        "probes": {
            "copy": {
                "finetune": {"recipe": "phonebook_tiny", "task": "phonebook",
                             "set": [*PROBE, "task.phonebook.entries=[1, 1]"]},
                "evaluate": {
                    "copy": {"task": "phonebook", "split": "test", "limit": 3, "chance": 0.01},
                    "copy-digits": {"task": "phonebook", "split": "test", "limit": 3, "metric": "digit_accuracy",
                                    "chance": 0.1},
                },
            },
            "lookup": {
                "finetune": {"recipe": "phonebook_tiny", "task": "phonebook",
                             "set": [*PROBE, "task.phonebook.entries=[2, 2]"]},
                "evaluate": {
                    "lookup2": {"task": "phonebook", "split": "test", "limit": 3, "chance": 0.5},
                    "lookup4": {"task": "phonebook", "split": "test", "limit": 3, "entries": 4, "chance": 0.25},
                },
            },
        },
        "arms": {
            "ssm-clm": {"pretrain": {"recipe": str(tiny_lm_recipe(tmp, "clm", "gated_ssm", "clm"))}},
            "ssm-birdie": {"pretrain": {"recipe": str(tiny_lm_recipe(tmp, "bd", "gated_ssm", "birdie_fixed"))}},
        },
    }  # fmt: skip
    body.update(changes)
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def test_the_hawk_copy_file_runs_its_chosen_probe_on_every_arm_and_five_seeds():
    """experiments/birdie_hawk_copy.yaml: the probe chosen on validation books (docs/benchmarks.md) - 600 steps at a
    constant 1e-3 after 30 warmup steps, a new book per row - from step 400 of each arm, scored on 400 test books."""
    exp = load_experiment(SHIPPED.with_name("birdie_hawk_copy.yaml"))
    assert exp.seeds == (0, 1, 2, 3, 4) and exp.budgets == (400,)
    assert exp.reference == {"hawk-birdie": "hawk-clm", "transformer-birdie": "transformer-clm"}
    plan = build_plan(exp, Path("/tmp/out"))
    ft = plan.of_kind("finetune")
    assert len(plan.of_kind("pretrain")) == len(ft) == 4 * 5
    for j in ft:
        t, pb = j.recipe.train, j.recipe.task.phonebook
        assert (t.steps, t.batch_size, t.learning_rate, t.schedule, t.warmup_steps) == (600, 16, 1e-3, "constant", 30)
        assert pb.train_books == t.steps * t.batch_size and (list(pb.entries), pb.digits) == ([1, 1], 4)
        assert t.init_step == 400 and t.seed == j.seed
    ev = plan.of_kind("evaluate")
    assert len(ev) == 4 * 5 and {(j.split, j.limit) for j in ev} == {("test", 400)}


def test_the_shipped_sweep_file_loads_and_plans_one_pretraining_per_arm_and_seed():
    exp = load_experiment(SHIPPED)
    assert exp.budgets == (200, 400) and list(exp.probes) == ["copy"]
    plan = build_plan(exp, Path("/tmp/out"))
    pre = plan.of_kind("pretrain")
    assert len(pre) == 6 * 3
    assert {(j.recipe.train.steps, tuple(j.recipe.train.keep_steps)) for j in pre} == {(400, (200, 400))}
    # the ETA's pretraining steps: each arm x seed's run once, not once per budget
    assert sum(steps(j) for j in plan.jobs) == 6 * 3 * 400
    ft = plan.of_kind("finetune")
    assert len(ft) == 6 * 3 * 2
    assert sorted({j.recipe.train.init_step for j in ft}) == [200, 400]
    assert all(j.recipe.train.init_from == str(plan.by_key[j.deps[0]].run_dir) for j in ft)
    assert len(plan.of_kind("evaluate")) == 6 * 3 * 2
    # a probe is the same finetuning for every arm: its recipes differ only in where they start
    import dataclasses

    def probe_recipe(j):
        return dataclasses.replace(j.recipe, train=dataclasses.replace(j.recipe.train, init_from=None)).to_yaml()

    at = [j for j in ft if j.seed == 1 and j.recipe.train.init_step == 200 and "/copy-" in j.key]
    assert len(at) == 6 and len({probe_recipe(j) for j in at}) == 1
    lines = dry_run_lines(exp, Path("/tmp/out"))
    first = next(ln for ln in lines if ln.startswith("pretrain gated_ssm_plus-birdie seed 0"))
    assert "serves 2 finetunings, from steps 200, 400" in first
    assert any("copy probe gated_ssm_plus-clm seed 2 from step 200" in ln and "at step 200" in ln for ln in lines)


def test_the_fig1b_sweep_file_runs_the_same_probe_on_five_training_procedures():
    exp, main = load_experiment(SHIPPED.with_name("birdie_budget_1b.yaml")), load_experiment(SHIPPED)
    assert list(exp.arms) == ["clm", "ul2", "birdie_causal", "birdie_fixed", "birdie"]
    assert all(exp.reference_of(a) == "clm" for a in exp.arms if a != "clm")
    assert exp.budgets == main.budgets and exp.probes == main.probes
    plan = build_plan(exp, Path("/tmp/out"))
    recipes = [j.recipe for j in plan.of_kind("pretrain")]
    assert {r.model.arch for r in recipes} == {"gated_ssm"}
    assert [r.objective.mixture for r in recipes] == ["clm", "ul2", "birdie", "birdie_fixed", "birdie"]


def test_the_dry_run_names_an_evaluation_on_books_of_other_sizes(tmp_path):
    lines = dry_run_lines(load_experiment(sweep_file(tmp_path)), tmp_path / "out")
    looked = [ln for ln in lines if ln.startswith("evaluate lookup4 ")]
    assert len(looked) == 4 and all(ln.endswith("(books of 4 entries)") for ln in looked)
    assert not any("books of" in ln for ln in lines if ln.startswith("evaluate lookup2 "))
    copies = [ln for ln in lines if ln.startswith("evaluate copy ")]
    assert len(copies) == 4 and all(ln.endswith("; also scored as copy-digits (digit_accuracy)") for ln in copies)
    assert not any(ln.startswith("evaluate copy-digits") for ln in lines)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"probes": None}, "probes: missing: a budget sweep has both budgets"),
        ({"budgets": [0, 2]}, "budgets: [0, 2]: expected distinct pretraining steps"),
        ({"budgets": [2, 2]}, "budgets: [2, 2]: expected distinct pretraining steps"),
        ({"stages": ["pretrain", "finetune"]}, "a budget sweep's stages are [pretrain, finetune, evaluate]"),
        ({"metric": "finetune:accuracy"}, "metric: 'finetune:accuracy': a budget sweep's metric"),
        ({"grid": {"finetune": {"train.learning_rate": [1, 2]}}}, "grid: a budget sweep has no grid"),
    ],
)
def test_sweep_errors_are_one_line_naming_the_field(tmp_path, change, expected):
    path = sweep_file(tmp_path)
    body = yaml.safe_load(path.read_text())
    for k, v in change.items():
        if v is None:
            body.pop(k)
        else:
            body[k] = v
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    with pytest.raises(ExperimentError) as e:
        load_experiment(path)
    assert expected in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_sweep_errors_in_arms_and_probes(tmp_path):
    path = sweep_file(tmp_path)
    body = yaml.safe_load(path.read_text())

    def fails(mutate, expected):
        b = json.loads(json.dumps(body))
        mutate(b)
        path.write_text(yaml.safe_dump(b, sort_keys=False))
        with pytest.raises(ExperimentError, match=expected):
            load_experiment(path)

    fails(lambda b: b["arms"]["ssm-clm"].update(finetune={"task": "phonebook"}), "arms.ssm-clm: a budget sweep's arms")
    fails(lambda b: b["arms"]["ssm-clm"]["pretrain"].update(set=["train.steps=9"]), r"train.steps: a budget sweep")
    fails(lambda b: b["probes"]["copy"]["finetune"].update(step=2), r"probes.copy.finetune: a probe starts from")
    fails(lambda b: b["probes"]["copy"].pop("evaluate"), r"probes.copy.evaluate: missing")
    fails(lambda b: b["probes"]["copy"]["evaluate"]["copy"].update(chance="low"), r"copy.chance: 'low': expected a")
    fails(lambda b: b["probes"]["lookup"]["evaluate"]["lookup4"].update(entries=[4, 2]), r"lookup4.entries: \[4, 2\]")
    fails(lambda b: b["probes"]["lookup"]["evaluate"].update(copy={"task": "phonebook"}), r"once in the file")
    fails(lambda b: b["probes"]["copy"]["evaluate"]["copy"].update(metric="digit accuracy"), r"copy.metric: 'digit acc")
    fails(
        lambda b: b["probes"]["copy"]["evaluate"]["copy"].update(task="squad_v2", entries=2), r"only phone books have"
    )
    fails(
        lambda b: b["probes"]["copy"]["evaluate"]["copy"].update(split="train"),
        r"copy.split: 'train': phone books are drawn for validation or test",
    )


def test_a_pretraining_only_file_may_set_its_steps(tmp_path):
    """Only a sweep sets train.steps from its budgets: a file of stages [pretrain] (e.g. a sweep's pretraining
    started before its probe is chosen, into the same --out) gives its own."""
    body = yaml.safe_load(sweep_file(tmp_path).read_text())
    arms = {
        a: {"pretrain": {**s["pretrain"], "set": [*s["pretrain"].get("set", []), "train.steps=9"]}}
        for a, s in body["arms"].items()
    }
    path = tmp_path / "pre.yaml"
    raw = {"seeds": [0], "stages": ["pretrain"], "metric": "pretrain:loss", "reference": "ssm-clm", "arms": arms}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    exp = load_experiment(path)
    assert exp.stages == ("pretrain",) and not exp.budgets


def test_an_evaluation_scored_by_another_metric_shares_its_run(tmp_path):
    exp = load_experiment(sweep_file(tmp_path))
    plan = build_plan(exp, tmp_path / "out")
    evals = plan.of_kind("evaluate")
    assert len(evals) == 2 * 2 * 3  # arms x budgets x (copy, lookup2, lookup4): copy-digits adds no run
    for arm in ("ssm-clm", "ssm-birdie"):
        assert plan.sweep[(arm, 0, "copy-digits", 2)] == plan.sweep[(arm, 0, "copy", 2)]
    stages = exp.evaluations()
    assert stages["copy-digits"][1].metric == "digit_accuracy" and stages["copy"][1].metric is None


def test_the_collected_sweep_keeps_each_seeds_empty_and_malformed_replies(tmp_path):
    from types import SimpleNamespace

    from ssmlm.experiment.runner import Outcome, collect_sweep

    exp = load_experiment(sweep_file(tmp_path))
    plan = build_plan(exp, tmp_path / "out")
    metrics = {"number_accuracy": 0.0, "digit_accuracy": 0.1, "empty_replies": 0.25, "malformed_replies": 0.5}
    done = {key: Outcome(True, {"metrics": metrics}) for key in plan.sweep.values()}
    old = plan.sweep[("ssm-clm", 0, "lookup2", 2)]
    done[old] = Outcome(True, {"metrics": {"number_accuracy": 0.5}})  # an evaluation from before the shares
    cells = collect_sweep(exp, plan, SimpleNamespace(done=done))["arms"]
    assert cells["ssm-birdie"]["copy"]["4"] == {
        "values": {"0": 0.0},
        "error": None,
        "empty": {"0": 0.25},
        "malformed": {"0": 0.5},
    }
    assert cells["ssm-birdie"]["copy-digits"]["4"]["malformed"] == {"0": 0.5}  # the same run's replies
    assert "empty" not in cells["ssm-clm"]["lookup2"]["2"] and "malformed" not in cells["ssm-clm"]["lookup2"]["2"]


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
def test_a_tiny_sweep_runs_end_to_end_and_a_second_invocation_reuses_every_run(tmp_path):
    path = sweep_file(tmp_path)
    out = tmp_path / "out"
    r = invoke("experiment", path, "--out", out, code=None)
    assert r.exit_code == 0, r.output
    # 2 pretrainings (not one per budget), 2 arms x 2 budgets x 2 probes finetunings, 3 evaluations per budget
    assert "2 arms × 1 seed × 2 budgets × 2 probes, 22 runs" in r.output
    assert "[22/22] done" in r.output and "ETA" in r.output
    for arm in ("ssm-clm", "ssm-birdie"):
        info = json.loads((out / f"runs/{arm}/seed0/lookup-step2/run.json").read_text())
        assert info["init_step"] == 2 and info["source"] == str(out / f"runs/{arm}/seed0/pretrain")
    looked = json.loads((out / "runs/ssm-clm/seed0/lookup-step4/eval/phonebook-e4-test.json").read_text())
    assert {rec["entries"] for rec in looked["records"]} == {4}
    res = json.loads((out / "results.json").read_text())
    sweep = res["sweep"]
    assert sweep["budgets"] == [2, 4] and list(sweep["evaluations"]) == ["copy", "copy-digits", "lookup2", "lookup4"]
    assert sweep["evaluations"]["copy-digits"]["metric"] == "digit_accuracy"
    for arm in ("ssm-clm", "ssm-birdie"):  # one evaluation run, read by two metrics
        scored = json.loads((out / f"runs/{arm}/seed0/copy-step4/eval/phonebook-test.json").read_text())["metrics"]
        assert sweep["arms"][arm]["copy-digits"]["4"]["values"] == {"0": scored["digit_accuracy"]}
        assert sweep["arms"][arm]["copy"]["4"]["values"] == {"0": scored["number_accuracy"]}
    assert sweep["evaluations"]["lookup4"]["chance"] == 0.25
    assert "books of 4 entries" in sweep["evaluations"]["lookup4"]["about"]
    for arm in ("ssm-clm", "ssm-birdie"):
        for e in ("copy", "copy-digits", "lookup2", "lookup4"):
            for b in ("2", "4"):
                cell = sweep["arms"][arm][e][b]
                assert cell["error"] is None and set(cell["values"]) == {"0"}
    assert res["arms"]["ssm-clm"]["values"]["0"] == sweep["arms"]["ssm-clm"]["copy"]["4"]["values"]["0"]
    # and results.md's first table says it is that cell: the first evaluation, from the largest budget
    assert "copy from the largest budget (step 4)" in (out / "results.md").read_text().splitlines()[0]
    # the run time counts every training run, from the runs' own summaries: a second invocation that reuses them
    # all reports the same
    t = res["run_time"]
    summaries = [json.loads(p.read_text())["seconds_total"] for p in out.glob("runs/*/seed0/*/summary.json")]
    assert len(summaries) == 10 and t["evaluations"] == 12 and t["jobs"] == 1
    assert t["pretrain"] + t["finetune"] == pytest.approx(sum(summaries), abs=0.2) and t["pretrain"] > 0
    assert "Run time: " in (out / "results.md").read_text()
    r2 = invoke("experiment", path, "--out", out, code=None)
    assert r2.exit_code == 0, r2.output
    assert r2.output.count("(reused)") == 22
    assert json.loads((out / "results.json").read_text())["run_time"] == t
    # a probe lost (or killed before it finished) is run again, alone: the pretraining it starts from is reused
    import shutil

    shutil.rmtree(out / "runs/ssm-clm/seed0/copy-step4")
    r3 = invoke("experiment", path, "--out", out, code=None)
    assert r3.exit_code == 0, r3.output
    assert r3.output.count("(reused)") == 20
    ran = [ln for ln in r3.output.splitlines() if " done " in ln and "(reused)" not in ln]
    assert len(ran) == 2 and "copy probe ssm-clm seed 0 from step 4" in ran[0] and "evaluate copy ssm-clm" in ran[1]
    # an evaluation run again by hand with another --limit writes the same file: the experiment scores it again
    # at its own limit rather than reading the other as its own
    looked = out / "runs/ssm-birdie/seed0/lookup-step2"
    invoke("evaluate", "--ckpt", looked, "--task", "phonebook", "--split", "test", "--limit", "1")
    assert json.loads((looked / "eval/phonebook-test.json").read_text())["metrics"]["books"] == 1
    r4 = invoke("experiment", path, "--out", out, code=None)
    assert r4.exit_code == 0, r4.output
    ran = [ln for ln in r4.output.splitlines() if " done " in ln and "(reused)" not in ln]
    assert len(ran) == 1 and "evaluate lookup2 ssm-birdie seed 0 step 2" in ran[0], r4.output
    again = json.loads((looked / "eval/phonebook-test.json").read_text())
    assert again["limit"] == 3 and again["metrics"]["books"] == 3


def test_an_evaluation_of_other_settings_is_not_reused(tmp_path):
    from ssmlm.experiment.execute import _stale
    from ssmlm.experiment.plan import Job

    job = Job("a/seed0/copy-step4/evaluate-copy", "evaluate", "evaluate copy", tmp_path, task="phonebook", limit=3)
    (tmp_path / "summary.json").write_text(json.dumps({"final_step": 8}))
    assert not _stale({"step": 8, "limit": 3}, job)
    assert _stale({"step": 8, "limit": 1}, job)  # run by hand with --limit 1
    assert _stale({"step": 8, "limit": None}, job)  # every book, not the file's 3
    assert _stale({"step": 4, "limit": 3}, job)  # the run was trained on after it
    assert not _stale({"step": 8}, job)  # written before evaluations recorded their limit
