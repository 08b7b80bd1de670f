"""Choosing the copy probe on validation books: under which finetuning learning rate and number of steps does a
pretrained language model write the one number of a one-entry phone book clearly above chance?

For each learning rate, one finetuning run from --ckpt (`ssmlm finetune --task phonebook --recipe phonebook_tiny`,
the copy probe of experiments/birdie_hawk_copy.yaml) at a constant learning rate after a fixed warmup, so that its
state at step s is that of an s-step probe, validated every --every steps on --val-books books of the validation
stream (train.seed + 1,000,003) and checkpointed there. Traced per step:

    nats/digit   the teacher-forced loss of the whole reply (its tokens and END) over its digits; a model that
                 does not read the book pays ln 10 = 2.303 per uniform digit, one that copies pays ~0
    exact        the share of replies reproduced exactly under teacher forcing (what greedy decoding writes)

then, at the last step, `ssmlm evaluate --task phonebook --split validation --limit N` (greedy decoding on the
evaluation's validation books, train.seed + 2,000,003): digits in place (chance 0.1) and whole numbers. The test
books (train.seed + 3,000,017) are not touched: they are the experiment's.

    python benchmarks/phonebook_probe.py --ckpt runs/experiments/birdie_hawk_copy/runs/hawk-clm/seed0/pretrain
    python benchmarks/phonebook_probe.py --ckpt RUN --lrs 1e-3,3e-3 --steps 1200 --jobs 2

Writes OUT/probe.json and OUT/probe.md (the tables printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ssmlm.metrics_file import read_metrics

SSMLM = [sys.executable, "-m", "ssmlm"]
DIGITS = 4


def probe_sets(lr: float, a) -> list[str]:
    """The copy probe's finetuning (the experiment file's x-probe) at this learning rate, traced."""
    return [
        f"task.max_seq_length={a.seq_len}",
        f"task.phonebook.digits={DIGITS}",
        "task.phonebook.entries=[1, 1]",
        "task.phonebook.queries=[1, 1]",
        f"task.phonebook.train_books={a.steps * a.batch}",  # every row a new book: no number seen twice
        f"task.phonebook.validation_books={a.val_books}",
        f"train.steps={a.steps}",
        f"train.batch_size={a.batch}",
        f"train.learning_rate={lr}",
        "train.schedule=constant",
        f"train.warmup_steps={a.warmup}",
        f"train.eval_every={a.every}",
        "train.eval_batches=0",
        f"train.checkpoint_every={a.every}",
        f"train.seed={a.seed}",
        f"train.out_dir={a.out}",
    ]


def run(cmd: list[str], log: Path) -> None:
    with open(log, "w") as f:
        if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=os.environ).returncode:
            sys.exit(f"failed: {' '.join(cmd)} (see {log})")


def one(lr: float, a) -> dict:
    name = f"probe-lr{lr:g}"
    run_dir = a.out / name
    if not (run_dir / "summary.json").is_file():
        sets = [x for s in probe_sets(lr, a) for x in ("--set", s)]
        cmd = [*SSMLM, "finetune", "--ckpt", a.ckpt, "--task", "phonebook", "--recipe", "phonebook_tiny"]
        run([*cmd, *sets, "--name", name, "--quiet"], a.out / f"{name}.log")
    trained = json.loads((run_dir / "summary.json").read_text())["seconds_total"]  # over its launches
    trace = []
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r.get("split") == "validation" and "target_tokens" in r:
            nats = r["loss"] * r["target_tokens"] / r["samples"]  # per reply
            trace.append({"step": r["step"], "nats_per_digit": nats / DIGITS, "exact": r["exact_match"]})
    out = run_dir / "eval" / "phonebook-validation.json"
    t1, decoded = time.time(), None
    if not out.is_file():
        cmd = [*SSMLM, "evaluate", "--ckpt", str(run_dir), "--task", "phonebook", "--split", "validation"]
        run([*cmd, "--limit", str(a.decode_books)], a.out / f"{name}-evaluate.log")
        decoded = round(time.time() - t1)  # None: decoded by an earlier invocation
    greedy = json.loads(out.read_text())["metrics"]
    keep = ("digit_accuracy", "number_accuracy", "empty_replies", "malformed_replies")
    return {
        "lr": lr,
        "trace": trace,
        "greedy": {k: greedy.get(k) for k in keep},
        "seconds": {"finetune": round(trained), "evaluate": decoded},
    }


def tables(results: list[dict], a) -> str:
    lines = [
        f"Probe choice from {a.ckpt} ({a.steps:,} steps, batch {a.batch}, constant lr after {a.warmup} warmup "
        f"steps; {a.val_books} validation books teacher-forced, {a.decode_books} decoded)",
        "",
        "nats per digit (chance ln 10 = 2.303) / teacher-forced exact replies, by step:",
        "",
        "| lr | " + " | ".join(str(t["step"]) for t in results[0]["trace"]) + " |",
        "|---|" + "---|" * len(results[0]["trace"]),
    ]
    for r in results:
        cells = [f"{t['nats_per_digit']:.3f} / {t['exact']:.3f}" for t in r["trace"]]
        lines.append(f"| {r['lr']:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"greedy decoding at step {a.steps:,} ({a.decode_books} validation books; digits chance 0.1):",
        "",
        "| lr | digits in place | exact numbers | empty | malformed | finetune s | evaluate s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        g, s = r["greedy"], r["seconds"]
        lines.append(
            f"| {r['lr']:g} | {g['digit_accuracy']:.3f} | {g['number_accuracy']:.3f} | {g['empty_replies']:.3f} "
            f"| {g['malformed_replies']:.3f} | {s['finetune']} | {s['evaluate']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", required=True, help="the pretrained run the probe finetunes")
    p.add_argument("--lrs", default="1e-3,3e-3", help="learning rates, comma-separated")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--every", type=int, default=200, help="validate and checkpoint every N steps")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--val-books", type=int, default=400, help="teacher-forced validation books")
    p.add_argument("--decode-books", type=int, default=400, help="validation books decoded at the last step")
    p.add_argument("--seq-len", type=int, default=128, help="rows of the probe's finetuning")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--out", type=Path, default=Path("runs/phonebook_probe"))
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    lrs = [float(x) for x in a.lrs.split(",")]
    with ThreadPoolExecutor(a.jobs) as pool:
        results = list(pool.map(lambda lr: one(lr, a), lrs))
    text = tables(results, a)
    print(text)
    (a.out / "probe.md").write_text(text)
    (a.out / "probe.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "runs": results}))
    return 0 if all(math.isfinite(t["nats_per_digit"]) for r in results for t in r["trace"]) else 1


if __name__ == "__main__":
    sys.exit(main())
