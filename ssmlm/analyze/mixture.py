"""`analyze mixture`: how Birdie's controller moved the objective mixture while a run trained.

Reads the run's metrics.jsonl: every controller record (split "controller": the initial action at step 0, then
one after every evaluation, applying from ``applies_from``) carries the action's share per objective class
(``share/<class>``) and the mean reward per class of the evaluation that produced it (``reward/<class>``),
and whether that action was an exploration one. Draws the share of each class against the training step the
action applied from (a stacked area: the mixture in force at every step) and the rewards per class at each
evaluation (markers, one slot per evaluation: the evaluations are spaced unevenly, so no line joins them);
writes PNG, SVG and the numbers as CSV. A step logged twice (a run started again before its first checkpoint,
with an older ssmlm) counts once, its last record.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.errors import UserError

NAME = "mixture"
FIGURE = "Birdie §3.3, the dynamic mixture"
MARKERS = "osD^v<>ph"  # one per class in the reward panel
REPORT_PART = "objectives"  # the report shows it beside the objective losses, not among the paper figures


def command(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Run directory of a Birdie (objective.mixture: birdie) run.")],
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default: RUN/analysis).")] = None,
):
    """Plot the objective mixture Birdie's controller chose over training (Birdie §3.3, the dynamic mixture;
    the paper draws no figure of it): share per objective class and mean reward per class.

    Example: ssmlm analyze mixture --ckpt runs/birdie_gated_ssm
    """
    checks.run_dir(ckpt, "--ckpt")
    result = analyze_mixture(Path(ckpt), Path(out) if out else Path(ckpt) / "analysis")
    return result  # printed by the CLI: tables, or JSON with --json


def controller_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir}: has no metrics.jsonl (not a training run directory)")
    from ssmlm.analyze.run_summary import metric_rows

    recs = [r for r in metric_rows(run_dir) if r.get("split") == "controller"]
    if not recs:
        raise UserError(
            f"{run_dir}: has no controller records; `analyze mixture` needs a run trained with "
            "objective.mixture: birdie"
        )
    return recs


def analyze_mixture(run_dir: Path, out_dir: Path) -> dict:
    import numpy as np
    import pandas as pd

    recs = controller_records(run_dir)
    classes = [k.removeprefix("share/") for k in recs[0] if k.startswith("share/")]
    table = pd.DataFrame(
        [
            {
                "eval_step": r["step"],
                "applies_from": r["applies_from"],
                "explored": int(r.get("explored", 0)),
                **{f"share/{c}": r.get(f"share/{c}", np.nan) for c in classes},
                **{f"reward/{c}": r.get(f"reward/{c}", np.nan) for c in classes},
            }
            for r in recs
        ]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / "mixture.csv"
    table.to_csv(csv, index=False)

    png = plot_mixture(table, classes, run_dir, out_dir / "mixture.png")
    svg = png.with_suffix(".svg")
    start = {c: float(table[f"share/{c}"].iloc[0]) for c in classes}
    final = {c: float(table[f"share/{c}"].iloc[-1]) for c in classes}
    return {
        "plot": str(png),
        "svg": str(svg),
        "data": str(csv),
        "evaluations": len(table) - 1,
        "start_share": start,
        "final_share": final,
    }


def plot_mixture(table, classes: list[str], run_dir: Path, png: Path) -> Path:
    """Top: the share of each class in force at every step (stacked). Bottom: the mean reward per class at
    each evaluation, with its own legend."""
    import numpy as np

    from ssmlm.analyze.plots import pyplot, save_figure

    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7.4))
    # the action in force from applies_from until the next one: a step function, drawn as stacked areas
    total = _total_steps(run_dir, int(table["applies_from"].max()))
    xs = np.append(table["applies_from"].to_numpy(), total)
    shares = np.stack([table[f"share/{c}"].to_numpy() for c in classes])
    cmap = plt.get_cmap("tab10")
    labels = [c.replace("_", " ") for c in classes]
    top.stackplot(
        xs,
        np.concatenate([shares, shares[:, -1:]], axis=1),
        labels=labels,
        step="post",
        colors=[cmap(i) for i in range(len(classes))],
        alpha=0.85,
    )
    for x in table.loc[table["explored"] == 1, "applies_from"]:
        top.axvline(x, color="black", lw=0.6, ls=":")
    top.set_ylim(0, 1)
    top.set_ylabel("share of sampled objectives")
    top.set_title(f"{run_dir.name}: Birdie's mixture (dotted: exploration actions)")
    top.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, title="share of", title_fontsize=8)
    rewarded = table.iloc[1:]  # the first record is the start action (no reward yet)
    steps = rewarded["eval_step"].to_numpy()
    # one slot per evaluation, the classes side by side in it: the evaluations are unevenly spaced (1, 5, 10,
    # 20, ... × scale), so no line joins them, and equal rewards of several classes stay visible
    slots = np.arange(len(steps))
    width = min(0.8 / max(len(classes), 1), 0.12)
    for i, c in enumerate(classes):
        y = rewarded[f"reward/{c}"].to_numpy()
        if np.isfinite(y).any():
            bottom.plot(
                slots + (i - (len(classes) - 1) / 2) * width,
                y,
                MARKERS[i % len(MARKERS)],
                ms=5,
                color=cmap(i),
                label=labels[i],
            )
    for x in slots[1:]:
        bottom.axvline(x - 0.5, color="grey", lw=0.4, alpha=0.5)
    bottom.set_xticks(slots, [f"{s:,}" for s in steps])
    bottom.set_xlim(-0.5, len(steps) - 0.5)
    bottom.axhline(0, color="grey", lw=0.6)
    bottom.set_ylim(-1.1, 1.1)
    bottom.set_xlabel("evaluation, at training step (evenly spaced here; the steps are not)")
    bottom.set_ylabel("mean reward per class\n(loss improvement, ±1)")
    bottom.set_title(f"reward of each class at each of the {len(steps)} evaluations", fontsize=10)
    bottom.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, title="reward of", title_fontsize=8)
    top.set_xlabel("training step")
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save_figure(fig, png)


def _total_steps(run_dir: Path, at_least: int) -> int:
    """Where the last action ends on the x axis: the run's total steps (recipe.yaml), else past its last step."""
    import yaml

    try:
        total = int(yaml.safe_load((run_dir / "recipe.yaml").read_text())["train"]["steps"])
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        total = 0
    return max(total, at_least + 1)


def for_report(run, out_dir: Path) -> dict | None:
    """The report's entry: the mixture figure of a run trained with objective.mixture: birdie."""
    if run.recipe.objective.kind != "lm" or run.recipe.objective.mixture != "birdie":
        return None
    metrics = run.dir / "metrics.jsonl"  # a finetuned run keeps its source's recipe but made no choices itself
    if not metrics.is_file() or '"split": "controller"' not in metrics.read_text():
        return None
    r = analyze_mixture(run.dir, out_dir)
    rows = [[c.replace("_", " "), round(r["start_share"][c], 3), round(v, 3)] for c, v in r["final_share"].items()]
    columns = ["objective class", "share at the start", "share at the end"]
    title = f"Birdie's objective mixture over training ({r['evaluations']} controller updates)"
    return {
        "title": title,
        "figure": FIGURE,
        "images": [r["plot"]],
        "data": [r["data"]],
        "numbers": {"controller updates": r["evaluations"]},
        "table": {"columns": columns, "rows": rows},
    }
