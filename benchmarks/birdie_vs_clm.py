"""Birdie's Figure 1 at CPU scale: runs experiments/birdie_fig1a.yaml or birdie_fig1b.yaml and plots every arm's
phone-book retrieval (the experiment's table has the intervals; this adds Fig. 1's curves).

    python benchmarks/birdie_vs_clm.py                  # Fig. 1A: Gated SSM+, Hawk, Transformer × CLM, Birdie
    python benchmarks/birdie_vs_clm.py --figure 1b      # Fig. 1B: CLM, UL2, Birdie-Causal, Birdie-Fixed, Birdie
    python benchmarks/birdie_vs_clm.py --seeds 1        # the first seed only (a quick look; more later reuse it)

Every run is an ordinary run directory under OUT/runs/ARM/seedS/ (OUT: runs/experiments/birdie_fig1a by
default), resumed and reused as `ssmlm experiment` does, so the same command continues after an interruption.
Writes OUT/results.{md,csv,json,png} (the experiment's) and OUT/phonebook-seedS.png (`analyze phonebook` of every
arm, one plot per seed, legends by arm).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = {"1a": ROOT / "experiments" / "birdie_fig1a.yaml", "1b": ROOT / "experiments" / "birdie_fig1b.yaml"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--figure", choices=sorted(FILES), default="1a")
    ap.add_argument("--out", default=None, help="output directory (default: runs/experiments/FILE_STEM)")
    ap.add_argument("--seeds", type=int, default=None, help="only the file's first N seeds")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    path = FILES[a.figure]
    out = Path(a.out or Path("runs") / "experiments" / path.stem).resolve()
    cmd = ["experiment", str(path), "--out", str(out), "--jobs", str(a.jobs)]
    cmd += ["--seeds", str(a.seeds)] if a.seeds else []
    print("$ ssmlm", " ".join(cmd), flush=True)
    rc = subprocess.run([sys.executable, "-m", "ssmlm", *cmd]).returncode
    results = out / "results.json"
    if not results.is_file():
        return rc or 1
    from ssmlm.analyze.phonebook import analyze_phonebook

    res = json.loads(results.read_text())
    seeds = res["seeds"]
    for seed in seeds:
        arms = {name: a["runs"].get(str(seed), a["runs"].get(seed)) for name, a in res["arms"].items()}
        done = {name: Path(r["finetune"]) for name, r in arms.items() if r and (Path(r["finetune"]) / "eval").is_dir()}
        if done:
            analyze_phonebook(list(done.values()), out / f"phonebook-seed{seed}", labels=list(done))
            print(f"wrote {out / f'phonebook-seed{seed}'}/phonebook.png")
    return rc


if __name__ == "__main__":
    sys.exit(main())
