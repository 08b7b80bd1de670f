"""`analyze phonebook`: phone-number retrieval accuracy of one or more runs (Birdie paper Figure 1).

Reads each run's newest ``RUN/eval/phonebook-*.json`` (written by `ssmlm evaluate --task phonebook`: {"run",
"task": "phonebook", "metrics": ``ssmlm.evaluate.retrieval.summarize``, "records"}) and draws per-number accuracy
against the number of queried numbers (left, the paper's x-axis) and against the book's entry count (right), one
line per run (digit accuracy dashed beside it); the same numbers go to a CSV.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.analyze.plots import write_csv
from ssmlm.errors import UserError

NAME = "phonebook"
FIGURE = "Birdie Figure 1"
TABLES = {"by_queries": "queried numbers", "by_entries": "phone-book entries"}


def command(
    ckpt: Annotated[
        list[str], typer.Option("--ckpt", metavar="RUN", help="Run directory with a phone-book evaluation (repeat).")
    ],
    out: Annotated[
        str | None, typer.Option("--out", metavar="DIR", help="Output directory (default: FIRST_RUN/analysis).")
    ] = None,
):
    """Plot phone-number retrieval accuracy against queried numbers and book size (Birdie Figure 1).

    Example: ssmlm analyze phonebook --ckpt runs/gated_ssm_birdie --ckpt runs/gated_ssm_clm
    """
    for c in ckpt:
        checks.run_dir(c, "--ckpt")
    result = analyze_phonebook([Path(c) for c in ckpt], Path(out) if out else Path(ckpt[0]) / "analysis")
    return result  # printed by the CLI: tables, or JSON with --json


def latest_evaluation(run_dir: Path) -> dict:
    """The newest (by modification time) phone-book evaluation JSON of a run."""
    files = sorted((run_dir / "eval").glob("phonebook-*.json"), key=lambda p: (p.stat().st_mtime, p.name))
    if not files:
        raise UserError(
            f"{run_dir}: no phone-book evaluation (eval/phonebook-*.json); "
            f"run `ssmlm evaluate --ckpt {run_dir} --task phonebook` first"
        )
    try:
        result = json.loads(files[-1].read_text())
        result["metrics"]["by_queries"], result["metrics"]["by_entries"]  # noqa: B018 (the fields plotted)
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{files[-1]}: not a phone-book evaluation ({type(e).__name__}: {e})") from None
    result["file"] = str(files[-1])
    return result


def _lower(key: str) -> int:
    """A table key's lower bound: "7" -> 7, "16-31" -> 16, "512+" -> 512."""
    return int(key.rstrip("+").split("-")[0])


def analyze_phonebook(runs: list[Path], out_dir: Path, labels: list[str] | None = None) -> dict:
    from ssmlm.analyze.plots import pyplot, save_figure

    # legend = ``labels``, else the run's name (its path where two runs share a name)
    names = [r.name for r in runs]
    labels = labels or [r.name if names.count(r.name) == 1 else str(r) for r in runs]
    results = {label: latest_evaluation(r) for label, r in zip(labels, runs, strict=True)}
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "run": name,
            "axis": table,
            "bin": key,
            "books": v["books"],
            "number_accuracy_pct": 100 * v["number_accuracy"],
            "all_correct_pct": 100 * v["all_correct"],
            "digit_accuracy_pct": None if v.get("digit_accuracy") is None else 100 * v["digit_accuracy"],
        }
        for name, res in results.items()
        for table in TABLES
        for key, v in res["metrics"][table].items()
    ]
    csv_path = out_dir / "phonebook.csv"
    write_csv(csv_path, list(rows[0]) if rows else ["run"], rows)

    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (table, label) in zip(axes, TABLES.items(), strict=True):
        # x: the number of queries itself; entry bins evenly spaced in size order ("8-15" < "16-31" < … < "512+")
        keys = sorted({k for res in results.values() for k in res["metrics"][table]}, key=_lower)
        where = {k: _lower(k) for k in keys} if table == "by_queries" else {k: i for i, k in enumerate(keys)}
        for k, (name, res) in enumerate(results.items()):
            tab = res["metrics"][table]
            xs = sorted(tab, key=_lower)
            ys = [100 * tab[x]["number_accuracy"] for x in xs]
            (line,) = ax.plot([where[x] for x in xs], ys, "o-", label=name, clip_on=False)  # 0 / 100 markers whole
            for x, y in zip(xs, ys, strict=True):  # each point rests on few books: say how many
                ax.annotate(
                    f"n={tab[x]['books']}",
                    (where[x], y),
                    textcoords="offset points",
                    xytext=(0, 6 + 9 * k),
                    ha="center",
                    fontsize=7,
                    color=line.get_color(),
                )
            # digit accuracy (chance 10%): a graded signal while whole numbers are still all wrong
            dx = [x for x in xs if tab[x].get("digit_accuracy") is not None]
            if dx:
                dy = [100 * tab[x]["digit_accuracy"] for x in dx]
                ax.plot([where[x] for x in dx], dy, "x--", color=line.get_color(), alpha=0.7, label=f"{name}: digits")
        if any(v.get("digit_accuracy") is not None for res in results.values() for v in res["metrics"][table].values()):
            ax.axhline(10, color="grey", ls=":", lw=1, label="digit chance (10%)")
        if table == "by_entries":
            ax.set_xticks(range(len(keys)), keys)
        elif len(keys) <= 12:
            ax.set_xticks(sorted(where.values()))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        lo, hi = min(where.values(), default=0), max(where.values(), default=0)
        ax.set_xlim(lo - 0.5, hi + 0.5)  # one bin alone still sits on a readable axis
        ax.set_xlabel(label)
        ax.set_ylabel("accuracy (%): whole numbers, digits dashed")
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="upper right")
    books = ", ".join(f"{res['metrics']['books']}" for res in results.values())
    fig.suptitle(f"Phone-number retrieval (Birdie Figure 1): n = books evaluated ({books} in all)")
    fig.tight_layout()
    png = out_dir / "phonebook.png"
    save_figure(fig, png)
    return {"plot": str(png), "data": str(csv_path), "evaluations": {n: r["file"] for n, r in results.items()}}


def for_report(run, out_dir: Path) -> dict | None:
    """The report's entry: Fig. 1's panels for this run, when it has a phone-book evaluation."""
    if not any((run.dir / "eval").glob("phonebook-*.json")):
        return None
    r = analyze_phonebook([run.dir], out_dir)
    # its numbers are the evaluation's, in the report's Evaluation part just above
    return {"title": "Phone-book retrieval", "figure": FIGURE, "images": [r["plot"]], "data": [r["data"]]}


def for_report_runs(runs: list, out_dir: Path) -> dict | None:
    """The report's entry across runs: Fig. 1 with one line per run, when two or more have an evaluation."""
    found = [run.dir for run in runs if any((run.dir / "eval").glob("phonebook-*.json"))]
    if len(found) < 2:
        return None
    r = analyze_phonebook(found, out_dir)
    return {
        "title": f"Phone-book retrieval, {len(found)} runs compared",
        "figure": FIGURE,
        "images": [r["plot"]],
        "data": [r["data"]],
    }
