"""`analyze squad-length`: SQuAD v2 Answer Contains Label and F1 against context length, one line per run
(Birdie Figure 2). Reads the generation evaluation each run saved in RUN/eval/squad_v2-*.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ssmlm.analyze.plots import write_csv
from ssmlm.errors import UserError

NAME = "squad-length"
FIGURE = "Birdie Figure 2"
COLUMNS = ("run", "bin", "lo", "hi", "n", "contains", "contains_normalized", "f1")


def command(
    ckpt: Annotated[list[str], typer.Option("--ckpt", help="Run directory (repeat for one line per run).")],
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default: FIRST_RUN/analysis).")] = None,
):
    """Plot SQuAD v2 Answer Contains Label and F1 by context length, one line per run (Birdie Figure 2).

    Each run needs its SQuAD v2 generation evaluation (RUN/eval/squad_v2-*.json).
    Example: ssmlm analyze squad-length --ckpt runs/birdie_hawk --ckpt runs/clm_hawk
    """
    result = analyze_squad_length([Path(c) for c in ckpt], Path(out) if out else Path(ckpt[0]) / "analysis")
    return result  # printed by the CLI: tables, or JSON with --json


def load_result(run_dir: Path) -> dict:
    """The run's newest SQuAD v2 generation result (a squad_v2-*.json holding ``by_length``)."""
    if not run_dir.is_dir():
        raise UserError(f"--ckpt {run_dir}: no such run directory")
    found = []
    for path in sorted((run_dir / "eval").glob("squad_v2-*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise UserError(f"{path}: not a JSON file ({e})") from None
        if isinstance(data, dict) and data.get("task") == "squad_v2" and "by_length" in data:
            found.append((path.stat().st_mtime, path, data))
    if not found:
        raise UserError(
            f"{run_dir}: no SQuAD v2 generation evaluation (RUN/eval/squad_v2-*.json with by_length); evaluate the run "
            "on SQuAD v2 first"
        )
    _, path, data = max(found, key=lambda f: (f[0], str(f[1])))
    data.setdefault("run", run_dir.name)
    return data


def rows(results: list[dict]) -> list[dict]:
    """One CSV row per (run, length bin)."""
    return [{"run": r["run"], **{k: b.get(k) for k in COLUMNS[1:]}} for r in results for b in r["by_length"]]


def analyze_squad_length(run_dirs: list[Path], out_dir: Path) -> dict:
    if not run_dirs:
        raise UserError("--ckpt: give at least one run directory")
    results = [load_result(d) for d in run_dirs]
    names = [r["run"] for r in results]
    if len(set(names)) < len(names):  # two runs saved under one name: tell their lines apart by directory
        for r, d in zip(results, run_dirs, strict=True):
            r["run"] = str(d)
    table = rows(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "squad_length.csv"
    write_csv(csv_path, COLUMNS, table)
    png = plot(table, out_dir / "squad_length.png")
    return {
        "plot": str(png),
        "data": str(csv_path),
        "runs": {r["run"]: r["metrics"] for r in results},
    }


def plot(table: list[dict], out: Path) -> Path:
    """Two panels (Contains Label, F1) of score against context-length bin, one line per run."""
    from ssmlm.analyze.plots import pyplot, save_figure

    plt = pyplot()
    bins = sorted({(r["lo"], r["bin"]) for r in table})  # every run's bins, in length order
    x = {label: i for i, (_, label) in enumerate(bins)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    for ax, (metric, title) in zip(axes, (("contains", "Answer Contains Label (%)"), ("f1", "F1 (%)")), strict=True):
        for run in dict.fromkeys(r["run"] for r in table):
            mine = [r for r in table if r["run"] == run]
            (line,) = ax.plot([x[r["bin"]] for r in mine], [r[metric] for r in mine], "o-", label=run)
            for r in mine:  # the questions behind each point
                if r.get("n") is not None and r[metric] is not None:
                    ax.annotate(
                        f"n={r['n']}",
                        (x[r["bin"]], r[metric]),
                        textcoords="offset points",
                        xytext=(0, 5),
                        ha="center",
                        fontsize=7,
                        color=line.get_color(),
                    )
        ax.set_xticks(range(len(bins)), [label for _, label in bins], rotation=30)
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("SQuAD v2, answerable questions, by context length (n: questions per point)")
    fig.tight_layout()
    save_figure(fig, out)
    return out


def for_report(run, out_dir: Path) -> dict | None:
    """The report's entry: Fig. 2 for this run, when it has a SQuAD v2 generation evaluation."""
    try:
        result = load_result(run.dir)
    except UserError:
        return None
    r = analyze_squad_length([run.dir], out_dir)
    numbers = {k: v for k, v in result["metrics"].items() if isinstance(v, int | float)}
    return {
        "title": "SQuAD v2 (answerable) by context length",
        "figure": FIGURE,
        "images": [r["plot"]],
        "data": [r["data"]],
        "numbers": numbers,
    }
