"""How long a user waits for ssmlm to refuse bad input: real processes, interleaved with the floor (a bare Python).

The tests assert what makes a refusal fast (no jax imported, no data read, nothing created); this script keeps the
time itself, which a test on a busy machine cannot assert. Every side is a fresh process, run in rotating order
round after round (benchmarks/paired.py), so the sides see the same load:

- python: ``python -c pass``, the interpreter's start, which no command can beat;
- help: ``ssmlm --help``;
- recipe error: ``ssmlm pretrain bad.yaml`` (a value out of range: one ``error:`` line);
- usage error: ``ssmlm pretrain --stop-after abc``.

Usage:
    python benchmarks/refusals.py [--rounds 7] [--passes 2]

Prints each side's median wall time per pass, and the paired median of side / python with its range (how many
interpreter starts a refusal costs).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired import compare, machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def process(*args: str, code: int, cwd: Path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def step() -> None:
        done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True)
        if done.returncode != code:
            raise SystemExit(f"{' '.join(args)}: exit {done.returncode}, expected {code}: {done.stderr.strip()}")

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--passes", type=int, default=2)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        bad = cwd / "bad.yaml"
        bad.write_text("base: default\nmodel: {hidden_size: 0}\n")
        steps = {
            "python": process("-c", "pass", code=0, cwd=cwd),
            "help": process("-m", "ssmlm", "--help", code=0, cwd=cwd),
            "recipe error": process("-m", "ssmlm", "pretrain", str(bad), code=2, cwd=cwd),
            "usage error": process("-m", "ssmlm", "pretrain", "--stop-after", "abc", code=2, cwd=cwd),
        }
        rows = compare(steps, reference="python", rounds=opts.rounds, warmup=1, passes=opts.passes)
        assert not (cwd / "runs").exists(), "a refusal left a run directory"
    print(machine_line())
    print(f"{'side':14s} {'median s (per pass)':>22s}   side / python: median (range), per pass")
    for name, row in rows.items():
        medians = " · ".join(f"{m:.2f}" for m in row["median_s"])
        cost = " · ".join(
            f"{1 / r:.1f} ({1 / h:.1f}–{1 / lo:.1f})"
            for r, lo, h in zip(row["ratio"], row["lo"], row["hi"], strict=True)
        )
        print(f"{name:14s} {medians:>22s}   {cost}")


if __name__ == "__main__":
    main()
