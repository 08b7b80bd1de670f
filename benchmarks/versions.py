"""Two revisions of ssmlm running the same training command, interleaved: did a change make training slower?

Each revision is exported from git (``git archive``) into its own folder and run as a subprocess with that folder
first on PYTHONPATH, in rotating order round after round (benchmarks/paired.py), so neighbouring runs of the two
sides see the same load on a shared machine. Every run is a fresh ``ssmlm pretrain`` of the same recipe for
``--steps`` steps into its own run directory, on one data cache prepared before timing starts. Two figures per run:

- wall: the whole process, as a user waits for it (imports, data, compilation, steps, the final save);
- step: the steady time per training step, from the run's metrics.jsonl timestamps between its first logged
  step after compilation and its last (the loop itself, without start-up).

Usage:
    python benchmarks/versions.py BEFORE AFTER [--steps 60] [--rounds 3] [--passes 2] [--set KEY=VALUE ...]

Prints, per figure, each side's median per pass and the paired median of BEFORE / AFTER with its range over
rounds (above 1: AFTER is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired import machine_line, ratio_cell, summarise  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (a commit, tag or branch) written to ``into``; returns the folder."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_once(tree: Path, out: Path, name: str, steps: int, sets: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, steady seconds per step) of one fresh pretraining run of ``tree``'s code."""
    args = [sys.executable, "-m", "ssmlm", "pretrain", "-q", "--name", name, "--stop-after", str(steps),
            "--set", f"train.out_dir={out}", "--set", "train.log_every=10"]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    t0 = time.perf_counter()
    p = subprocess.run(args, env={**env, "PYTHONPATH": str(tree)}, capture_output=True, text=True, cwd=out)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{tree.name}: pretrain failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in rows if "time" in r and "loss" in r]
    if len(timed) < 3:  # a warm-up run: too short for a steady figure
        return wall, float("nan")
    first, last = timed[1], timed[-1]  # the first logged step includes compilation
    return wall, (last["time"] - first["time"]) / (last["step"] - first["step"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="recipe override for both sides")
    a = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ssmlm-versions-"))
    sides = {a.before: export(a.before, tmp / "before"), a.after: export(a.after, tmp / "after")}
    env = {**os.environ, "SSMLM_HOME": str(tmp / "home"), "JAX_PLATFORMS": "cpu"}
    for tree in sides.values():  # data cache and jax's first import, untimed
        run_once(tree, tmp, f"warm-{tree.name}", 20, a.sets, env)
    walls, steps = [], []
    for p in range(a.passes):
        wall_t, step_t = {r: [] for r in sides}, {r: [] for r in sides}
        for i in range(a.rounds):
            names = list(sides)
            for rev in names[i % 2 :] + names[: i % 2]:
                w, s = run_once(sides[rev], tmp, f"{sides[rev].name}-{p}-{i}", a.steps, a.sets, env)
                wall_t[rev].append(w)
                step_t[rev].append(s)
                print(f"pass {p + 1} round {i + 1} {rev}: wall {w:.1f} s, step {1000 * s:.0f} ms", flush=True)
        walls.append(wall_t)
        steps.append(step_t)
    print(f"\n{machine_line()}; {a.steps} steps per run, {a.rounds} rounds x {a.passes} passes")
    for title, times in (("wall s (whole process)", walls), ("step ms (steady)", steps)):
        res = summarise(times, a.before)
        scale = 1000 if title.startswith("step") else 1
        print(f"\n{title}\n| side | median (pass 1 · 2) | {a.before} / side, paired median (range) |\n|---|---|---|")
        for rev, r in res.items():
            med = " · ".join(f"{scale * m:.1f}" for m in r["median_s"])
            print(f"| {rev} | {med} | {'' if rev == a.before else ratio_cell(r)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
