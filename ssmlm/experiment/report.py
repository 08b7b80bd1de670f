"""An experiment's results: per arm n, mean and a 95% interval over seeds, and the paired difference to the
reference arm; written as OUT/results.md, results.csv, results.json and results.png (means with error bars)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ssmlm.experiment.spec import Experiment
from ssmlm.experiment.stats import BOOTSTRAP_FROM, BOOTSTRAP_RESAMPLES, LEVEL, mean_interval, paired_difference

COLUMNS = ("arm", "status", "n", "mean", "ci_low", "ci_high", "ci_method", "diff_n", "diff_mean", "diff_low",
           "diff_high", "diff_method", "selected", "error")  # fmt: skip


def summarize(exp: Experiment, arms: dict[str, dict], seconds: float) -> dict:
    """Add every arm's interval and its paired difference to its reference (by seed) to the collected values."""
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
        "experiment": str(exp.path), "name": exp.name, "description": exp.description,
        "metric": str(exp.metric), "goal": exp.metric.goal,
        "bounds": list(exp.metric.bounds) if exp.metric.bounds else None,
        "reference": exp.reference, "seeds": list(exp.seeds),
        "stages": list(exp.stages), "grid": exp.grid, "level": LEVEL,
        "interval": f"Student t for n < {BOOTSTRAP_FROM} seeds, percentile bootstrap ({BOOTSTRAP_RESAMPLES:,} "
                    f"resamples) from {BOOTSTRAP_FROM}; differences: paired by seed, Student t",
        "seconds": round(seconds, 1), "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "arms": arms,
    }  # fmt: skip


def fmt(v) -> str:
    return "–" if v is None else f"{v:.4g}"


def cut(iv: dict | None, bounds: list | None, difference: bool = False) -> dict | None:
    """The interval cut at the metric's bounds (a difference's at ±their span): a t-interval from few seeds can
    reach past what the metric can be, e.g. an accuracy of 1.3. ``cut`` is set when it was."""
    if not iv or iv["low"] is None or not bounds:
        return iv
    lo, hi = bounds if not difference else (bounds[0] - bounds[1], bounds[1] - bounds[0])
    low, high = max(iv["low"], lo), min(iv["high"], hi)
    return {**iv, "low": low, "high": high, "cut": (low, high) != (iv["low"], iv["high"])}


def _ci(iv: dict | None) -> str:
    if not iv:
        return "–"
    if iv["low"] is None:
        return "– (n = 1)"
    return f"[{fmt(iv['low'])}, {fmt(iv['high'])}]{'*' if iv.get('cut') else ''} {iv['method']}"


def markdown(res: dict) -> str:
    """The results table (and, with a grid, the validation means per point)."""
    ref = res["reference"]
    one_ref = isinstance(ref, str)
    grid = any("selected" in a for a in res["arms"].values())
    delta_head = f"Δ vs {ref} (paired)" if one_ref else "Δ vs its reference (paired)"
    head = ["arm", "n", "mean", "95% CI", delta_head, "Δ 95% CI"] + (["selected"] if grid else [])
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|---|---:|---|" + ("---|" if grid else "")]
    notes, bounds, was_cut = [], res.get("bounds"), False
    for name, a in res["arms"].items():
        iv, d = cut(a["interval"], bounds), cut(a["difference"], bounds, difference=True)
        was_cut |= any((x or {}).get("cut", False) for x in (iv, d))
        if a["status"] != "ok":
            row = [name, "–", "failed", "–", "–", "–"]
            notes.append(f"- {name} failed: {a['error']}")
        else:
            delta = f"{d['mean']:+.4g}" if d else "–"
            if one_ref and name == ref:
                delta = "reference"
            elif d and not one_ref:
                delta += f" vs {a['reference']}"
            row = [name, str(iv["n"]), fmt(iv["mean"]), _ci(iv), delta, _ci(d) if d else "–"]
        lines.append("| " + " | ".join(row + ([a.get("selected", "")] if grid else [])) + " |")
    text = [f"{res['name']}: {res['metric']} ({'higher' if res['goal'] == 'max' else 'lower'} is better), "
            f"{seeds(len(res['seeds']))} {res['seeds']}", "", *lines]  # fmt: skip
    text += ["", f"95% CI: {res['interval']}."]
    if was_cut:
        lo, hi = bounds
        text += [f"*: cut at the metric's bounds [{lo:g}, {hi:g}] (a difference's at ±{hi - lo:g}); "
                 "results.json and .csv keep every interval as computed."]  # fmt: skip
    if grid:
        text += ["Grid: the point with the best mean final validation metric was selected per arm; the numbers "
                 "above are the separate test split's."]  # fmt: skip
    return "\n".join(text + ([""] + notes if notes else [])) + "\n"


def grid_markdown(res: dict) -> str:
    rows = ["| arm | point | validation mean | selected |", "|---|---|---:|---|"]
    for name, a in res["arms"].items():
        for r in a.get("grid") or []:
            mean = fmt(r["mean"]) if r["mean"] is not None else f"failed: {r['error']}"
            rows.append(f"| {name} | {r['point']} | {mean} | {'yes' if r['selected'] else ''} |")
    return "\n".join(rows) + "\n"


def write(res: dict, out: Path) -> dict[str, Path]:
    """results.md, .csv, .json and .png (and .svg) under ``out``."""
    from ssmlm.analyze.plots import write_csv

    md = markdown(res)
    if any(a.get("grid") for a in res["arms"].values()):
        md += "\nValidation means per grid point:\n\n" + grid_markdown(res)
    paths = {"md": out / "results.md", "csv": out / "results.csv", "json": out / "results.json"}
    paths["md"].write_text(md)
    paths["json"].write_text(json.dumps(res, indent=2, default=str))
    write_csv(paths["csv"], COLUMNS, [csv_row(name, a) for name, a in res["arms"].items()])
    paths["png"] = plot(res, out / "results.png")
    return paths


def seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def csv_row(name: str, a: dict) -> dict:
    iv, d = a["interval"] or {}, a["difference"] or {}
    return {"arm": name, "status": a["status"], "n": iv.get("n"), "mean": iv.get("mean"), "ci_low": iv.get("low"),
            "ci_high": iv.get("high"), "ci_method": iv.get("method"), "diff_n": d.get("n"),
            "diff_mean": d.get("mean"), "diff_low": d.get("low"), "diff_high": d.get("high"),
            "diff_method": d.get("method"), "selected": a.get("selected"), "error": a["error"]}  # fmt: skip


def plot(res: dict, path: Path) -> Path:
    """A forest plot, one row per arm (an experiment can have dozens, so names go on the y axis): each arm's mean
    with its 95% interval, the seeds' values as dots, a single reference's mean as a dashed line; a failed arm is
    labelled so."""
    from ssmlm.analyze.plots import _plt, save_figure

    plt = _plt()
    names, was_cut = list(res["arms"]), False
    width = max(3.0, 0.075 * max(map(len, names)))  # room for the longest arm name, in inches
    fig, ax = plt.subplots(figsize=(width + 6.5, 0.32 * len(names) + 1.3))
    for y, name in enumerate(names):
        a = res["arms"][name]
        iv = a["interval"]
        if a["status"] != "ok" or not iv:
            ax.annotate("failed", (0.5, y), xycoords=("axes fraction", "data"), va="center", color="tab:red")
            continue
        vals = list(a["values"].values())
        ax.scatter(vals, [y + 0.18] * len(vals), s=12, color="0.5", zorder=2, label="seeds" if y == 0 else None)
        err, iv = None, cut(iv, res.get("bounds"))
        was_cut |= bool(iv.get("cut"))
        if iv["low"] is not None:
            err = [[iv["mean"] - iv["low"]], [iv["high"] - iv["mean"]]]
        ax.errorbar([iv["mean"]], [y], xerr=err, fmt="o", capsize=4, color="tab:blue", zorder=3,
                    label="mean, 95% CI" if y == 0 else None)  # fmt: skip
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
    ax.set_title(f"{res['name']}: mean and 95% CI over {seeds(len(res['seeds']))}", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)  # beside, off the data
    fig.tight_layout()
    return save_figure(fig, path)
