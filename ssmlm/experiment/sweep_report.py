"""A budget sweep's results (the ``sweep`` of report.summarize's results): per arm × evaluation × pretraining
budget a 95% interval over seeds and the paired difference to the arm's reference, and per arm × evaluation the
first budget whose interval lies above chance ("learns to copy from step N"). Written by report.write beside
results.md as markdown tables (appended to it), sweep.csv and one plot per evaluation, sweep-EVAL.png.

The sweep as the runner gives it:

    budgets: [200, 400, 800, 1600]
    metric: number_accuracy
    seeds: [0, 1, 2]
    evaluations: {copy: {probe: copy, chance: 0.0001, about: 1-entry books}, ...}   # the file's order; an
                                                  # evaluation's own metric, if it has one: its "metric"
    arms: {ARM: {EVAL: {BUDGET (str): {values: {SEED: float}, error: str | None,
                                       empty: {SEED: float}, malformed: {SEED: float}}}}}  # the last two: optional
    reference: {ARM: ITS_REFERENCE} | ARM | None                                      # paired by seed

``empty`` and ``malformed``: each seed's share of empty replies and of replies not shaped like the books' numbers
(phone-book evaluations record both); the report gives their means beside the accuracies, since an accuracy of 0
from replies that say nothing or are not numbers reads differently from one of wrong numbers.

summarize_sweep adds to every cell ``interval`` and ``difference`` (stats' Interval.to_dict(), or None) and
``reference``, and at the top ``from_budget`` and ``above_chance_at`` (arm -> evaluation -> ...)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

from ssmlm.experiment.stats import (
    BOOTSTRAP_FROM,
    BOOTSTRAP_RESAMPLES,
    LEVEL,
    MIN_N,
    cut,
    mean_interval,
    paired_difference,
)
from ssmlm.markdown import markdown_table

BOUNDS = (0.0, 1.0)  # the probes' metrics are accuracies
COLUMNS = (
    "arm",
    "evaluation",
    "metric",
    "probe",
    "budget",
    "n",
    "mean",
    "low",
    "high",
    "method",
    "estimable",
    "reason",
    "above_chance",
    "reference",
    "diff_n",
    "diff_mean",
    "diff_low",
    "diff_high",
    "diff_estimable",
    "diff_reason",
    "empty",
    "malformed",
    "error",
)
SHARES = ("empty", "malformed")  # a cell's per-seed shares of such replies
# CLM dashed and Birdie solid, so that an architecture's pair (one colour) reads at a glance
LINESTYLES = {"clm": "--", "birdie": "-"}
OTHER_LINESTYLES = (":", "-.", (0, (5, 1, 1, 1)))
# and a marker each, which tells the pair apart where there is no line to see: a sweep of one budget
MARKERS = {"clm": "s", "birdie": "o"}
OTHER_MARKERS = ("^", "D", "v")


def reference_of(sweep: dict, arm: str) -> str | None:
    """The arm ``arm`` is compared with (None: the reference itself, or an arm a mapping leaves out)."""
    ref = sweep.get("reference")
    ref = ref.get(arm) if isinstance(ref, dict) else ref
    return None if ref == arm or ref not in sweep["arms"] else ref


def _seed_order(seed: str):
    return (0, int(seed), "") if seed.lstrip("-").isdigit() else (1, 0, seed)


def _values(cell: dict | None) -> dict[str, float]:
    """seed (as a string: JSON's keys are) -> value, seeds in order (a bootstrap's resamples follow the order)."""
    vals = {str(k): float(v) for k, v in ((cell or {}).get("values") or {}).items() if v is not None}
    return {k: vals[k] for k in sorted(vals, key=_seed_order) if math.isfinite(vals[k])}


def share(cell: dict, name: str) -> float | None:
    """The mean over seeds of the cell's share ``name`` (SHARES; None where the evaluation did not record it)."""
    vals = [float(v) for v in (cell.get(name) or {}).values() if v is not None]
    return sum(vals) / len(vals) if vals else None


def cell_of(sweep: dict, arm: str, evaluation: str, budget) -> dict | None:
    cells = sweep["arms"].get(arm, {}).get(evaluation) or {}
    return cells.get(str(budget), cells.get(budget))


def above(iv: dict | None, chance: float | None) -> bool:
    """Whether the interval is estimable and its low end lies above chance."""
    return bool(iv and chance is not None and iv.get("estimable") and iv["low"] is not None and iv["low"] > chance)


def summarize_sweep(sweep: dict) -> dict:
    """A copy of ``sweep`` with every cell's interval and paired difference, and per arm × evaluation the
    smallest budget above chance (``from_budget``, None if none) and ``above_chance_at`` (a bool per budget).
    Everything is computed from the cells' values, so summarizing a summary gives it again."""
    out = copy.deepcopy(sweep)
    out["budgets"] = budgets = sorted(out["budgets"])  # "from step N" is the first above chance, in ascending order
    evals = out["evaluations"]
    arms: dict[str, dict] = {}
    for arm in out["arms"]:
        arms[arm] = {}
        for ev in evals:
            arms[arm][ev] = {}
            for b in budgets:
                cell = dict(cell_of(out, arm, ev, b) or {"values": {}, "error": None})
                cell["values"] = vals = _values(cell)
                cell.setdefault("error", None)
                cell["interval"] = mean_interval(list(vals.values())).to_dict() if vals else None
                arms[arm][ev][str(b)] = cell
    out["from_budget"], out["above_chance_at"] = {}, {}
    for arm, evs in arms.items():
        ref = reference_of(out, arm)
        for ev, cells in evs.items():
            for b, cell in cells.items():
                d = paired_difference(cell["values"], arms[ref][ev][b]["values"]) if ref else None
                cell["reference"], cell["difference"] = ref, d.to_dict() if d else None
            flags = [above(cells[str(b)]["interval"], evals[ev].get("chance")) for b in budgets]
            out["above_chance_at"].setdefault(arm, {})[ev] = flags
            first = [b for b, f in zip(budgets, flags, strict=True) if f]
            out["from_budget"].setdefault(arm, {})[ev] = first[0] if first else None
    out["arms"] = arms
    out["level"] = LEVEL
    out["interval"] = (
        f"over seeds: Student t for n < {BOOTSTRAP_FROM} seeds, percentile bootstrap ({BOOTSTRAP_RESAMPLES:,} "
        f"resamples) from {BOOTSTRAP_FROM}; differences arm − reference: paired by seed, Student t; not "
        f"estimable from fewer than {MIN_N} values or values with zero spread"
    )
    return out


def metric_of(s: dict, ev: str) -> str:
    """The result field evaluation ``ev`` is scored by: its own, else the file's."""
    return s["evaluations"][ev].get("metric") or s["metric"]


def summarized(sweep: dict) -> dict:
    """``sweep`` itself when summarize_sweep made it, else its summary."""
    return sweep if "from_budget" in sweep else summarize_sweep(sweep)


# ----------------------------------------------------------------------------- markdown


def clipped(iv: dict | None, difference: bool = False) -> dict | None:
    """The interval cut to the accuracy's [0, 1] (a difference's to [-1, 1]): stats.cut at the probes' bounds."""
    return cut(iv, BOUNDS, difference)


def _cell_text(cell: dict, iv: dict | None, n_seeds: int, sign: str = "") -> str:
    """``mean [low, high]``; ``mean (n.e.: reason)`` when not estimable; the n when seeds are missing."""
    if not iv:
        return "failed" if cell.get("error") else "–"
    text = f"{iv['mean']:{sign}.2f}"
    if not iv.get("estimable", True):
        text += f" (n.e.: {iv['reason']})"
    else:
        text += f" [{iv['low']:{sign}.2f}, {iv['high']:{sign}.2f}]{'*' if iv.get('cut') else ''}"
    if iv["n"] < n_seeds and iv.get("estimable", True):
        text += f" (n={iv['n']})"
    return text


def n_seeds(n: int) -> str:
    """Seeds counted as the reports (this one and results.md) count them: "1 seed", "3 seeds"."""
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _level_table(s: dict, ev: str) -> tuple[list[str], bool]:
    """Rows = arms, columns = budgets, and the first budget above chance; whether an interval was cut."""
    budgets, n_seeds, was_cut = s["budgets"], len(s["seeds"]), False
    rows = []
    for arm, evs in s["arms"].items():
        row = [arm]
        for b in budgets:
            cell = evs[ev][str(b)]
            iv = clipped(cell["interval"])
            was_cut |= bool(iv and iv.get("estimable", True) and iv.get("cut"))
            row.append(_cell_text(cell, iv, n_seeds))
        first = s["from_budget"][arm][ev]
        measured = [b for b in budgets if evs[ev][str(b)]["interval"]]  # "not by" the last budget with values
        if s["evaluations"][ev].get("chance") is None or not measured:
            row.append("–")
        else:
            row.append(str(first) if first is not None else f"not by {measured[-1]}")
        rows.append(row)
    head = ["arm", *(f"step {b}" for b in budgets), "above chance from step"]
    return markdown_table(head, rows, align="l" + "r" * (len(budgets) + 1)), was_cut


def _shares_text(cell: dict) -> str:
    """ "empty / malformed" as the means over seeds ("0.00 / 0.85"), "–" for a share not recorded."""
    shares = [share(cell, name) for name in SHARES]
    return "–" if all(x is None for x in shares) else " / ".join("–" if x is None else f"{x:.2f}" for x in shares)


def _replies_table(s: dict, ev: str) -> list[str]:
    """Rows = arms, columns = budgets: the mean shares of empty / malformed replies; none when no cell has them."""
    if not any(cell.get(name) for evs in s["arms"].values() for cell in evs[ev].values() for name in SHARES):
        return []
    budgets = s["budgets"]
    rows = [[arm, *(_shares_text(evs[ev][str(b)]) for b in budgets)] for arm, evs in s["arms"].items()]
    lines = markdown_table(["arm", *(f"step {b}" for b in budgets)], rows, align="l" + "r" * len(budgets))
    what = "share empty / malformed (mean over seeds; malformed: not numbers of the books' shape)"
    return ["", f"Replies on {ev}, {what}:", "", *lines]


def verdict(d: dict | None) -> tuple[str, str]:
    """A plain-language reading of one paired difference arm − reference: (verdict, why)."""
    if not d:
        return "no comparison", "no seeds in common"
    if not d.get("estimable", True):
        return "cannot tell", f"not estimable: {d['reason']}"
    if d["low"] > 0:
        return "higher", "whole interval above 0"
    if d["high"] < 0:
        return "lower", "whole interval below 0"
    return "no clear difference", "interval includes 0"


def reading(arm: str, ref: str, verdicts: list[tuple[int, tuple[str, str]]]) -> str:
    """One line per pair of arms that gives every budget's verdict, budgets in a row with the same verdict
    together: "hawk-birdie vs hawk-clm: lower at step 200 (...); higher at steps 400, 800, 1600 (...)"."""
    runs: list[tuple[tuple[str, str], list[int]]] = []
    for b, v in verdicts:
        if runs and runs[-1][0] == v:
            runs[-1][1].append(b)
        else:
            runs.append((v, [b]))
    parts = [f"{v} at step{'s' * (len(bs) > 1)} {', '.join(map(str, bs))} ({why})" for (v, why), bs in runs]
    return f"- {arm} vs {ref}: " + "; ".join(parts)


def _difference_table(s: dict, ev: str) -> tuple[list[str], list[str], bool]:
    """Rows = arms with a reference (e.g. hawk-birdie − hawk-clm), columns = budgets; a reading of each row's
    cells, one line per row (one line per cell would be a dozen lines per evaluation)."""
    budgets, n_seeds, was_cut = s["budgets"], len(s["seeds"]), False
    rows = []
    readings = []
    for arm, evs in s["arms"].items():
        ref = reference_of(s, arm)
        if not ref:
            continue
        row, verdicts = [f"{arm} − {ref}"], []
        for b in budgets:
            cell = evs[ev][str(b)]
            d = clipped(cell["difference"], difference=True)
            was_cut |= bool(d and d.get("estimable", True) and d.get("cut"))
            row.append(_cell_text({}, d, n_seeds, sign="+") if d else "–")
            if cell["interval"] and s["arms"][ref][ev][str(b)]["interval"]:  # a cell without values: nothing to read
                verdicts.append((b, verdict(cell["difference"])))
        rows.append(row)
        readings += [reading(arm, ref, verdicts)] if verdicts else []
    head = ["arm − reference (paired)", *(f"step {b}" for b in budgets)]
    return markdown_table(head, rows, align="l" + "r" * len(budgets)), readings, was_cut


def sweep_markdown(summary: dict) -> str:
    """Per evaluation: accuracy per arm and budget (mean and 95% interval) with the first budget above chance,
    and the paired differences arm − reference with a reading of each; then chance and the intervals' method."""
    s = summarized(summary)
    seeds, budgets = s["seeds"], s["budgets"]
    text = [
        f"Budget sweep: {s['metric']} (unless an evaluation names its own) after each probe's finetuning from the "
        f"checkpoint at every pretraining budget (steps {', '.join(map(str, budgets))}), "
        f"{n_seeds(len(seeds))} {list(seeds)}.",
    ]
    was_cut, errors = False, []
    for ev, e in s["evaluations"].items():
        table, cut_here = _level_table(s, ev)
        what = ", ".join(x for x in (metric_of(s, ev), e.get("about"), f"probe {e.get('probe')}") if x)
        text += ["", f"### {ev} ({what})", "", *table, *_replies_table(s, ev)]
        was_cut |= cut_here
        if any(reference_of(s, arm) for arm in s["arms"]):
            diff, readings, cut_here = _difference_table(s, ev)
            text += ["", f"Paired differences on {ev}, arm − reference (by seed):", "", *diff]
            text += ["", *readings] if readings else []
            was_cut |= cut_here
        errors += [
            f"- {arm}, {ev}, step {b}: {cell['error']}"
            for arm, evs in s["arms"].items()
            for b, cell in evs[ev].items()
            if cell.get("error")
        ]
    chance = "; ".join(
        f"{ev} {e['chance']:g}" + (f" ({e['about']})" if e.get("about") else "")
        for ev, e in s["evaluations"].items()
        if e.get("chance") is not None
    )
    text += ["", f"Chance, each evaluation's metric for a model that does not read what it is asked for: {chance}."]
    text += [
        f"Intervals: {LEVEL:.0%} {s['interval']} (n.e.: not estimable, the reason given; the mean stands). "
        "Above chance from step N: the first budget whose interval is estimable and lies wholly above chance."
    ]
    if was_cut:
        text += ["*: cut to [0, 1] (a difference's to [-1, 1]); results.json and sweep.csv keep them as computed."]
    if errors:
        text += ["", "Failed cells:", *errors]
    return "\n".join(text) + "\n"


# ----------------------------------------------------------------------------- sweep.csv


def csv_rows(summary: dict) -> list[dict]:
    """One row per arm × evaluation × budget (COLUMNS), the intervals as computed (not cut)."""
    s = summarized(summary)
    rows = []
    for arm, evs in s["arms"].items():
        for ev, cells in evs.items():
            for i, b in enumerate(s["budgets"]):
                cell = cells[str(b)]
                iv, d = cell["interval"] or {}, cell["difference"] or {}
                rows.append(
                    {
                        "arm": arm,
                        "evaluation": ev,
                        "metric": metric_of(s, ev),
                        "probe": s["evaluations"][ev].get("probe"),
                        "budget": b,
                        "n": iv.get("n", 0),
                        "mean": iv.get("mean"),
                        "low": iv.get("low"),
                        "high": iv.get("high"),
                        "method": iv.get("method"),
                        "estimable": iv.get("estimable"),
                        "reason": iv.get("reason"),
                        "above_chance": s["above_chance_at"][arm][ev][i],
                        "reference": cell["reference"],
                        "diff_n": d.get("n"),
                        "diff_mean": d.get("mean"),
                        "diff_low": d.get("low"),
                        "diff_high": d.get("high"),
                        "diff_estimable": d.get("estimable"),
                        "diff_reason": d.get("reason"),
                        **{name: share(cell, name) for name in SHARES},
                        "error": cell.get("error"),
                    }
                )
    return rows


# ----------------------------------------------------------------------------- plots


def styles(arms) -> dict[str, dict]:
    """arm -> colour, line style and marker: one colour per family (the name before the first '-'), CLM dashed
    squares and Birdie solid circles (other variants dotted triangles, dash-dotted diamonds, ...)."""
    families: dict[str, str] = {}
    out, others = {}, {}
    for arm in arms:
        family, _, variant = arm.partition("-")
        colour = families.setdefault(family, f"C{len(families) % 10}")
        if variant.lower() in LINESTYLES:
            ls, marker = LINESTYLES[variant.lower()], MARKERS[variant.lower()]
        elif variant:
            i = others.setdefault(variant, len(others))
            ls, marker = OTHER_LINESTYLES[i % len(OTHER_LINESTYLES)], OTHER_MARKERS[i % len(OTHER_MARKERS)]
        else:
            ls, marker = "-", "o"
        out[arm] = {"color": colour, "ls": ls, "marker": marker}
    return out


def _plot_arm(ax, s: dict, ev: str, arm: str, style: dict, shift: float) -> None:
    """One arm's means against budget (a line), its 95% error bars, its seeds' values as dots, and hollow means
    where the interval is not estimable. ``shift``: an offset in octaves, so that arms' bars do not overlap."""
    import numpy as np

    budgets = s["budgets"]
    xs = [b * 2**shift for b in budgets]
    ivs = [s["arms"][arm][ev][str(b)]["interval"] for b in budgets]
    means = [iv["mean"] if iv else np.nan for iv in ivs]
    m = style["marker"]
    ax.plot(xs, means, color=style["color"], ls=style["ls"], lw=1.5, marker=m, ms=5, mfc="white", label=arm, zorder=2)
    for x, b, iv in zip(xs, budgets, ivs, strict=True):
        vals = list(s["arms"][arm][ev][str(b)]["values"].values())
        # just right of the bar, which would hide them
        ax.scatter([x * 2**0.018] * len(vals), vals, s=8, color=style["color"], alpha=0.5, lw=0, zorder=1)
        if not iv:
            continue
        iv = clipped(iv)
        if iv.get("estimable", True) and iv["low"] is not None:
            err = [[iv["mean"] - iv["low"]], [iv["high"] - iv["mean"]]]
            ax.errorbar([x], [iv["mean"]], yerr=err, fmt=m, ms=4, capsize=3, color=style["color"], zorder=3)
        else:
            ax.scatter([x], [iv["mean"]], s=26, marker=m, facecolors="white", edgecolors=style["color"], zorder=4)


def _legend_extras(ax) -> None:
    """What the marks mean, after the arms: seeds, a mean with its interval, a hollow (not estimable) mean."""
    from matplotlib.lines import Line2D

    marks = [
        Line2D([], [], ls="none", marker="o", ms=3, color="0.5", alpha=0.6, label="one seed"),
        Line2D([], [], ls="none", marker="o", ms=5, color="0.3", label=f"mean, {LEVEL:.0%} CI"),
        Line2D([], [], ls="none", marker="o", ms=6, mfc="white", mec="0.3", label="mean, CI not estimable"),
    ]
    handles, labels = ax.get_legend_handles_labels()
    handles += marks
    labels += [m.get_label() for m in marks]
    # beside the axes: six arms' lines fill the plot at every height
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)


def _plot_evaluation(s: dict, ev: str, path: Path) -> Path:
    from matplotlib.ticker import NullLocator

    from ssmlm.analyze.plots import pyplot, save_figure

    plt = pyplot()
    e, budgets, arms = s["evaluations"][ev], s["budgets"], list(s["arms"])
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    chance = e.get("chance")
    if chance is not None:
        ax.axhline(chance, ls=":", color="0.35", lw=1.2, label=f"chance: {chance:g}", zorder=0)
    style = styles(arms)
    for i, arm in enumerate(arms):
        _plot_arm(ax, s, ev, arm, style[arm], 0.045 * (i - (len(arms) - 1) / 2))
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(budgets[0] / 2**0.4, budgets[-1] * 2**0.4)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("pretraining budget (steps, log2 scale)")
    ax.set_ylabel(f"{metric_of(s, ev)} (greedy decoding)")
    ax.grid(color="0.92", lw=0.6)
    about = f" ({e['about']})" if e.get("about") else ""
    seeds = s["seeds"]
    ax.set_title(f"{ev}{about}: after finetuning from each budget\n{n_seeds(len(seeds))} {list(seeds)}", fontsize=10)
    _legend_extras(ax)
    fig.tight_layout()
    return save_figure(fig, path)


def sweep_plots(summary: dict, out_dir: Path) -> list[Path]:
    """sweep-EVAL.png (and .svg) per evaluation: accuracy against pretraining budget, one line per arm. One plot
    per evaluation, not per probe: each evaluation has its own chance level, and the lines of two evaluations of
    one probe (lookup2, lookup4) on one axes would double the lines of an already full plot."""
    s = summarized(summary)
    out_dir = Path(out_dir)
    return [_plot_evaluation(s, ev, out_dir / f"sweep-{ev}.png") for ev in s["evaluations"]]


def write_sweep(summary: dict, out: Path) -> dict[str, Path]:
    """sweep.csv and the plots under ``out``: {"sweep_csv": ..., "sweep_EVAL": ...png}."""
    from ssmlm.analyze.plots import write_csv

    s = summarized(summary)
    paths = {"sweep_csv": write_csv(Path(out) / "sweep.csv", COLUMNS, csv_rows(s))}
    for ev, png in zip(s["evaluations"], sweep_plots(s, out), strict=True):
        paths[f"sweep_{ev}"] = png
    return paths
