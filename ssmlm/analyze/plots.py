"""Plots and tables written by the commands (PNG + SVG, CSV; headless). numpy and matplotlib are imported on
use (see the package doc)."""

from __future__ import annotations

import csv
from pathlib import Path

from ssmlm.metrics_file import read_metrics


def pyplot():
    """matplotlib.pyplot on the headless Agg backend (imported on first use: it takes a second)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, png: Path, dpi: int = 120, svg: bool = True) -> Path:
    """Write ``fig`` as ``png`` and a vector copy beside it (.svg, for papers and slides), then close it. The
    saved area grows to hold every title, label and legend (bbox_inches="tight"): nothing is cut off."""
    fig.savefig(png, dpi=dpi, bbox_inches="tight", pad_inches=0.08)
    if svg:
        fig.savefig(png.with_suffix(".svg"), bbox_inches="tight", pad_inches=0.08)
    pyplot().close(fig)
    return png


def write_csv(path: Path, columns, rows) -> Path:
    """Rows (dicts) as a CSV with the given columns, in order."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)
    return path


class LossPlot:
    """A training-loop hook: at the end of a stage, plot its metrics and name the file in the summary."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def on_end(self, summary: dict) -> None:
        import jax

        if jax.process_index() == 0:
            summary["loss_plot"] = str(plot_metrics(self.run_dir))


def plot_metrics(run_dir: Path, out: Path | None = None) -> Path:
    """Training loss (and the objective's validation loss, when logged) against step."""
    plt = pyplot()
    rows = read_metrics(run_dir / "metrics.jsonl")
    # a step logged twice (an older run started again) keeps its last line
    train = sorted({r["step"]: r for r in rows if "loss" in r and "split" not in r}.values(), key=lambda r: r["step"])
    # the objective's own validation loss: mlm_loss (MLM), lm_loss (next token), ...
    val = [r for r in rows if r.get("split") == "validation"]
    key = next((k for r in val for k in r if k.endswith("_loss") and not k.startswith("config_") or k == "loss"), None)
    val = sorted({r["step"]: r for r in val if key in r}.values(), key=lambda r: r["step"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="training loss (each logged step)")
    if val:
        name = "" if key == "loss" else key.removesuffix("_loss").upper() + " "
        ax.plot([r["step"] for r in val], [r[key] for r in val], "o-", ms=4, label=f"validation {name}loss")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss (nats per predicted token)")
    ax.set_title(f"{run_dir.name}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    out = out or run_dir / "loss.png"
    fig.tight_layout()
    return save_figure(fig, out, svg=False)
