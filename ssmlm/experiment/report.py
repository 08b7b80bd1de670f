"""An experiment's results: per arm n, mean and a 95% interval over seeds, and the paired difference to the
reference arm (none in a file of one arm); written as OUT/results.md, results.csv, results.json and results.png
(means with error bars). An interval that is not estimable (ssmlm.experiment.stats.judged) is shown as such, with
its reason, and drawn without a bar; results.md also lists the warnings the runs recorded. A budget sweep's tables
and plots per budget are sweep_report.py's."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ssmlm.experiment.spec import Experiment
from ssmlm.experiment.stats import (
    BOOTSTRAP_FROM,
    BOOTSTRAP_RESAMPLES,
    LEVEL,
    MIN_N,
    cut,
    mean_interval,
    paired_difference,
)
from ssmlm.experiment.sweep_report import n_seeds
from ssmlm.markdown import markdown_table

COLUMNS = (
    "arm",
    "status",
    "n",
    "mean",
    "ci_low",
    "ci_high",
    "ci_method",
    "ci_estimable",
    "ci_reason",
    "diff_n",
    "diff_mean",
    "diff_low",
    "diff_high",
    "diff_method",
    "diff_estimable",
    "diff_reason",
    "selected",
    "error",
)


def summarize(exp: Experiment, arms: dict[str, dict], seconds: float, warnings: list[dict] | None = None) -> dict:
    """Add every arm's interval and its paired difference to its reference (by seed) to the collected values;
    ``warnings``: the runs' (ssmlm.experiment.runner.Runner.warnings)."""
    for name, a in arms.items():
        vals = list(a["values"].values())
        a["interval"] = mean_interval(vals).to_dict() if a["status"] == "ok" and vals else None
        a["reference"] = ref_name = exp.reference_of(name)
        ref = arms.get(ref_name) if ref_name else None
        diff = None
        if ref is not None and a["interval"] and ref["status"] == "ok":
            d = paired_difference(a["values"], ref["values"])
            diff = d.to_dict() if d else None
        a["difference"] = diff
    return {
        "experiment": str(exp.path),
        "name": exp.name,
        "description": exp.description,
        "metric": str(exp.metric),
        "goal": exp.metric.goal,
        "bounds": list(exp.metric.bounds) if exp.metric.bounds else None,
        "reference": exp.reference,
        "seeds": list(exp.seeds),
        "stages": list(exp.stages),
        "grid": exp.grid,
        "level": LEVEL,
        "interval": f"Student t for n < {BOOTSTRAP_FROM} seeds, percentile bootstrap ({BOOTSTRAP_RESAMPLES:,} "
        f"resamples) from {BOOTSTRAP_FROM}; differences: paired by seed, Student t; not estimable "
        f"from fewer than {MIN_N} values or values with zero spread",
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        "arms": arms,
        "warnings": list(warnings or []),
    }


def fmt(v) -> str:
    return "–" if v is None else f"{v:.4g}"


def _ci(iv: dict | None) -> str:
    if not iv:
        return "–"
    if not iv.get("estimable", True):
        return f"not estimable ({iv['reason']})"
    return f"[{fmt(iv['low'])}, {fmt(iv['high'])}]{'*' if iv.get('cut') else ''} {iv['method']}"


def markdown(res: dict, warnings: bool = True) -> str:
    """The results table (and, with a grid, the validation means per point); ``warnings``: the runs' warnings
    below it (the command prints those as the runs finish instead)."""
    ref = res["reference"]
    one_ref = isinstance(ref, str)
    compare = any(a.get("reference") for a in res["arms"].values())  # a file of one arm compares nothing
    grid = any("selected" in a for a in res["arms"].values())
    delta_head = f"Δ vs {ref} (paired)" if one_ref else "Δ vs its reference (paired)"
    head = ["arm", "n", "mean", "95% CI"] + ([delta_head, "Δ 95% CI"] if compare else []) + (["selected"] * grid)
    rows = []
    notes, bounds, was_cut, unsure = [], res.get("bounds"), False, False
    for name, a in res["arms"].items():
        iv, d = cut(a["interval"], bounds), cut(a["difference"], bounds, difference=True)
        shown = [x for x in (iv, d) if x and x.get("estimable", True)]
        was_cut |= any(x.get("cut", False) for x in shown)
        if a["status"] != "ok":
            row = [name, "–", "failed", "–"] + ["–", "–"] * compare
            notes.append(f"- {name} failed: {a['error']}")
        else:
            unsure |= any(x and not x.get("estimable", True) for x in (iv, d))
            delta = f"{d['mean']:+.4g}" if d else "–"
            if one_ref and name == ref:
                delta = "reference"
            elif d and not one_ref:
                delta += f" vs {a['reference']}"
            row = [name, str(iv["n"]), fmt(iv["mean"]), _ci(iv)] + [delta, _ci(d) if d else "–"] * compare
        rows.append(row + ([a.get("selected", "")] if grid else []))
    lines = markdown_table(head, rows, align="lrrl" + "rl" * compare)
    what = f"{res['metric']} ({'higher' if res['goal'] == 'max' else 'lower'} is better)"
    if sweep := res.get("sweep"):  # this table is one cell of the sweep's: say which
        what += f", {next(iter(sweep['evaluations']))} from the largest budget (step {max(sweep['budgets']):,})"
    text = [f"{res['name']}: {what}, {n_seeds(len(res['seeds']))} {res['seeds']}", "", *lines]
    text += ["", f"95% CI: {res['interval']}."]
    if unsure:
        pairs = "; pairs of seeds for Δ" if compare else ""
        text += [
            f"Not estimable: an interval from fewer than {MIN_N} values (seeds{pairs}), or "
            "from values that are all equal (zero spread), says nothing of how the next seed would differ; "
            "the mean stands, and results.json and .csv keep the interval with estimable: false."
        ]
    if was_cut:
        lo, hi = bounds
        text += [
            f"*: cut at the metric's bounds [{lo:g}, {hi:g}] (a difference's at ±{hi - lo:g}); "
            "results.json and .csv keep every interval as computed."
        ]
    if grid:
        text += [
            "Grid: the point with the best mean final validation metric was selected per arm; the numbers "
            "above are the separate test split's."
        ]
    if res.get("run_time"):
        text += ["", run_time_line(res["run_time"])]
    if warnings and res.get("warnings"):
        notes = [*notes, *([""] if notes else []), *warning_lines(res["warnings"])]
    return "\n".join(text + ([""] + notes if notes else [])) + "\n"


def run_time_line(t: dict) -> str:
    """What the file's training runs took, all invocations together (runner.training_seconds)."""
    from ssmlm.progress import clock_time

    total = t["pretrain"] + t["finetune"]
    per = f", ~{clock_time(total / t['jobs'])} at --jobs {t['jobs']}" if t["jobs"] > 1 else ""
    return (
        f"Run time: {clock_time(total)} summed over the training runs{per} (pretraining {clock_time(t['pretrain'])}, "
        f"finetuning {clock_time(t['finetune'])}; every launch, from each run's summary.json), plus "
        f"{t['evaluations']} evaluation{'s' if t['evaluations'] != 1 else ''}."
    )


def warning_lines(warnings: list[dict]) -> list[str]:
    """The runs' warnings, each text once, with the runs that gave it."""
    runs: dict[str, list[str]] = {}
    for w in warnings:
        runs.setdefault(w["warning"], []).append(w["run"])
    return [
        "Warnings the runs gave (each run's summary.json keeps its own):",
        "",
        *(f"- {', '.join(names)}: {text}" for text, names in runs.items()),
    ]


def grid_markdown(res: dict) -> str:
    rows = []
    for name, a in res["arms"].items():
        for r in a.get("grid") or []:
            mean = fmt(r["mean"]) if r["mean"] is not None else f"failed: {r['error']}"
            rows.append([name, r["point"], mean, "yes" if r["selected"] else ""])
    return "\n".join(markdown_table(["arm", "point", "validation mean", "selected"], rows, align="llrl")) + "\n"


def write(res: dict, out: Path) -> dict[str, Path]:
    """results.md, .csv, .json and .png (and .svg) under ``out``; a budget sweep's (res["sweep"], summarized
    here unless it was) tables go at the end of results.md, with sweep.csv and sweep-EVAL.png (sweep_report)."""
    from ssmlm.analyze.plots import write_csv
    from ssmlm.experiment import sweep_report

    md = markdown(res)
    if any(a.get("grid") for a in res["arms"].values()):
        md += "\nValidation means per grid point:\n\n" + grid_markdown(res)
    if res.get("sweep"):
        res = {**res, "sweep": sweep_report.summarized(res["sweep"])}
        md += "\n" + sweep_report.sweep_markdown(res["sweep"])
    paths = {"md": out / "results.md", "csv": out / "results.csv", "json": out / "results.json"}
    paths["md"].write_text(md)
    paths["json"].write_text(json.dumps(res, indent=2, default=str))
    write_csv(paths["csv"], COLUMNS, [csv_row(name, a) for name, a in res["arms"].items()])
    paths["png"] = plot(res, out / "results.png")
    if res.get("sweep"):
        paths.update(sweep_report.write_sweep(res["sweep"], out))
    return paths


def csv_row(name: str, a: dict) -> dict:
    iv, d = a["interval"] or {}, a["difference"] or {}
    return {
        "arm": name,
        "status": a["status"],
        "n": iv.get("n"),
        "mean": iv.get("mean"),
        "ci_low": iv.get("low"),
        "ci_high": iv.get("high"),
        "ci_method": iv.get("method"),
        "ci_estimable": iv.get("estimable"),
        "ci_reason": iv.get("reason"),
        "diff_n": d.get("n"),
        "diff_mean": d.get("mean"),
        "diff_low": d.get("low"),
        "diff_high": d.get("high"),
        "diff_method": d.get("method"),
        "diff_estimable": d.get("estimable"),
        "diff_reason": d.get("reason"),
        "selected": a.get("selected"),
        "error": a["error"],
    }


def plot(res: dict, path: Path) -> Path:
    """A forest plot, one row per arm (an experiment can have dozens, so names go on the y axis): each arm's mean
    with its 95% interval, the seeds' values as dots, a single reference's mean as a dashed line; a failed arm is
    labelled so, and a mean whose interval is not estimable is drawn hollow, without a bar, with the reason."""
    from ssmlm.analyze.plots import pyplot, save_figure

    plt = pyplot()
    names, was_cut = list(res["arms"]), False
    width = max(3.0, 0.075 * max(map(len, names)))  # room for the longest arm name, in inches
    fig, ax = plt.subplots(figsize=(width + 6.5, 0.32 * len(names) + 1.3))
    seen: set[str] = set()

    def once(label: str) -> str | None:  # each legend entry once
        if label in seen:
            return None
        seen.add(label)
        return label

    for y, name in enumerate(names):
        a = res["arms"][name]
        iv = a["interval"]
        if a["status"] != "ok" or not iv:
            ax.annotate("failed", (0.5, y), xycoords=("axes fraction", "data"), va="center", color="tab:red")
            continue
        vals = list(a["values"].values())
        ax.scatter(vals, [y + 0.18] * len(vals), s=12, color="0.5", zorder=2, label=once("seeds"))
        iv = cut(iv, res.get("bounds"))
        if not iv.get("estimable", True):
            ax.scatter(
                [iv["mean"]],
                [y],
                s=30,
                facecolors="none",
                edgecolors="tab:blue",
                zorder=3,
                label=once("mean, no CI (not estimable)"),
            )
            ax.annotate(
                f"no CI: {iv['reason']}",
                (iv["mean"], y),
                xytext=(7, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
                color="tab:blue",
            )
            continue
        was_cut |= bool(iv.get("cut"))
        err = [[iv["mean"] - iv["low"]], [iv["high"] - iv["mean"]]]
        ax.errorbar(
            [iv["mean"]], [y], xerr=err, fmt="o", capsize=4, color="tab:blue", zorder=3, label=once("mean, 95% CI")
        )
    ref = res["arms"][res["reference"]] if isinstance(res["reference"], str) else {"interval": None}
    if ref["interval"]:
        ax.axvline(ref["interval"]["mean"], ls="--", color="0.6", lw=1, label=f"{res['reference']} (reference)")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)  # the file's order, top to bottom
    ax.grid(axis="x", color="0.9", lw=0.6)
    if res.get("bounds"):  # the axis ends where the metric does, or just inside the data
        lo, hi = res["bounds"]
        left, right = ax.get_xlim()
        pad = 0.02 * (hi - lo)
        ax.set_xlim(max(left, lo - pad), min(right, hi + pad))
    note = " (intervals cut at its bounds [{:g}, {:g}])".format(*res["bounds"]) if was_cut else ""
    ax.set_xlabel(res["metric"] + note)
    ax.set_title(f"{res['name']}: mean and 95% CI over {n_seeds(len(res['seeds']))}", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # beside, off the data
    fig.tight_layout()
    return save_figure(fig, path)
