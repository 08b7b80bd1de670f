"""`analyze mixture`: how Birdie's controller moved the objective mixture while a run trained.

Reads the run's metrics.jsonl: every controller record (split "controller": the initial action at step 0, then
one after every evaluation, applying from ``applies_from``) carries the action's share per objective class
(``share/<class>``) and the mean reward per class of the evaluation that produced it (``reward/<class>``),
and whether that action was an exploration one. Draws the share of each class against the training step the
action applied from (a stacked area: the mixture in force at every step) and the rewards per class at each
evaluation; writes PNG, SVG and the numbers as CSV.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.errors import UserError

NAME = "mixture"
FIGURE = "Birdie §3.3, the dynamic mixture"


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
    typer.echo(json.dumps(result, indent=2))


def controller_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir}: has no metrics.jsonl (not a training run directory)")
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    recs = [r for r in rows if r.get("split") == "controller"]
    if not recs:
        raise UserError(
            f"{run_dir}: has no controller records; `analyze mixture` needs a run trained with "
            "objective.mixture: birdie"
        )
    return recs


def analyze_mixture(run_dir: Path, out_dir: Path) -> dict:
    import numpy as np
    import pandas as pd

    from ssmlm.analyze.plots import _plt

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
            }  # fmt: skip
            for r in recs
        ]
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / "mixture.csv"
    table.to_csv(csv, index=False)

    plt = _plt()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    # the action in force from applies_from until the next one: a step function, drawn as stacked areas
    total = _total_steps(run_dir, int(table["applies_from"].max()))
    xs = np.append(table["applies_from"].to_numpy(), total)
    shares = np.stack([table[f"share/{c}"].to_numpy() for c in classes])
    cmap = plt.get_cmap("tab10")
    top.stackplot(xs, np.concatenate([shares, shares[:, -1:]], axis=1), labels=[c.replace("_", " ") for c in classes],
                  step="post", colors=[cmap(i) for i in range(len(classes))], alpha=0.85)  # fmt: skip
    for x in table.loc[table["explored"] == 1, "applies_from"]:
        top.axvline(x, color="black", lw=0.6, ls=":")
    top.set_ylim(0, 1)
    top.set_ylabel("share of sampled objectives")
    top.set_title(f"Birdie mixture of {run_dir.name} (dotted: exploration actions)")
    top.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    rewarded = table.iloc[1:]  # the first record is the start action (no reward yet)
    for i, c in enumerate(classes):
        y = rewarded[f"reward/{c}"].to_numpy()
        if np.isfinite(y).any():
            bottom.plot(rewarded["eval_step"], y, "o-", ms=3, color=cmap(i), label=c.replace("_", " "))
    bottom.axhline(0, color="grey", lw=0.6)
    bottom.set_ylim(-1.05, 1.05)
    bottom.set_xlabel("training step")
    bottom.set_ylabel("mean reward per class\n(loss improvement, ±1)")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    png, svg = out_dir / "mixture.png", out_dir / "mixture.svg"
    fig.savefig(png, dpi=120)
    fig.savefig(svg)
    plt.close(fig)
    final = {c: float(table[f"share/{c}"].iloc[-1]) for c in classes}
    return {"plot": str(png), "svg": str(svg), "data": str(csv), "evaluations": len(table) - 1, "final_share": final}


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
    numbers = {f"final share: {c.replace('_', ' ')}": f"{v:.3f}" for c, v in r["final_share"].items()}
    return {"title": "Birdie's objective mixture over training", "figure": FIGURE, "images": [r["plot"]],
            "data": [r["data"]], "numbers": {"controller updates": r["evaluations"], **numbers}}  # fmt: skip
