"""The validation loss of every objective configuration of a language-model run, named and grouped by class.

A run whose mixture a controller moves (``objective.mixture: birdie``) evaluates a fixed set of rows per
configuration and logs their loss as ``config_loss_<i>`` (ssmlm.objectives.lm); ``i`` indexes the
configurations the run kept (those that fit its rows). Their names come, first found, from the checkpoint
manifest (``configs``, written by the training loop), from run.json, from the mixture's grid when none was
left out, else they are numbered. Writes objective_losses.csv (every configuration at every evaluation) and
two figures: the mean loss per class at each evaluation, and every configuration's loss (grouped by class).
"""

from __future__ import annotations

import re
from pathlib import Path

from ssmlm.analyze.plots import save_figure, write_csv
from ssmlm.analyze.run_summary import metric_rows, read_json, validation_rows

PREFIX = "config_loss_"
MAX_COLUMNS = 12  # evaluations shown in the figures (evenly picked, first and last kept); the CSV has all


def config_losses(rows: list[dict]) -> tuple[list[int], list[list[float]]]:
    """(evaluation steps, losses[evaluation][configuration]) of the validation rows holding configuration losses."""
    val = [r for r in validation_rows(rows) if f"{PREFIX}0" in r]
    if not val:
        return [], []
    n = sum(1 for k in val[-1] if k.startswith(PREFIX))
    return [r["step"] for r in val], [[float(r.get(f"{PREFIX}{i}", float("nan"))) for i in range(n)] for r in val]


def newest_manifest(run_dir: Path) -> dict:
    """The JSON manifest of the run's newest checkpoint (Orbax's JSON item, read as a file), or {}."""
    ckpts = run_dir / "checkpoints"
    steps = sorted((int(p.name) for p in ckpts.iterdir() if p.name.isdigit()), reverse=True) if ckpts.is_dir() else []
    for step in steps:
        found = read_json(ckpts / str(step) / "meta" / "metadata")
        if found:
            return found
    return {}


def config_names(run, n: int) -> tuple[list[str], str]:
    """The names of the run's ``n`` evaluated configurations and where they came from."""
    from ssmlm.objectives.birdie.mixtures import mixture

    for where, names in (
        ("the checkpoint manifest", newest_manifest(run.dir).get("configs")),
        ("run.json", run.info.get("configs")),
    ):
        if isinstance(names, list) and len(names) == n:
            return [str(x) for x in names], where
    try:
        grid = [c.name for c in mixture(run.recipe.objective.mixture)[0]]
    except ValueError:
        grid = []
    if len(grid) == n:
        return grid, f"the {run.recipe.objective.mixture} grid"
    return [f"configuration {i}" for i in range(n)], "numbered (no record of the names)"


def class_of(name: str) -> str:
    """A configuration's objective class: its kind (every grid configuration's class is its function's name)."""
    return name.split("(", 1)[0].strip() or name


def short_name(name: str) -> str:
    """ "infilling(max_len=256,mean=3.0,min_len=30,rate=0.05)" -> "rate 0.05, mean 3, ≤256 tokens"."""
    m = re.fullmatch(r"[^(]*\((.*)\)", name)
    if not m:
        return ""
    args = dict(a.split("=", 1) for a in m.group(1).split(",") if "=" in a)
    parts = []
    for key, label in (("rate", "rate"), ("mean", "mean"), ("p", "p"), ("k", "k")):
        if key in args:
            parts.append(f"{label} {args[key].removesuffix('.0')}")
    if args.get("form"):
        parts.append(args["form"].replace("_", "→"))
    if args.get("shuffle") == "True":
        parts.append("shuffled")
    if "max_len" in args:
        parts.append(f"≤{args['max_len']} tokens")
    return ", ".join(parts)


def class_table(names: list[str], steps: list[int], losses: list[list[float]]) -> list[dict]:
    """One row per class, in the order the classes first appear: configurations, mean loss at the first and
    the last evaluation, and the configurations with the lowest and highest last loss."""
    import math

    classes = list(dict.fromkeys(class_of(x) for x in names))
    out = []
    for c in classes:
        idx = [i for i, x in enumerate(names) if class_of(x) == c]
        first = [losses[0][i] for i in idx if math.isfinite(losses[0][i])]
        last = [(losses[-1][i], i) for i in idx if math.isfinite(losses[-1][i])]
        lo, hi = (min(last), max(last)) if last else ((math.nan, idx[0]), (math.nan, idx[0]))
        out.append(
            {
                "class": c,
                "n": len(idx),
                "first": sum(first) / len(first) if first else math.nan,
                "last": sum(v for v, _ in last) / len(last) if last else math.nan,
                "lowest": (short_name(names[lo[1]]) or c, lo[0]),
                "highest": (short_name(names[hi[1]]) or c, hi[0]),
            }
        )
    return out


def _columns(steps: list[int]) -> list[int]:
    """Indices of at most MAX_COLUMNS evaluations, evenly spread, the first and the last included."""
    if len(steps) <= MAX_COLUMNS:
        return list(range(len(steps)))
    return sorted({round(i * (len(steps) - 1) / (MAX_COLUMNS - 1)) for i in range(MAX_COLUMNS)})


def plot_classes(table: list[dict], names: list[str], steps: list[int], losses, title: str, out: Path) -> Path:
    """Mean validation loss per class (rows, with their number of configurations) at each evaluation (columns)."""
    import numpy as np

    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    cols = _columns(steps)
    grid = np.array(
        [
            [np.nanmean([losses[j][i] for i, x in enumerate(names) if class_of(x) == row["class"]]) for j in cols]
            for row in table
        ]
    )
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * len(cols) + 2.2, 0.42 * len(table) + 1.5))
    im = ax.imshow(grid, aspect="auto", cmap="viridis_r")
    mid = np.nanmean(grid)
    for (r, c), v in np.ndenumerate(grid):
        ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=8, color="white" if v > mid else "black")
    ax.set_yticks(range(len(table)), [f"{row['class'].replace('_', ' ')} (n={row['n']})" for row in table])
    ax.set_xticks(range(len(cols)), [str(steps[j]) for j in cols])
    ax.set_xlabel("evaluation at training step")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="mean validation loss (nats/token)", shrink=0.9)
    fig.tight_layout()
    return save_figure(fig, out)


def plot_configs(names: list[str], steps: list[int], losses, title: str, out: Path) -> Path:
    """Every configuration's validation loss (rows, named and grouped by class) at each evaluation."""
    import numpy as np

    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    cols = _columns(steps)
    classes = list(dict.fromkeys(map(class_of, names)))
    order = sorted(range(len(names)), key=lambda i: (classes.index(class_of(names[i])), i))
    grid = np.array([[losses[j][i] for j in cols] for i in order])
    labels = [f"{class_of(names[i]).replace('_', ' ')}: {short_name(names[i])}".rstrip(": ") for i in order]
    fig, ax = plt.subplots(figsize=(4.2 + 0.55 * len(cols) + 1.5, 0.17 * len(order) + 1.4))
    im = ax.imshow(grid, aspect="auto", cmap="viridis_r", interpolation="nearest")
    ax.set_yticks(range(len(order)), labels, fontsize=6.5)
    ax.set_xticks(range(len(cols)), [str(steps[j]) for j in cols], fontsize=8)
    for r in range(1, len(order)):  # a line between classes
        if class_of(names[order[r]]) != class_of(names[order[r - 1]]):
            ax.axhline(r - 0.5, color="white", lw=1.2)
    ax.set_xlabel("evaluation at training step")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="validation loss (nats/token)", shrink=0.5, pad=0.02)
    fig.tight_layout()
    return save_figure(fig, out)


def objective_losses(run, out_dir: Path) -> dict | None:
    """The report's objective-losses part of a run: None when the run logged no configuration losses."""
    steps, losses = config_losses(metric_rows(run.dir))
    if not steps:
        return None
    names, source = config_names(run, len(losses[0]))
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = write_csv(
        out_dir / "objective_losses.csv",
        ("step", "index", "class", "configuration", "loss"),
        [
            {"step": s, "index": i, "class": class_of(x), "configuration": x, "loss": losses[j][i]}
            for j, s in enumerate(steps)
            for i, x in enumerate(names)
        ],
    )
    table = class_table(names, steps, losses)
    name = run.dir.name
    by_class = plot_classes(
        table, names, steps, losses, f"{name}: validation loss per objective class", out_dir / "objective_classes.png"
    )
    every = plot_configs(
        names,
        steps,
        losses,
        f"{name}: validation loss of each of the {len(names)} configurations",
        out_dir / "objective_configs.png",
    )
    try:
        from ssmlm.objectives.birdie.mixtures import mixture

        grid = len(mixture(run.recipe.objective.mixture)[0])
    except ValueError:
        grid = len(names)
    return {
        "steps": steps,
        "names": names,
        "names_from": source,
        "table": table,
        "grid": grid,
        "images": [str(by_class), str(every)],
        "data": [str(csv)],
    }
