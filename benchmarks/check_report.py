"""Look at `ssmlm analyze report` pages as a person would: open each in headless Chromium, check it, save a
screenshot of the whole page.

    python benchmarks/check_report.py runs/gmlp_base                       # a run: build its report, then look
    python benchmarks/check_report.py runs/a/analysis/index.html --out shots
    python benchmarks/check_report.py --demo /tmp/report-demo              # build three tiny runs first

Each argument is a run directory (its report is built into RUN/analysis first) or a report's index.html. Per page
it prints one JSON line: images (how many, which did not load), the parts in the order the browser lays them
out, anything wider than the window (cut off at the right), the page height and the screenshot's path (default:
report.png beside the page; --out DIR: DIR/NAME.png). ``--demo DIR`` trains three tiny runs on generated text
first (a BiGS MLM pretrain, a Birdie-mixture gated-SSM LM with its controller, and a small LM finetuned and
evaluated on phone books), about 4 minutes on 2 CPU cores, and reports on each and on all three together.

Exit status 0 when every page passed, 1 when an image did not load or something is wider than the window (each is
named), 2 when no Chromium could be run. Needs Chromium on PATH (Debian: `apt-get install -y chromium`) or
--browser.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from pathlib import Path

import yaml

WORDS = {
    "who": ["the miller", "a young clerk", "my aunt", "the captain", "our cook", "the old priest", "a tired horse"],
    "did": ["carried", "painted", "forgot", "admired", "mended", "sold", "described"],
    "what": ["the blue door", "a letter", "the heavy basket", "an umbrella", "the new fence", "a song"],
    "when": ["at dawn", "on Sunday", "after supper", "in the snow", "before the fair", "without a word"],
}


def sentences(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS[k]) for k in WORDS).capitalize() + "." for _ in range(n)) + "\n"


def demo(root: Path) -> list[Path]:
    """Train the three tiny runs under root (reused when already there) and return their directories."""
    from ssmlm.cli import app

    corpus = root / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i in range(40):
        (corpus / f"doc{i:02d}.txt").write_text(sentences(30, i))
    runs = root / "runs"
    lm = {"arch": "gated_ssm", "hidden_size": 32, "num_layers": 2, "state_size": 32}
    controller = {"eval_scale": 0.04, "validation_rows": 1, "proposals": 64, "grok_iterations": 5, "width": 16,
                  "state_size": 16, "layers": 1}  # fmt: skip
    recipes = {
        "bigs": {"base": "default", "name": "bigs",
                 "model": {"hidden_size": 16, "num_layers": 2, "intermediate_size": 32, "num_ssm": 8,
                           "max_seq_length": 32},
                 "data": {"source": str(corpus), "vocab_size": 150}, "objective": {"duplicate_factor": 1},
                 "train": {"steps": 40, "batch_size": 8, "log_every": 2, "eval_every": 20, "checkpoint_every": 0}},
        "birdie": {"base": "lm_tiny", "name": "birdie", "model": {**lm, "max_seq_length": 128},
                   "data": {"source": str(corpus), "vocab_size": 400},
                   "objective": {"mixture": "birdie", "min_sample_space": 16, "controller": controller},
                   "train": {"steps": 40, "batch_size": 4, "log_every": 2, "eval_every": 0, "eval_batches": 1,
                             "checkpoint_every": 20}},
        "clm": {"base": "lm_tiny", "name": "clm", "model": {**lm, "max_seq_length": 96},
                "data": {"source": str(corpus), "vocab_size": 400}, "objective": {"mixture": "clm"},
                "train": {"steps": 6, "batch_size": 4, "log_every": 1, "eval_every": 3, "eval_batches": 2,
                          "checkpoint_every": 3}},
        "phonebook": {"base": "phonebook_tiny",
                      "task": {"max_seq_length": 256, "phonebook": {"train_books": 24, "validation_books": 6,
                                                                    "entries": [2, 5], "queries": [1, 2]}},
                      "train": {"steps": 6, "batch_size": 4, "eval_every": 3, "checkpoint_every": 0,
                                "log_every": 1}},
    }  # fmt: skip
    for name, recipe in recipes.items():
        recipe["train"]["out_dir"] = str(runs)
        (root / f"{name}.yaml").write_text(yaml.safe_dump(recipe))

    def ssmlm(*args) -> None:
        print("ssmlm", *args, file=sys.stderr)
        with contextlib.redirect_stdout(sys.stderr):  # stdout holds one JSON line per page
            app([str(a) for a in args], standalone_mode=False)

    for name in ("bigs", "birdie", "clm"):
        if not (runs / name / "summary.json").is_file():
            ssmlm("pretrain", root / f"{name}.yaml", "-q")
    ft = runs / "clm-phonebook"
    if not (ft / "summary.json").is_file():
        ssmlm("finetune", "--ckpt", runs / "clm", "--task", "phonebook", "--recipe", root / "phonebook.yaml", "-q")
    if not (ft / "eval" / "phonebook-validation.json").is_file():
        ssmlm("evaluate", "--ckpt", ft, "--task", "phonebook", "--limit", 6)
    return [runs / "bigs", runs / "birdie", ft]


def page_of(target: Path, out: Path | None = None) -> Path:
    """A report page: the given index.html, or the report built for a run directory."""
    from ssmlm.analyze.report import build_report

    if target.is_file():
        return target
    if not (target / "run.json").is_file():
        raise SystemExit(f"{target}: neither a report page nor a run directory (no run.json)")
    return Path(build_report([target], out or target / "analysis", quiet=False)["page"])


def main() -> int:
    from page_check import find_browser, screenshot  # beside this script (its directory is on sys.path)

    from ssmlm.analyze.report import build_report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", type=Path, help="run directories or report pages (index.html)")
    parser.add_argument("--demo", type=Path, metavar="DIR", help="train three tiny runs in DIR and look at them")
    parser.add_argument("--out", type=Path, metavar="DIR", help="where the screenshots go (default: beside each page)")
    parser.add_argument("--browser", help="Chromium executable (default: the first of chromium, ... on PATH)")
    parser.add_argument("--width", type=int, default=1280, help="window width in px (default 1280)")
    args = parser.parse_args()
    browser = args.browser or find_browser()
    if browser is None:
        print("no Chromium on PATH (apt-get install -y chromium), or give --browser", file=sys.stderr)
        return 2
    pages = [page_of(t) for t in args.targets]
    if args.demo:
        runs = demo(args.demo)
        pages += [page_of(r, args.demo / "reports" / r.name) for r in runs]
        pages.append(Path(build_report(runs, args.demo / "reports" / "all", quiet=False)["page"]))
    if not pages:
        parser.error("give a run directory, a report page or --demo DIR")
    failed = 0
    for page in pages:
        name = page.parent.name if page.name == "index.html" else page.stem
        png = (args.out / f"{name}.png") if args.out else page.with_name("report.png")
        try:
            found = screenshot(page, png, browser, args.width)
        except (OSError, RuntimeError) as e:
            print(f"{page}: {e}", file=sys.stderr)
            return 2
        found["parts"] = [p["part"] for p in found["parts"]]
        print(json.dumps({"page": str(page), **found}))
        problems = [f"image did not load: {b}" for b in found["broken"]] + [
            f"wider than the window: {w}" for w in found["too_wide"]
        ]
        if not found["images"]:
            problems.append("no images")
        for p in problems:
            print(f"{page}: {p}", file=sys.stderr)
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
