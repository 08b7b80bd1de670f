"""A budget sweep's report (ssmlm.experiment.sweep_report) on synthetic results: the first budget above chance,
paired differences against a hand computation, the markdown tables, sweep.csv, the plots, and report.write."""

import copy
import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from ssmlm.experiment.sweep_report import summarize_sweep, sweep_markdown, sweep_plots, write_sweep

BUDGETS = [200, 400, 800, 1600]
ARMS = [f"{f}-{o}" for f in ("gated_ssm_plus", "hawk", "transformer") for o in ("clm", "birdie")]
EVALUATIONS = {
    "copy": {"probe": "copy", "chance": 0.0001, "about": "1-entry books"},
    "lookup2": {"probe": "lookup", "chance": 0.5, "about": "2-entry books, 1 name asked"},
    "lookup4": {"probe": "lookup", "chance": 0.25, "about": "4-entry books, 1 name asked"},
}
NOISE = (-0.03, 0.0, 0.04)  # seed s of the i-th arm adds NOISE[(s + i) % 3]: spread, and in the differences too


def values(mean: float, i: int = 0, seeds=(0, 1, 2)) -> dict[str, float]:
    return {str(s): min(1.0, max(0.0, mean + NOISE[(s + i) % 3])) for s in seeds}


def make_sweep() -> dict:
    """Every arm's accuracy rising with budget, Birdie above CLM, and these cells set by hand:
    gated_ssm_plus-birdie copy rises above chance at 800 (near 0 before); transformer-clm lookup2 stays at
    chance; hawk-birdie copy has two seeds at 400 (high, but not estimable) and rises at 800."""
    arms = {}
    for i, arm in enumerate(ARMS):
        birdie = arm.endswith("birdie")
        arms[arm] = {}
        for ev, e in EVALUATIONS.items():
            arms[arm][ev] = {}
            for k, b in enumerate(BUDGETS):
                mean = min(0.9, e["chance"] + 0.1 * (k + 1) + 0.15 * birdie + 0.02 * i)
                arms[arm][ev][str(b)] = {"values": values(mean, i), "error": None}
    cells = arms["gated_ssm_plus-birdie"]["copy"]
    cells["200"]["values"] = {"0": 0.0, "1": 0.01, "2": 0.0}
    cells["400"]["values"] = {"0": 0.0, "1": 0.02, "2": 0.01}
    cells["800"]["values"] = {"0": 0.3, "1": 0.35, "2": 0.4}
    for b in BUDGETS:
        arms["transformer-clm"]["lookup2"][str(b)]["values"] = {"0": 0.45, "1": 0.5, "2": 0.55}
    cells = arms["hawk-birdie"]["copy"]
    cells["200"]["values"] = {"0": 0.0, "1": 0.01, "2": 0.0}
    cells["400"]["values"] = {"0": 0.5, "1": 0.6}  # seed 2 failed: two seeds
    cells["400"]["error"] = "seed 2: evaluation failed"
    # the reference's seeds as ints (a dict built in Python), the arm's as strings (read back from JSON)
    arms["hawk-clm"]["lookup4"]["800"]["values"] = {0: 0.3, 1: 0.32, 2: 0.41}
    arms["hawk-birdie"]["lookup4"]["800"]["values"] = {"0": 0.5, "1": 0.49, "2": 0.62}
    arms["transformer-birdie"]["lookup4"]["1600"] = {"values": {}, "error": "out of memory"}
    return {
        "budgets": BUDGETS,
        "metric": "number_accuracy",
        "seeds": [0, 1, 2],
        "evaluations": EVALUATIONS,
        "arms": arms,
        "reference": {f"{f}-birdie": f"{f}-clm" for f in ("gated_ssm_plus", "hawk", "transformer")},
    }


@pytest.fixture(scope="module")
def summary():
    return summarize_sweep(make_sweep())


def test_the_first_budget_above_chance_counts_only_estimable_intervals(summary):
    fb = summary["from_budget"]
    assert fb["gated_ssm_plus-birdie"]["copy"] == 800
    assert summary["above_chance_at"]["gated_ssm_plus-birdie"]["copy"] == [False, False, True, True]
    assert fb["transformer-clm"]["lookup2"] is None  # at chance at every budget
    # two seeds at 400, far above chance, but not estimable: from 800
    iv = summary["arms"]["hawk-birdie"]["copy"]["400"]["interval"]
    assert iv["n"] == 2 and iv["estimable"] is False and iv["mean"] == pytest.approx(0.55)
    assert fb["hawk-birdie"]["copy"] == 800
    # a cell without values: no interval, no difference, and not above chance
    cell = summary["arms"]["transformer-birdie"]["lookup4"]["1600"]
    assert cell["interval"] is None and cell["difference"] is None and cell["error"] == "out of memory"
    assert summary["above_chance_at"]["transformer-birdie"]["lookup4"][-1] is False
    json.dumps(summary)  # JSON-serialisable as it is


def test_a_paired_difference_equals_the_hand_computation(summary):
    a = np.array([0.5, 0.49, 0.62])
    r = np.array([0.3, 0.32, 0.41])
    d = a - r
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    got = summary["arms"]["hawk-birdie"]["lookup4"]["800"]["difference"]
    assert got["n"] == 3 and got["method"] == "t" and got["estimable"]
    assert got["mean"] == pytest.approx(d.mean())
    assert (got["low"], got["high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert summary["arms"]["hawk-birdie"]["lookup4"]["800"]["reference"] == "hawk-clm"
    # the reference arms compare with nothing
    assert summary["arms"]["hawk-clm"]["lookup4"]["800"]["difference"] is None


def test_summarizing_twice_gives_the_same_and_leaves_the_input_alone():
    sweep = make_sweep()
    before = copy.deepcopy(sweep)
    once = summarize_sweep(sweep)
    assert sweep == before
    assert summarize_sweep(once) == once
    # an arm without values for an evaluation: "–", not "not by 1600"
    sweep["arms"]["hawk-birdie"]["copy"] = {}
    row = next(ln for ln in sweep_markdown(sweep).splitlines() if ln.startswith("| hawk-birdie |"))
    assert row == "| hawk-birdie | – | – | – | – | – |"


def test_one_reference_for_every_arm():
    sweep = {**make_sweep(), "reference": "transformer-clm"}
    s = summarize_sweep(sweep)
    assert s["arms"]["hawk-birdie"]["copy"]["800"]["reference"] == "transformer-clm"
    assert s["arms"]["transformer-clm"]["copy"]["800"]["difference"] is None
    s = summarize_sweep({**make_sweep(), "reference": None})
    assert all(c["difference"] is None for evs in s["arms"].values() for cs in evs.values() for c in cs.values())
    assert "Paired differences" not in sweep_markdown(s)


def test_markdown_tables_readings_and_chance(summary):
    md = sweep_markdown(summary)
    for ev in EVALUATIONS:
        assert f"### {ev} (" in md and f"Paired differences on {ev}" in md
    assert "| arm | step 200 | step 400 | step 800 | step 1600 | above chance from step |" in md
    # near 0 the t interval reaches below 0: cut to [0, 1] and marked
    row = "| gated_ssm_plus-birdie | 0.00 [0.00, 0.02]* | 0.01 [0.00, 0.03]* | 0.35 [0.23, 0.47] | 0.57 [0.49, 0.66] |"
    row += " 800 |"
    assert row in md and "*: cut to [0, 1]" in md
    assert "| transformer-clm | 0.50 [0.38, 0.62] |" in md and "| not by 1600 |" in md
    assert "0.55 (n.e.: n=2 < 3)" in md  # hawk-birdie, copy, 400
    assert "| failed |" in md and "- transformer-birdie, lookup4, step 1600: out of memory" in md
    # the differences: +mean [low, high] and a reading per cell
    d = summary["arms"]["hawk-birdie"]["lookup4"]["800"]["difference"]
    assert f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]" in md
    assert "| hawk-birdie − hawk-clm |" in md
    # a reading of every cell, budgets in a row with the same verdict together
    assert (
        "- hawk-birdie vs hawk-clm: lower at step 200 (whole interval below 0); cannot tell at step 400 (not "
        "estimable: n=2 < 3); higher at steps 800, 1600 (whole interval above 0)\n" in md
    )
    assert "higher at steps 200, 400 (whole interval above 0); no clear difference at steps 800, 1600 (" in md
    assert "copy 0.0001 (1-entry books); lookup2 0.5" in md and "Student t for n < 5 seeds" in md


def test_plots_and_csv(summary, tmp_path):
    pngs = sweep_plots(summary, tmp_path)
    assert [p.name for p in pngs] == [f"sweep-{ev}.png" for ev in EVALUATIONS]
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    paths = write_sweep(summary, tmp_path)
    rows = list(csv.DictReader(paths["sweep_csv"].open()))
    assert len(rows) == len(ARMS) * len(EVALUATIONS) * len(BUDGETS)
    row = next(r for r in rows if (r["arm"], r["evaluation"], r["budget"]) == ("hawk-birdie", "lookup4", "800"))
    d = summary["arms"]["hawk-birdie"]["lookup4"]["800"]["difference"]
    assert float(row["diff_mean"]) == pytest.approx(d["mean"]) and row["n"] == "3" and row["estimable"] == "True"
    assert paths["sweep_lookup2"] == tmp_path / "sweep-lookup2.png"


@pytest.mark.parametrize("summarized", [False, True])
def test_report_write_adds_the_sweep(tmp_path, summarized):
    """report.write on results made by report.summarize, with the sweep as the runner gives it (or already
    summarized): results.md ends with the sweep's tables, results.json holds its summary, and sweep.csv and
    the plots are written."""
    from ssmlm.experiment.report import summarize, write
    from ssmlm.experiment.spec import Experiment, Metric

    metric = Metric("evaluate", "number_accuracy", "max", (0.0, 1.0))
    exp = Experiment(Path("sweep.yaml"), (0, 1, 2), ("pretrain",), metric, "hawk-clm", {"hawk-clm": {}}, {})
    arms = {"hawk-clm": {"status": "ok", "error": None, "values": {0: 0.5, 1: 0.6, 2: 0.55}, "runs": {}}}
    res = summarize(exp, arms, 1.0)
    res["sweep"] = summarize_sweep(make_sweep()) if summarized else make_sweep()
    paths = write(res, tmp_path)
    md = paths["md"].read_text()
    assert md.index("| hawk-clm | 3 |") < md.index("Budget sweep: number_accuracy") < md.index("### lookup4")
    saved = json.loads(paths["json"].read_text())["sweep"]
    assert saved["from_budget"]["gated_ssm_plus-birdie"]["copy"] == 800
    assert "interval" in saved["arms"]["hawk-clm"]["copy"]["200"]
    assert len(list(csv.DictReader(paths["sweep_csv"].open()))) == 72
    for ev in EVALUATIONS:
        assert paths[f"sweep_{ev}"].is_file() and paths[f"sweep_{ev}"].stat().st_size > 0
    assert "interval" not in res["sweep"]["arms"]["hawk-clm"]["copy"]["200"] or summarized  # the caller's res


def test_one_seed_and_budgets_out_of_order(tmp_path):
    """One seed: every mean stands, no interval is estimable, nothing is above chance; the budgets are sorted."""
    sweep = make_sweep()
    sweep["seeds"], sweep["budgets"] = [0], [1600, 200, 800, 400]
    for evs in sweep["arms"].values():
        for cells in evs.values():
            for cell in cells.values():
                cell["values"] = {k: v for k, v in cell["values"].items() if str(k) == "0"}
    s = summarize_sweep(sweep)
    assert s["budgets"] == BUDGETS
    assert all(fb is None for evs in s["from_budget"].values() for fb in evs.values())
    md = sweep_markdown(s)
    assert "(n.e.: n=1 < 3)" in md and "cannot tell at steps 200, 400, 800, 1600 (not estimable: n=1 < 3)" in md
    assert all(p.stat().st_size > 0 for p in sweep_plots(s, tmp_path))


def test_an_evaluation_with_its_own_metric_says_so(tmp_path):
    s = make_sweep()
    s["evaluations"]["copy"] = {**s["evaluations"]["copy"], "metric": "digit_accuracy", "chance": 0.1}
    md = sweep_markdown(s)
    assert "### copy (digit_accuracy, 1-entry books, probe copy)" in md
    assert "### lookup2 (number_accuracy, 2-entry books" in md
    paths = write_sweep(s, tmp_path)
    rows = list(csv.DictReader(paths["sweep_csv"].open()))
    assert {r["metric"] for r in rows if r["evaluation"] == "copy"} == {"digit_accuracy"}
    assert {r["metric"] for r in rows if r["evaluation"] != "copy"} == {"number_accuracy"}


def test_empty_and_malformed_replies_per_cell(tmp_path):
    """Cells whose evaluations recorded the shares of empty and malformed replies: their means over seeds in a
    table under the evaluation's accuracies and in sweep.csv; an evaluation without them gets no such table."""
    s = make_sweep()
    cells = s["arms"]["hawk-clm"]["copy"]
    for b in BUDGETS:
        cells[str(b)]["empty"] = {"0": 0.0, "1": 0.1, "2": 0.2}
        cells[str(b)]["malformed"] = {"0": 0.9, "1": 0.8, "2": 0.7}
    cells["1600"]["malformed"] = {}  # not recorded there
    summary = summarize_sweep(s)
    assert summary["arms"]["hawk-clm"]["copy"]["200"]["empty"] == {"0": 0.0, "1": 0.1, "2": 0.2}  # kept
    md = sweep_markdown(summary)
    assert md.count("Replies on ") == 1 and "Replies on copy, share empty / malformed (mean over seeds" in md
    part = md[md.index("Replies on copy") : md.index("Paired differences on copy")]
    assert "| hawk-clm | 0.10 / 0.80 | 0.10 / 0.80 | 0.10 / 0.80 | 0.10 / – |" in part
    assert "| hawk-birdie | – | – | – | – |" in part
    assert md.index("### copy") < md.index("Replies on copy") < md.index("### lookup2")  # under copy's table
    rows = list(csv.DictReader(write_sweep(summary, tmp_path)["sweep_csv"].open()))
    got = {(r["arm"], r["evaluation"], r["budget"]): (r["empty"], r["malformed"]) for r in rows}
    assert [float(x) for x in got[("hawk-clm", "copy", "200")]] == pytest.approx([0.1, 0.8])
    assert got[("hawk-clm", "copy", "1600")][1] == "" and got[("hawk-birdie", "copy", "200")] == ("", "")


def test_each_objective_has_its_own_marker_so_a_one_budget_plot_tells_the_pair_apart():
    """With one budget there is no line to see: the marker alone says CLM (square) or Birdie (circle)."""
    from ssmlm.experiment.sweep_report import styles

    s = styles(["hawk-clm", "hawk-birdie", "transformer-clm", "transformer-birdie", "hawk-ul2", "hawk-causal"])
    assert s["hawk-clm"]["color"] == s["hawk-birdie"]["color"] != s["transformer-clm"]["color"]
    assert (
        (s["hawk-clm"]["marker"], s["hawk-birdie"]["marker"])
        == ("s", "o")
        == (
            s["transformer-clm"]["marker"],
            s["transformer-birdie"]["marker"],
        )
    )
    assert len({s[a]["marker"] for a in ("hawk-clm", "hawk-birdie", "hawk-ul2", "hawk-causal")}) == 4
