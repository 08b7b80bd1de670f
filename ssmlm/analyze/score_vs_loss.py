"""`analyze transfer`: downstream score against pretraining MLM loss, one line per architecture (BiGS Figure 5).

The paper plots MNLI accuracy against MLM loss for gated and stack SSM models (and BERT's values from Devlin et
al. 2018), to show that gating, not a lower loss, is what makes pretraining transfer. Here each point is one
finetuned run (``--ckpt``, repeated) and the pretraining run its run.json names as ``source``:

* score: the finetuned run's ``RUN/eval/TASK-validation.json`` metric (written by `ssmlm evaluate`), else its
  best validation evaluation during finetuning (metrics.jsonl, the official BiGS protocol);
* loss: the source's newest MLM evaluation, ``SOURCE/eval/*.json`` with ``mlm_loss`` (the highest step),
  else the last validation row of its metrics.jsonl. A source with another objective uses its own validation
  loss (``lm_loss``, ...), named in the CSV. It is the source's newest evaluation: finetuning starts from the
  source's newest checkpoint, so the two match unless the source trained on after the finetuning began.

Lines join an architecture's points (the source's ``model.arch``) in order of loss; each point is labelled
with its source run and step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.analyze.plots import write_csv
from ssmlm.errors import UserError
from ssmlm.metrics_file import read_metrics

NAME = "transfer"
FIGURE = "BiGS Figure 5"
REPORT_ACROSS_RUNS_ONLY = True  # the report draws Figure 5 across several runs only (for_report_runs)
COLUMNS = ("run", "task", "metric", "score", "score_from", "source", "arch", "step", "loss_name", "loss", "loss_from")
# BERT model-size ablation (Devlin et al. 2018, Table 6): masked-LM perplexity on held-out training data and
# MNLI-m dev accuracy of BERT with 3-24 layers; Figure 5 of the BiGS paper draws these as its BERT reference.
BERT_MNLI = ((5.84, 77.9), (5.24, 80.6), (4.68, 81.9), (3.99, 84.4), (3.54, 85.7), (3.23, 86.6))


def command(
    ckpt: Annotated[
        list[str], typer.Option("--ckpt", metavar="RUN", help="Finetuned run (repeat: one point per run).")
    ],
    metric: Annotated[
        str | None, typer.Option("--metric", help="Score to plot (default: each task's selection metric).")
    ] = None,
    bert: Annotated[
        bool, typer.Option("--bert-reference/--no-bert-reference", help="Draw BERT's MNLI points (Devlin et al.).")
    ] = False,
    out: Annotated[
        str | None, typer.Option("--out", metavar="DIR", help="Output directory (default: FIRST_RUN/analysis).")
    ] = None,
):
    """Plot downstream score against the source's MLM loss, one line per architecture (BiGS Figure 5).

    Each --ckpt is a finetuned run; its score is its `evaluate` result (RUN/eval/TASK-validation.json) or its
    best validation, and its MLM loss is that of the pretraining run it was finetuned from. Writes transfer.csv
    and transfer.png. --bert-reference adds BERT's MNLI-m accuracy against ln(MLM perplexity).
    Example: ssmlm analyze transfer --ckpt runs/bigs-mnli --ckpt runs/bigs-short-mnli --ckpt runs/stack-mnli
    """
    for c in ckpt:
        checks.run_dir(c, "--ckpt")
    result = analyze_transfer([Path(c) for c in ckpt], Path(out) if out else Path(ckpt[0]) / "analysis", metric, bert)
    return result  # printed by the CLI: tables, or JSON with --json


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e})") from None


def default_metric(info: dict) -> str:
    """The finetuned task's selection metric (what its best validation is chosen by)."""
    from ssmlm.data.taskdef import TaskDef
    from ssmlm.data.tasks import TASKS

    if info.get("task") in TASKS:
        return TASKS[info["task"]].selection
    metrics = tuple(info.get("metrics") or ("accuracy",))
    return TaskDef(info.get("task", "task"), ("text",), num_labels=info.get("num_labels", 2), metrics=metrics).selection


def finetuned_score(run_dir: Path, info: dict, metric: str) -> tuple[float, str]:
    """(score, where it came from): the `evaluate` JSON of the task's validation split, else the best
    validation row of metrics.jsonl (the highest ``metric``; the earliest on a tie)."""
    path = run_dir / "eval" / f"{info.get('task')}-validation.json"
    if path.is_file():
        metrics = _json(path).get("metrics", {})
        if isinstance(metrics.get(metric), int | float):
            return float(metrics[metric]), str(path)
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("split") == "validation"]
    rows = [r for r in rows if isinstance(r.get(metric), int | float) and r[metric] == r[metric]]  # not NaN
    if not rows:
        raise UserError(
            f"{run_dir}: no '{metric}' score (neither {path.name} from `ssmlm evaluate` nor a validation row in "
            "metrics.jsonl); evaluate the run or pass --metric"
        )
    best = max(rows, key=lambda r: r[metric])  # max keeps the first of equal rows
    return float(best[metric]), f"{run_dir / 'metrics.jsonl'} (best validation, step {best['step']})"


def _loss_key(metrics: dict) -> str | None:
    if isinstance(metrics.get("mlm_loss"), int | float):
        return "mlm_loss"
    return next((k for k, v in metrics.items() if k.endswith("_loss") and isinstance(v, int | float)), None)


def source_loss(source_dir: Path) -> dict:
    """The pretraining run's newest validation loss: {"loss", "loss_name", "step", "loss_from"}."""
    found = []
    for path in sorted((source_dir / "eval").glob("*.json")):
        data = _json(path)
        metrics = data.get("metrics") if isinstance(data, dict) else None
        if isinstance(metrics, dict) and data.get("split", "validation") == "validation" and _loss_key(metrics):
            key = _loss_key(metrics)
            found.append((data.get("step", -1), path.name, key, metrics[key], str(path)))
    if found:
        step, _, key, loss, path = max(found)
        return {"loss": float(loss), "loss_name": key, "step": step, "loss_from": path}
    rows = [r for r in read_metrics(source_dir / "metrics.jsonl") if r.get("split") == "validation" and _loss_key(r)]
    if not rows:
        raise UserError(
            f"{source_dir}: no MLM validation loss (no eval/*.json with mlm_loss, no validation row in "
            f"metrics.jsonl); run `ssmlm evaluate --ckpt {source_dir}` first"
        )
    last = rows[-1]
    key = _loss_key(last)
    return {
        "loss": float(last[key]),
        "loss_name": key,
        "step": last["step"],
        "loss_from": str(source_dir / "metrics.jsonl"),
    }


def source_of(run) -> Path:
    """The pretraining run a finetuned run names in run.json (as written, else beside the finetuned run: a
    relative path was relative to where finetuning ran, and runs are often moved together)."""
    if run.random_init:
        raise UserError(f"{run.dir}: finetuned from random initialisation: no pretraining loss to place it by")
    named = run.info.get("source")
    for d in (Path(named), run.dir.parent / Path(named).name) if named else ():
        if (d / "run.json").is_file():
            return d
    raise UserError(f"{run.dir / 'run.json'}: source '{named}' is not a run directory here")


def point(run_dir: Path, metric: str | None = None) -> dict:
    """One CSV row: a finetuned run's score and its source's loss."""
    from ssmlm.runs import open_run

    run = open_run(run_dir)
    if run.kind != "finetune":
        raise UserError(f"--ckpt {run_dir}: a {run.kind} run; give finetuned runs (each names its pretraining run)")
    source = open_run(source_of(run))
    metric = metric or default_metric(run.info)
    score, score_from = finetuned_score(run.dir, run.info, metric)
    return {
        "run": run.dir.name,
        "task": run.info.get("task"),
        "metric": metric,
        "score": score,
        "score_from": score_from,
        "source": source.dir.name,
        "arch": source.recipe.model.arch,
        **source_loss(source.dir),
    }


def analyze_transfer(run_dirs: list[Path], out_dir: Path, metric: str | None = None, bert: bool = False) -> dict:
    if not run_dirs:
        raise UserError("--ckpt: give at least one finetuned run")
    table = [point(d, metric) for d in run_dirs]
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "transfer.csv"
    write_csv(csv_path, COLUMNS, table)
    png = plot(table, out_dir / "transfer.png", bert)
    return {
        "plot": str(png),
        "data": str(csv_path),
        "points": {r["run"]: {"arch": r["arch"], r["loss_name"]: r["loss"], r["metric"]: r["score"]} for r in table},
    }


def plot(table: list[dict], out: Path, bert: bool = False) -> Path:
    """Score against loss, one line per architecture, each point labelled "source @ step"."""
    from ssmlm.analyze.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for arch in dict.fromkeys(r["arch"] for r in table):
        mine = sorted((r for r in table if r["arch"] == arch), key=lambda r: r["loss"])
        ax.plot([r["loss"] for r in mine], [r["score"] for r in mine], "o-", label=arch)
        for r in mine:
            ax.annotate(
                f"{r['source']} @ {r['step']}",
                (r["loss"], r["score"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
    if bert:
        import math

        scale = 100 if all(r["score"] <= 1 for r in table) else 1  # our accuracies are fractions
        ax.plot(
            [math.log(p) for p, _ in BERT_MNLI],
            [a / scale for _, a in BERT_MNLI],
            "s--",
            color="grey",
            label="BERT, MNLI-m (Devlin et al. 2018)",
        )
    losses = {r["loss_name"] for r in table}
    metrics = {r["metric"] for r in table}
    tasks = {str(r["task"]) for r in table}
    ax.set_xlabel(f"pretraining validation {' / '.join(sorted(losses))} (nats per predicted token)")
    ax.set_ylabel(f"{' / '.join(sorted(metrics))} on {' / '.join(sorted(tasks))} (validation split)")
    ax.set_title(f"Downstream score against pretraining loss (n = {len(table)} runs)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out)
    return out


def for_report(run, out_dir: Path) -> dict | None:
    """Figure 5's point for a finetuned run whose source pretraining run has a validation loss; None otherwise.
    The report does not draw it for one run (REPORT_ACROSS_RUNS_ONLY): one point says nothing about loss
    against score; it draws ``for_report_runs`` when two or more runs have a point."""
    if run.kind != "finetune" or not run.weights_from:
        return None
    try:
        source_of(run)
        result = analyze_transfer([run.dir], out_dir)
    except UserError:  # no loss or no score recorded: nothing to place on the figure
        return None
    p = result["points"][run.dir.name]
    return {
        "title": "Downstream score against pretraining loss",
        "figure": FIGURE,
        "images": [result["plot"]],
        "data": [result["data"]],
        "numbers": {k: v for k, v in p.items()},
    }


def for_report_runs(runs: list, out_dir: Path) -> dict | None:
    """The report's entry across runs: Figure 5 when two or more of the runs are finetuned runs with a score
    whose source run has a validation loss (one point says nothing about loss against score); None otherwise."""
    found = []
    for run in runs:
        if run.kind != "finetune" or not run.weights_from:
            continue
        try:
            source_of(run)
            point(run.dir)
        except UserError:  # no loss or no score recorded: nothing to place on the figure
            continue
        found.append(run.dir)
    if len(found) < 2:
        return None
    result = analyze_transfer(found, out_dir)
    rows = [
        [name, p["arch"], *(round(v, 4) if isinstance(v, float) else v for k, v in p.items() if k != "arch")]
        for name, p in result["points"].items()
    ]
    keys = {tuple(k for k in p if k != "arch") for p in result["points"].values()}  # (loss name, metric) per run
    loss, metric = next(iter(keys)) if len(keys) == 1 else ("validation loss", "score")
    names = [f"source's {loss}", metric]
    return {
        "title": f"Downstream score against pretraining loss (n = {len(found)} finetuned runs)",
        "figure": FIGURE,
        "images": [result["plot"]],
        "data": [result["data"]],
        "table": {"columns": ["run", "arch", *names], "rows": rows},
    }
