"""How long a run takes to stop after SIGTERM (a batch scheduler's or a spot machine's notice): signal to exit.

Each try starts a fresh ``ssmlm pretrain`` of the given recipe (the embedded default unless named) in a temporary
folder, waits until the run has logged ``--after`` training steps past its first, sends SIGTERM, and times the
exit. The run must exit 130 with one ``interrupted:`` line and draw no plots (the next invocation does); each try
also checks that. A spot machine gives about 30 s between its notice and the kill.

Usage:
    python benchmarks/stop_time.py [RECIPE] [--tries 3] [--after 20] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired import machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def train_steps(log: Path) -> list[int]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    return [r["step"] for r in rows if "split" not in r]


def one_try(recipe: list[str], sets: list[str], after: int, home: Path, folder: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SSMLM_HOME": str(home)}
    args = [
        sys.executable,
        "-m",
        "ssmlm",
        "pretrain",
        *recipe,
        "--name",
        "stop",
        *[x for s in sets for x in ("--set", s)],
    ]
    proc = subprocess.Popen(args, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = folder / "runs" / "stop" / "metrics.jsonl"
    first = None
    try:
        while proc.poll() is None:
            steps = train_steps(log)
            first = first if first is not None or not steps else steps[-1]
            if first is not None and steps[-1] >= first + after:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            raise SystemExit(f"the run ended before the signal: {proc.stdout.read()[-2000:]}")
        load = os.getloadavg()[0]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=600)[0]
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in out.splitlines() if ln.startswith(("interrupted:", "error:"))]
    if proc.returncode != 130 or len(lines) != 1 or not lines[0].startswith("interrupted:"):
        raise SystemExit(f"expected exit 130 and one interrupted: line, got {proc.returncode}: {lines}")
    if (folder / "runs" / "stop" / "loss.png").exists():
        raise SystemExit("a stopped run drew its loss plot")
    return {"seconds": took, "step": train_steps(log)[-1], "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?")
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--after", type=int, default=20, help="training steps logged past the first before SIGTERM")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    opts = parser.parse_args()
    print(machine_line())
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"  # one data cache, made by the first try
        for i in range(opts.tries):
            folder = Path(tmp) / f"try{i}"
            folder.mkdir()
            r = one_try([opts.recipe] if opts.recipe else [], opts.sets, opts.after, home, folder)
            times.append(r["seconds"])
            print(
                f"try {i + 1}: SIGTERM at step {r['step']} (load {r['load']:.1f}) -> exit 130 in {r['seconds']:.2f} s"
            )
    print(f"signal to exit: median {statistics.median(times):.2f} s, range {min(times):.2f}-{max(times):.2f} s")


if __name__ == "__main__":
    main()
