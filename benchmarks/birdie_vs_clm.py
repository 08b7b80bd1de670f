"""Birdie against next-token prediction, tiny and on CPU: does the training procedure change phone-book retrieval?

    python benchmarks/birdie_vs_clm.py [--steps 400] [--finetune-steps 100] [--books 40] [--out runs/birdie_vs_clm]

Four Gated SSMs (recipes lm_tiny: d 128, 4 layers, rows of 256 tokens, batch 16) are pretrained on the built-in
corpus with the same steps and data, differing only in the procedure (Birdie paper Fig. 1B):

    clm            next-token prediction only, causal                     recipes/clm_gated_ssm.yaml
    birdie_causal  the Birdie grid and controller, every layer causal     recipes/birdie_causal_gated_ssm.yaml
    birdie_fixed   the Birdie grid at a fixed ratio, bidirectional prefix recipes/birdie_fixed_gated_ssm.yaml
    birdie         the grid, the controller and the bidirectional prefix  recipes/birdie_gated_ssm.yaml

each is finetuned on generated phone books (recipes/phonebook_tiny.yaml: rows of 512 tokens, 4-24 entries, 1-4
queried numbers) and evaluated by greedy decoding on the same held-out books. Every step is the `ssmlm` command a
user would run (run directories resume, so an interrupted benchmark continues where it stopped). Prints a markdown
table and writes it, the per-run JSON and `analyze phonebook`'s plot under --out. "minutes" is pretraining plus
finetuning (first to last metrics row of each run) plus the evaluation; digit accuracy (chance 0.1) is the graded
signal while whole numbers are still wrong.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ARMS = {
    "clm": "clm_gated_ssm",
    "birdie_causal": "birdie_causal_gated_ssm",
    "birdie_fixed": "birdie_fixed_gated_ssm",
    "birdie": "birdie_gated_ssm",
}


def ssmlm(*args: str) -> float:
    """Run one ssmlm command in its own process; return its wall time."""
    t = time.time()
    cmd = [sys.executable, "-m", "ssmlm", *map(str, args)]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)
    return time.time() - t


def last(path: Path, split: str, key: str) -> float | None:
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    vals = [r[key] for r in rows if r.get("split") == split and key in r]
    return vals[-1] if vals else None


def train_minutes(path: Path) -> float:
    """A run's training time in minutes from its metrics rows' timestamps. A gap over 5× the median between
    rows is an interruption (the run was stopped and resumed later) and counts as one median gap."""
    times = sorted(t for ln in path.read_text().splitlines() if ln.strip() and (t := json.loads(ln).get("time")))
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    if not gaps:
        return 0.0
    median = sorted(gaps)[len(gaps) // 2]
    return sum(g if g <= 5 * median else median for g in gaps) / 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400, help="pretraining steps per arm")
    ap.add_argument("--finetune-steps", type=int, default=100)
    ap.add_argument("--books", type=int, default=40, help="held-out books scored per arm")
    ap.add_argument("--out", default="runs/birdie_vs_clm")
    ap.add_argument("--arms", default=",".join(ARMS))
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows, runs = [], []
    for arm in a.arms.split(","):
        recipe = ARMS[arm]
        common = ["--set", f"train.out_dir={out}", "-q"]
        ssmlm("pretrain", recipe, "--name", arm, "--set", f"train.steps={a.steps}", *common)
        ft = f"{arm}-phonebook"
        ssmlm("finetune", "--ckpt", out / arm, "--task", "phonebook", "--recipe", "phonebook_tiny", "--name", ft,
                     "--set", f"train.steps={a.finetune_steps}", *common)  # fmt: skip
        t_ev = ssmlm("evaluate", "--ckpt", out / ft, "--task", "phonebook", "--limit", a.books)
        result = json.loads((out / ft / "eval" / "phonebook-validation.json").read_text())
        m = result["metrics"]
        rows.append({
            "arm": arm, "recipe": recipe,
            "pretrain_lm_loss": last(out / arm / "metrics.jsonl", "validation", "lm_loss"),
            "phonebook_val_loss": last(out / ft / "metrics.jsonl", "validation", "loss"),
            "teacher_forced_exact": last(out / ft / "metrics.jsonl", "validation", "exact_match"),
            "number_accuracy": m.get("number_accuracy"), "all_correct": m.get("all_correct"),
            "digit_accuracy": m.get("digit_accuracy"),
            "minutes": round(train_minutes(out / arm / "metrics.jsonl") + train_minutes(out / ft / "metrics.jsonl")
                             + t_ev / 60, 1),
        })  # fmt: skip
        runs += ["--ckpt", str(out / ft)]
    ssmlm("analyze", "phonebook", *runs, "--out", out)
    head = ("| arm | pretraining val loss (own mixture) | phone-book val loss | teacher-forced exact | "
            "per-number accuracy | all numbers right | digit accuracy | minutes |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    fmt = lambda v, p=3: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    lines = [head] + [
        f"| {r['arm']} | {fmt(r['pretrain_lm_loss'])} | {fmt(r['phonebook_val_loss'])} | "
        f"{fmt(r['teacher_forced_exact'])} | {fmt(r['number_accuracy'])} | {fmt(r['all_correct'])} | "
        f"{fmt(r['digit_accuracy'])} | {r['minutes']} |"
        for r in rows
    ]
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    print(f"total {(time.time() - t0) / 60:.1f} min; wrote {out / 'table.md'} and {out / 'phonebook.png'}")


if __name__ == "__main__":
    main()
