"""How far each pretraining run of an experiment got at given steps: the training loss (the mean of the losses
logged over the last quarter of the steps up to the step, at most 100), the validation loss logged at the step,
their gap, and how many passes over its training split the run had made by then. A gap that grows with the
passes is a model memorising a corpus too small for the budget, which a budget sweep
(experiments/birdie_budget.yaml) must not read as "more pretraining".

    python benchmarks/pretrain_losses.py runs/experiments/birdie_budget --steps 100,200,400

Reads OUT/runs/ARM/seedS/pretrain/{metrics.jsonl,run.json,recipe.yaml} and the data directory's metadata.json;
prints one markdown table, the mean over seeds per arm and step. The validation loss of a Birdie run is that of
its objective mixture, not of next-token prediction alone: compare it only within an objective.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

WINDOW = 100  # at most this many training steps are averaged for the training loss


def window(step: int) -> int:
    """Steps averaged for the training loss at ``step``: early in a run the loss falls fast, and a mean reaching
    back to the first steps would sit above the validation loss read at the step."""
    return max(1, min(WINDOW, step // 4))


def passes(run: Path, step: int) -> float | None:
    """Passes over the training split by ``step``: step × batch × rows / training tokens."""
    info = json.loads((run / "run.json").read_text())
    meta = Path(info.get("data_dir") or "") / "metadata.json"
    if not meta.exists():
        return None
    m = json.loads(meta.read_text())
    train = yaml.safe_load((run / "recipe.yaml").read_text())["train"]
    return step * train["batch_size"] * m["max_seq_length"] / m["splits"]["train"]["tokens"]


def losses(run: Path, step: int) -> tuple[float | None, float | None]:
    """(training loss over the window(step) steps up to ``step``, validation loss at ``step``)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r["loss"] for r in rows if "split" not in r and "loss" in r and step - window(step) < r["step"] <= step]
    val = [r["lm_loss"] for r in rows if r.get("split") == "validation" and r["step"] == step and "lm_loss" in r]
    return (statistics.mean(train) if train else None), (val[-1] if val else None)


def table(out: Path, steps: list[int]) -> list[str]:
    runs = sorted(out.glob("runs/*/seed*/pretrain"))
    if not runs:
        raise SystemExit(f"error: {out}: no pretraining runs under runs/ARM/seedS/pretrain")
    by_arm: dict[str, list[Path]] = {}
    for r in runs:
        by_arm.setdefault(r.parents[1].name, []).append(r)
    lines = [
        "| arm | seeds | step | passes | training loss | validation loss | gap |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm, rs in by_arm.items():
        for s in steps:
            got = [(losses(r, s), passes(r, s)) for r in rs]
            tr = [t for (t, v), _ in got if t is not None and v is not None]
            va = [v for (t, v), _ in got if t is not None and v is not None]
            if not va:
                continue
            p = got[0][1]
            mt, mv = statistics.mean(tr), statistics.mean(va)
            pf = f"{p:.1f}" if p is not None else "–"
            lines.append(f"| {arm} | {len(va)} | {s:,} | {pf} | {mt:.3f} | {mv:.3f} | {mv - mt:+.3f} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="an experiment's output directory (ssmlm experiment --out)")
    ap.add_argument("--steps", default="100,200,400", help="comma-separated steps (default: 100,200,400)")
    a = ap.parse_args(argv)
    try:
        steps = [int(x) for x in a.steps.split(",")]
    except ValueError:
        print(f"error: --steps {a.steps!r}: expected comma-separated whole numbers", file=sys.stderr)
        return 2
    print("\n".join(table(Path(a.out), steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
