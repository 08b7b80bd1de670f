"""Transfer on real text: prepares the data of experiments/transfer.yaml from your corpus, runs the experiment,
and draws where (if anywhere) the pretrained BiGS start overtakes random init as the pretraining budget grows.

    python benchmarks/transfer.py --corpus path/to/novels/ [--out runs/transfer] [--seeds 1] [--jobs 1]
    python benchmarks/transfer.py --corpus DIR --prepare-only       # only OUT/data (then run the file yourself)

The corpus is one document per .txt file (a directory, a glob or one file); paragraphs are blank-line separated
blocks. The first 80% of every document's paragraphs is the pretraining text (OUT/data/pretrain, cut into files
of ~2,000 words so that ssmlm's document-level validation split holds some out); the last 20% is held out: its
first half gives the validation examples, its second half the test examples, so that no finetuning example's
text was pretrained on and validation and test never share a paragraph. Tasks (OUT/data/tasks/TASK{,-val,-test}.jsonl):

    novels         which document a 40-80 word passage comes from (classes balanced by capping)
    order          original vs word-shuffled: plain narrative sentences of 6-30 words of the corpus
    builtin-order  the same on ssmlm's built-in examples (Python-docs prose); its validation split halved

Then `ssmlm experiment experiments/transfer.yaml --out OUT/experiment` runs with TRANSFER_DATA=OUT/data and
TRANSFER_CLASSES=the number of documents (SSMLM_HOME defaults to OUT/cache); every run resumes and finished runs
are reused, so the same command continues after an interruption. Last, OUT/budget.md and OUT/budget.png: per task,
BiGS's test accuracy at 200 / 800 / 3,200 pretraining steps against the random start, with 95% intervals.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "transfer.yaml"
TASKS = ("novels", "order", "builtin-order")
HOLDOUT = 0.2  # the last fraction of every document's paragraphs: never pretrained on (validation, then test)
PASSAGE_WORDS = (40, 80)
SENTENCE_WORDS = (6, 30)
PER_CLASS = {"train": 300, "validation": 100, "test": 100}  # novels passages per document
ORDER = {"train": 1000, "validation": 500, "test": 500}  # order sentences
BUDGETS = {200: "bigs-pretrained200", 800: "bigs-pretrained", 3200: "bigs-pretrained3200"}
ACCURACY = [0.0, 1.0]  # where the table and plot cut intervals (ssmlm.experiment.stats.cut)


# ----------------------------------------------------------------------------- corpus and tasks


def corpus_files(spec: str) -> list[Path]:
    p = Path(spec).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.txt") if f.is_file())
    elif p.is_file():
        files = [p]
    else:
        files = sorted(Path(f) for f in glob.glob(os.path.expanduser(spec), recursive=True) if f.endswith(".txt"))
    if not files:
        sys.exit(f"error: --corpus {spec!r}: no .txt files found")
    return files


def paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks, each with its wrapped lines joined by single spaces."""
    return [" ".join(block.split()) for block in re.split(r"\n[ \t]*\n", text) if block.strip()]


def is_heading(par: str) -> bool:
    """Chapter/volume headings and other all-capitals lines ('CHAPTER I', 'Chapter 1', 'THE END')."""
    words = par.split()
    return not re.search(r"[a-z]", par) or (len(words) <= 4 and re.match(r"(?i)(chapter|volume|book|part)\b", par))


def read_documents(files: list[Path]) -> dict[str, list[str]]:
    """Document label (the file stem, made unique) -> paragraphs."""
    docs: dict[str, list[str]] = {}
    for f in files:
        pars = paragraphs(f.read_text(encoding="utf-8-sig", errors="replace"))
        if len(pars) < 5:
            print(f"skipping {f}: fewer than 5 paragraphs")
            continue
        label, k = f.stem, 2
        while label in docs:
            label, k = f"{f.stem}-{k}", k + 1
        docs[label] = pars
    if not docs:
        sys.exit("error: --corpus: no document has at least 5 paragraphs")
    return docs


def passages(pars: list[str], lo: int = PASSAGE_WORDS[0], hi: int = PASSAGE_WORDS[1]) -> list[str]:
    """Passages of lo..hi words, in text order: consecutive short paragraphs are merged until they reach
    lo words; a block longer than hi words is cut into equal pieces (each then has lo..hi words)."""
    out, buf = [], []
    for par in pars:
        if is_heading(par):
            continue
        buf += par.split()
        if len(buf) < lo:
            continue
        k = -(-len(buf) // hi)  # pieces; len/k >= lo because len > hi*(k-1) and hi >= 2*lo
        bounds = [round(i * len(buf) / k) for i in range(k + 1)]
        out += [" ".join(buf[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]
        buf = []
    return out


SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[\"'A-Z])|(?<=[.!?][\"'])\s+(?=[\"'A-Z])")
ABBREVIATIONS = re.compile(r"(?:^|\s)(?:Mr|Mrs|Ms|Dr|St|Col|Capt|Gen|Lt|Rev|Sir|Esq|Messrs|[A-Z])\.$")
PLAIN_SENTENCE = re.compile(r"^[A-Z][^\"_]*[.!?]$")  # no dialogue quotes or _italics_ markers


def sentences(pars: list[str]) -> list[str]:
    """Plain narrative sentences of 6-30 words (as ssmlm's builtin-order keeps plain prose)."""
    lo, hi = SENTENCE_WORDS
    out = []
    for par in pars:
        if is_heading(par):
            continue
        merged: list[str] = []
        for piece in SENT_SPLIT.split(par):
            if merged and ABBREVIATIONS.search(merged[-1]):  # "Mrs. Bennet" is not two sentences
                merged[-1] += " " + piece
            else:
                merged.append(piece)
        out += [s for s in merged if lo <= len(s.split()) <= hi and PLAIN_SENTENCE.match(s)]
    return out


def order_rows(sents: list[str], n: int, rng: random.Random) -> list[dict]:
    """Half original (label 1), half word-shuffled (label 0), as ssmlm's builtin-order."""
    sents = [s for s in sents if len(set(s.split())) > 1]
    rng.shuffle(sents)
    rows = []
    for i, s in enumerate(sents[:n]):
        words, label = s.split(), (i + 1) % 2
        if label == 0:
            while words == s.split():
                rng.shuffle(words)
        rows.append({"sentence": " ".join(words), "label": label})
    return rows


def write_if_changed(path: Path, text: str) -> None:
    """Leave an identical file alone: ssmlm's preprocessing cache keys on file size and mtime."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_if_changed(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def split_document(pars: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(pretraining, validation, test) paragraphs: the first 80%, then the held-out 20% halved."""
    cut = int(len(pars) * (1 - HOLDOUT))
    mid = cut + (len(pars) - cut) // 2
    return pars[:cut], pars[cut:mid], pars[mid:]


def write_pretraining(parts: dict[str, list[str]], pre_dir: Path) -> tuple[int, int]:
    """Every document's first 80%, cut at paragraph boundaries into files of about 2,000 words."""
    total = sum(len(p.split()) for pars in parts.values() for p in pars)
    chunk = max(100, min(2000, total // 200))
    wanted = set()
    for label, pars in parts.items():
        buf, n, k = [], 0, 0
        for i, par in enumerate(pars):
            buf.append(par)
            n += len(par.split())
            if n >= chunk or i == len(pars) - 1:
                path = pre_dir / f"{label}-{k:04d}.txt"
                write_if_changed(path, "\n\n".join(buf) + "\n")
                wanted.add(path.name)
                buf, n, k = [], 0, k + 1
    for stale in pre_dir.glob("*.txt"):
        if stale.name not in wanted:
            stale.unlink()
    return total, len(wanted)


def prepare_data(docs: dict[str, list[str]], data_dir: Path) -> dict:
    """Write the pretraining text and the three tasks' train / validation / test files; returns their sizes."""
    splits = ("train", "validation", "test")
    parts = {k: dict(zip(splits, split_document(v), strict=True)) for k, v in docs.items()}
    words, files = write_pretraining({k: p["train"] for k, p in parts.items()}, data_dir / "pretrain")
    rows: dict[str, dict[str, list[dict]]] = {t: {} for t in TASKS}
    rng = random.Random(0)
    for split in splits:
        per = {k: passages(p[split]) for k, p in parts.items()}
        n = min(PER_CLASS[split], *map(len, per.values()))
        if n == 0:
            sys.exit(f"error: task novels ({split}): some document gives no {PASSAGE_WORDS[0]}+ word passage")
        rows["novels"][split] = [{"text": t, "label": k} for k, ps in per.items()
                                 for t in random.Random(f"{k}-{split}").sample(ps, n)]  # fmt: skip
        rng.shuffle(rows["novels"][split])
        sents = [s for p in parts.values() for s in sentences(p[split])]
        rows["order"][split] = order_rows(sents, ORDER[split], rng)
        if len(rows["order"][split]) < 64:
            sys.exit(f"error: task order ({split}): only {len(rows['order'][split])} sentences of {SENTENCE_WORDS} "
                     "words; the corpus is too small")  # fmt: skip
    from ssmlm.data.tasks import builtin_task

    b = builtin_task("builtin-order")
    b = {k: [dict(zip(v, r, strict=True)) for r in zip(*v.values(), strict=True)] for k, v in b.items()}
    half = len(b["validation"]) // 2
    rows["builtin-order"] = {"train": b["train"], "validation": b["validation"][:half], "test": b["validation"][half:]}
    info = {"documents": {k: len(v) for k, v in docs.items()}, "pretrain_words": words, "pretrain_files": files}
    for task, by_split in rows.items():
        for split, r in by_split.items():
            suffix = {"train": "", "validation": "-val", "test": "-test"}[split]
            write_jsonl(data_dir / "tasks" / f"{task}{suffix}.jsonl", r)
        labels = [r["label"] for r in by_split["train"]]
        top = Counter(labels).most_common(1)[0][0]
        info[task] = {split: len(r) for split, r in by_split.items()}
        info[task]["majority_test"] = sum(r["label"] == top for r in by_split["test"]) / len(by_split["test"])
    return info


# ----------------------------------------------------------------------------- the budget plot


def budget(results: dict, out: Path) -> str:
    """Per task: BiGS's test accuracy by pretraining steps (mean and 95% CI over seeds) against the random start."""
    from ssmlm.analyze.plots import pyplot, save_figure
    from ssmlm.experiment.stats import cut

    arms = results["arms"]
    lines = ["| task | random init | " + " | ".join(f"pretrained {s:,} steps" for s in BUDGETS) + " |",
             "|---|---:|" + "---:|" * len(BUDGETS)]  # fmt: skip
    plt = pyplot()
    fig, axes = plt.subplots(1, len(TASKS), figsize=(4 * len(TASKS), 3.4))
    for ax, task in zip(axes, TASKS, strict=True):
        rnd = arms.get(f"bigs-random-{task}", {}).get("interval")
        cells = [cell(rnd)]
        xs, ys, err = [], [], [[], []]
        for steps, prefix in BUDGETS.items():
            a = arms.get(f"{prefix}-{task}", {})
            iv, d = a.get("interval"), a.get("difference")
            cells.append(cell(iv) + (f"; Δ {100 * d['mean']:+.1f} [{diff_ci(d)}]" if d else ""))
            if iv:
                xs.append(steps)
                ys.append(100 * iv["mean"])
                c = cut(iv, ACCURACY) if iv.get("estimable", True) else {"low": None, "high": None}
                lo, hi = c["low"], c["high"]
                err[0].append(0 if lo is None else 100 * (iv["mean"] - lo))
                err[1].append(0 if hi is None else 100 * (hi - iv["mean"]))
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
        if rnd:
            c = cut(rnd, ACCURACY) if rnd.get("estimable", True) else {"low": None, "high": None}
            lo, hi = c["low"], c["high"]
            if lo is not None:
                ax.axhspan(100 * lo, 100 * hi, color="0.85", label="random init (95% CI)")
            ax.axhline(100 * rnd["mean"], color="0.4", ls="--", lw=1, label="random init (mean)")
        if xs:
            ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=4, color="tab:blue", label="pretrained (95% CI)")
        ax.set_xscale("log")
        ax.set_xticks(list(BUDGETS), [f"{s:,}" for s in BUDGETS])
        ax.set_xticks([], minor=True)  # the log axis's minor labels (3x10^2, ...) would overprint the budgets
        ax.set_xlabel("MLM pretraining steps (BiGS)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(task, fontsize=10)
    axes[0].legend(fontsize=8, loc="best")
    fig.tight_layout()
    save_figure(fig, out / "budget.png")
    table = "\n".join(lines) + "\n"
    (out / "budget.md").write_text(table)
    return table


def cell(iv: dict | None) -> str:
    """Mean [95% CI] in %, the interval cut at an accuracy's bounds (a t-interval over few seeds can pass them)."""
    from ssmlm.experiment.stats import cut

    if not iv:
        return "–"
    if not iv.get("estimable", True):  # fewer than 3 seeds, or no spread: the interval says nothing
        return f"{100 * iv['mean']:.1f} [not estimable: {iv['reason']}]"
    c = cut(iv, ACCURACY)
    lo, hi = c["low"], c["high"]
    if lo is None:
        return f"{100 * iv['mean']:.1f}"
    return f"{100 * iv['mean']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def diff_ci(d: dict) -> str:
    if not d.get("estimable", True):
        return f"not estimable: {d['reason']}"
    return "n = 1" if d["low"] is None else f"{100 * d['low']:+.1f}, {100 * d['high']:+.1f}"


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="directory, glob or file of .txt documents (one per file)")
    ap.add_argument("--out", default="runs/transfer", help="output directory (data, cache, the experiment's runs)")
    ap.add_argument("--seeds", type=int, default=None, help="only the experiment's first N seeds (a quick look)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (ssmlm experiment --jobs)")
    ap.add_argument("--prepare-only", action="store_true", help="write OUT/data and print the command, then stop")
    ap.add_argument("--dry-run", action="store_true", help="prepare the data and list the runs")
    a = ap.parse_args(argv)
    out = Path(a.out).expanduser().resolve()
    docs = read_documents(corpus_files(a.corpus))
    if len(docs) < 2:
        sys.exit("error: --corpus: task novels needs at least two documents")
    info = prepare_data(docs, out / "data")
    (out / "data" / "info.json").write_text(json.dumps(info, indent=2))
    print(f"pretraining text: {info['pretrain_words']:,} words in {info['pretrain_files']} files of "
          f"{len(docs)} documents")  # fmt: skip
    for t in TASKS:
        i = info[t]
        print(f"task {t}: {i['train']} train / {i['validation']} validation / {i['test']} test examples, "
              f"majority class {100 * i['majority_test']:.1f}% of test")  # fmt: skip
    env = {**os.environ, "TRANSFER_DATA": str(out / "data"), "TRANSFER_CLASSES": str(len(docs))}
    env.setdefault("SSMLM_HOME", str(out / "cache"))
    cmd = ["ssmlm", "experiment", str(EXPERIMENT), "--out", str(out / "experiment"), "--jobs", str(a.jobs)]
    cmd += ["--seeds", str(a.seeds)] if a.seeds else []
    cmd += ["--dry-run"] if a.dry_run else []
    shown = f"TRANSFER_DATA={env['TRANSFER_DATA']} TRANSFER_CLASSES={len(docs)} SSMLM_HOME={env['SSMLM_HOME']} "
    print("$", shown + " ".join(cmd), flush=True)
    if a.prepare_only:
        return 0
    rc = subprocess.run([sys.executable, "-m", "ssmlm", *cmd[1:]], env=env).returncode
    results = out / "experiment" / "results.json"
    if a.dry_run or rc == 130 or not results.is_file():  # 130: interrupted (results.json is the previous one)
        return rc
    print(budget(json.loads(results.read_text()), out))
    print(f"wrote {out / 'budget.md'} and {out / 'budget.png'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
