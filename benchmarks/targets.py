"""Every paper-size recipe compiled for its paper's hardware and for the slices a user would rent instead: the table
in docs/targets.md.

Each cell is `ssmlm pretrain RECIPE --dry-run --target TARGET --json` (ssmlm.train.aot) run as its own process (a
compile holds its memory until the process ends), and, where the recipe as shipped does not fit, the same with
--fit. Results go to a JSON file as they come (a killed run resumes: a cell already there is not compiled again);
--table renders the markdown table from it. The compile seconds are this machine's (a 2-core CPU here): what a
user of the command waits for, not a property of the target.

    python benchmarks/targets.py                          # all recipes x targets, then --fit where needed
    python benchmarks/targets.py --recipes bigs_full --targets paper,v5e-16
    python benchmarks/targets.py --table                  # only print the table of what is in the JSON
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from paired import machine_line  # noqa: E402

RECIPES = [
    "bigs_full", "bert_large", "stack_ssm", "gated_att", "bigs_12l",
    "gmlp_base", "gmlp_large", "gmlp_xlarge", "amlp_base", "amlp_large", "gmlp_depth144",
    "birdie_gated_ssm_1b4", "birdie_gated_ssm_plus_1b4", "birdie_hawk_1b4", "birdie_transformer_1b4",
]  # fmt: skip
TARGETS = ["paper", "v5p-8", "v5e-16", "h100-80gb:8"]
RESULTS = Path(__file__).resolve().parent.parent / "docs" / "targets.json"


def run_cell(recipe: str, target: str, fit: bool) -> dict:
    """One `ssmlm pretrain --dry-run --target` (``fit``: with --fit) as a process: its JSON, or its error line."""
    cmd = [sys.executable, "-m", "ssmlm", "pretrain", recipe, "--dry-run", "--target", target, "--json", "-q"]
    cmd += ["--fit"] if fit else []
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = round(time.perf_counter() - t0, 1)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        return {"error": lines[-1] if lines else done.stderr.strip().splitlines()[-1:], "wall_seconds": seconds}
    out = done.stdout
    return {**json.loads(out[out.index("{") :]), "wall_seconds": seconds}


def fits(cell: dict) -> bool:
    return "memory" in cell and cell["memory"]["fits"]


def gib(b) -> str:
    return "-" if b is None else f"{b / 2**30:.1f}"


def row_text(recipe: str, target: str, cell: dict, fitted: dict | None) -> str:
    """One markdown row: memory per chip as shipped and fit, the --fit setting, estimated tokens/s and MFU bound
    (of the fitting setting), compile seconds."""
    if "error" in cell:
        error = str(cell["error"]).removeprefix("error: ")
        if "records no paper hardware" in error:
            error = "the paper names no hardware"
        elif "must be divisible by the mesh" in error:
            error = f"no: the batch does not split ({error.split(' must')[0]} over the chips)"
        return f"| {recipe} | {target} | – | {error} | – | – | – | – |"
    m = cell["memory"]
    shipped = f"{gib(m['total'])} / {gib(m['hbm'])}" + ("" if "oom_message" not in m else " (XLA: temporaries)")
    name = cell["target"] if target != "paper" else f"paper: {cell['target']}"
    setting, est = "as shipped", cell["roofline"]
    if not m["fits"]:
        if fitted is None:
            setting, est = "(not searched)", None
        elif fitted.get("chosen") is None:
            setting, est = f"none fits: {fitted.get('why', fitted.get('error', ''))}", None
        else:
            setting = " ".join(o for o in fitted["overrides"] if not o.startswith("mesh.tensor=1"))
            est = fitted["report"]["roofline"]
    tokens = "–" if est is None else f"{est['tokens_per_second_at_most']:,.0f}"
    mfu = "–" if est is None else f"{est['mfu_at_most']:.0%} ({est['bound_by']})"
    return (
        f"| {recipe} | {name} | {shipped} | {'yes' if m['fits'] else 'no'} | {setting} | {tokens} | {mfu} | "
        f"{cell['compile_seconds']:.0f} |"
    )


def table(results: dict) -> str:
    head = (
        "| recipe | target | GiB per chip as shipped / HBM | fits | `--fit` setting | tokens/s ≤ (estimate) | "
        "MFU ≤ (bound) | compile s |\n|---|---|---|---|---|---|---|---|"
    )
    rows = [
        row_text(r, t, results["cells"][f"{r} @ {t}"], results["fits"].get(f"{r} @ {t}"))
        for r in RECIPES
        for t in TARGETS
        if f"{r} @ {t}" in results["cells"]
    ]
    return "\n".join([f"Measured {results['date']} on {results['machine']}.", "", head, *rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-fit", action="store_true", help="do not search settings where a recipe does not fit")
    ap.add_argument("--table", action="store_true", help="only print the table of the results file")
    args = ap.parse_args()
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {"cells": {}, "fits": {}}
    if not args.table:
        results.update(machine=machine_line(), date=time.strftime("%Y-%m-%d"))
        for recipe in args.recipes.split(","):
            for target in args.targets.split(","):
                key = f"{recipe} @ {target}"
                if key not in results["cells"]:
                    print(f"{key}: compiling ...", flush=True)
                    results["cells"][key] = run_cell(recipe, target, fit=False)
                    out.write_text(json.dumps(results, indent=1))
                cell = results["cells"][key]
                print(f"{key}: {'fits' if fits(cell) else cell.get('error', 'does not fit')}", flush=True)
                if not args.no_fit and "memory" in cell and not fits(cell) and key not in results["fits"]:
                    print(f"{key}: --fit ...", flush=True)
                    results["fits"][key] = run_cell(recipe, target, fit=True)
                    out.write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
