"""Transfer benchmark: does MLM pretraining on your own prose make finetuning better than random init?

For each family (BiGS, stack/ssm, gMLP, BERT) at about equal encoder parameter count, at the tiny size
of recipes/default.yaml (BiGS: 4 layers, d = 128, intermediate 384, 128 positions):

1. pretrain: MLM on the first 80% of every document's paragraphs (the default recipe, `--steps` steps);
2. random:   the same recipe for one step whose learning rate is exactly 0 (warmup_steps = 1 gives
             lr(0) = 0, and AdamW's decoupled weight decay is scaled by the lr), so the saved weights are
             the initialisation; the script checks them against a freshly built model of the same seed;
3. finetune both starts with identical settings (recipe finetune_default, batch 32, padding to the
   longest input, 128 tokens, `--epochs`, the same `--lrs` sweep) on:
     novels         which document (novel) a 40-80 word passage comes from; training passages from the
                    first 80% of each document, validation passages from the held-out last 20% (text no
                    model saw in pretraining, nor its tokenizer); classes balanced by capping;
     builtin-order  ssmlm's built-in task: original vs word-shuffled sentence (Python-docs prose; the
                    examples of `ssmlm.data.tasks.builtin_task`, written out once as JSONL);
     order          the same on the corpus: plain narrative sentences of 6-30 words, training ones from
                    the pretraining part, validation ones from the held-out part.

Sizes: the other families get BiGS's width and layer count (gMLP 1.5x the layers, its blocks being
thinner) and the intermediate size that matches BiGS's non-embedding parameter count (solved at start-up,
printed). With the current model code: stack/ssm and BERT (pre-LN, 4 heads) intermediate 576, gMLP (split
SGU, Toeplitz) 6 layers, intermediate 736; all within 0.3% of BiGS's 0.86M non-embedding parameters.

The corpus is one document per .txt file (a directory, a glob or one file); paragraphs are blank-line
separated blocks. Every number goes to OUT/transfer.json, the table to stdout and OUT/transfer.md.
Runs live in OUT/runs; a run whose directory already has summary.json is reused, so re-running after an
interruption redoes only unfinished runs (which ssmlm itself resumes from their last checkpoint).
SSMLM_HOME defaults to OUT/cache.

Cost (2 CPU cores): per family, finetuning costs about 1.5x its 800-step pretraining (novels 20%, builtin-order
14%, order 4% of it per run; 4 runs each), so the default run is about 10x one BiGS pretraining: ~40 min if
that takes 4 min. `--lrs` with one value halves the finetuning; `--quick` is a smoke run of a few minutes.

    python benchmarks/transfer.py --corpus path/to/novels/             # the full benchmark
    python benchmarks/transfer.py --corpus 'texts/*.txt' --quick --out /tmp/transfer-smoke
    python benchmarks/transfer.py --corpus DIR --families bigs,bert --tasks novels --lrs 3e-4
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import random
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FAMILIES = ("bigs", "stack_ssm", "gmlp", "bert")
TASKS = ("novels", "builtin-order", "order")
STARTS = ("pretrained", "random")
HOLDOUT = 0.2  # the last fraction of every document's paragraphs: never pretrained on
PASSAGE_WORDS = (40, 80)
SENTENCE_WORDS = (6, 30)

# The reference is BiGS at recipes/default.yaml's size; the others get the same width and the layer
# count below, and the intermediate size (a multiple of `step`) that matches BiGS's non-embedding count.
SIZES = {
    "full": {"hidden_size": 128, "max_seq_length": 128, "bigs_layers": 4, "bigs_intermediate": 384, "step": 32,
             "vocab_size": 8192, "num_ssm": 64, "num_heads": 4},
    "quick": {"hidden_size": 32, "max_seq_length": 64, "bigs_layers": 2, "bigs_intermediate": 96, "step": 8,
              "vocab_size": 1000, "num_ssm": 16, "num_heads": 2},
}  # fmt: skip
LAYERS = {"bigs": None, "stack_ssm": None, "bert": None, "gmlp": 1.5}  # None: BiGS's count; gMLP: 1.5x (narrower)
FAMILY_FIXED = {
    "bigs": {},
    "stack_ssm": {"stack_norm": "pre"},  # the default recipe's lr 2e-3 is too high for post-LN
    "bert": {"stack_norm": "pre"},
    "gmlp": {"sgu": "split_multiplicative", "spatial": "toeplitz"},
}


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


def split_document(pars: list[str]) -> tuple[list[str], list[str]]:
    cut = int(len(pars) * (1 - HOLDOUT))
    return pars[:cut], pars[cut:]


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


def majority(train_labels: list, val_labels: list) -> float:
    top = Counter(train_labels).most_common(1)[0][0]
    return sum(v == top for v in val_labels) / max(len(val_labels), 1)


def local_task(data_dir: Path, name: str, train: list[dict], val: list[dict], field: str, k: int) -> dict:
    """Write a task's JSONL files (the training file's stem is the task's name in ssmlm); its info and
    the finetuning overrides that select it."""
    paths = {"train": data_dir / "tasks" / f"{name}.jsonl", "validation": data_dir / "tasks" / f"{name}-val.jsonl"}
    write_jsonl(paths["train"], train)
    write_jsonl(paths["validation"], val)
    return {
        "num_labels": k,
        "train": len(train),
        "validation": len(val),
        "majority_baseline": majority([r["label"] for r in train], [r["label"] for r in val]),
        "files": {s: str(p) for s, p in paths.items()},
        "overrides": [f"task.train_file={json.dumps(str(paths['train']))}",
                      f"task.validation_file={json.dumps(str(paths['validation']))}",
                      f"task.text_fields=[{field}]", "task.label_field=label", f"task.num_labels={k}"],
    }  # fmt: skip


def prepare_data(docs: dict[str, list[str]], data_dir: Path, a, tasks: list[str]) -> dict:
    """Write the pretraining text (first 80% of every document) and the task files; returns task info."""
    rng = random.Random(0)
    train_parts = {k: split_document(v)[0] for k, v in docs.items()}
    held_parts = {k: split_document(v)[1] for k, v in docs.items()}

    # Pretraining text: every document's first 80%, cut at paragraph boundaries into files of about
    # `chunk` words, so that ssmlm's document-level validation split (data.validation_fraction of the
    # files, by hash) holds some of them out and the run reports a held-out MLM loss.
    pre_dir = data_dir / "pretrain"
    total = sum(len(p.split()) for pars in train_parts.values() for p in pars)
    chunk = max(100, min(2000, total // 200))
    wanted = set()
    for label, pars in train_parts.items():
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

    info: dict[str, dict] = {}
    if "novels" in tasks:
        if len(docs) < 2:
            sys.exit("error: task novels needs at least two documents in --corpus")
        tr = {k: passages(v) for k, v in train_parts.items()}
        va = {k: passages(v) for k, v in held_parts.items()}
        n_tr = min(a.per_class_train, *map(len, tr.values()))
        n_va = min(a.per_class_validation, *map(len, va.values()))
        if n_tr == 0 or n_va == 0:
            sys.exit(f"error: task novels: some document gives no {PASSAGE_WORDS[0]}+ word passage")
        rows = {"train": [], "validation": []}
        for split, per, n in (("train", tr, n_tr), ("validation", va, n_va)):
            for label, ps in per.items():
                rows[split] += [{"text": t, "label": label} for t in random.Random(f"{label}-{split}").sample(ps, n)]
            rng.shuffle(rows[split])
        info["novels"] = local_task(data_dir, "novels", rows["train"], rows["validation"], "text", len(docs))
        info["novels"].update(labels=sorted(docs), available_passages={k: [len(tr[k]), len(va[k])] for k in docs})
    if "order" in tasks:
        tr = order_rows([s for pars in train_parts.values() for s in sentences(pars)], a.order_train, rng)
        va = order_rows([s for pars in held_parts.values() for s in sentences(pars)], a.order_validation, rng)
        if len(tr) < 64 or len(va) < 16:
            sys.exit(f"error: task order: only {len(tr)} / {len(va)} sentences of {SENTENCE_WORDS} words")
        info["order"] = local_task(data_dir, "order", tr, va, "sentence", 2)
    if "builtin-order" in tasks:
        # ssmlm's own examples (Python-docs sentences), written out once: `task.name=builtin-order` would
        # harvest the standard library's docstrings again in every finetuning run (~10 s each).
        from ssmlm.data.tasks import builtin_task

        splits = builtin_task("builtin-order")
        rows = {k: [dict(zip(v, r, strict=True)) for r in zip(*v.values(), strict=True)] for k, v in splits.items()}
        if a.quick:  # a smoke run: as many examples as the order task's
            rows = {"train": rows["train"][: a.order_train], "validation": rows["validation"][: a.order_validation]}
        info["builtin-order"] = local_task(data_dir, "builtin-order", rows["train"], rows["validation"], "sentence", 2)
    held = sum(len(p.split()) for pars in held_parts.values() for p in pars)
    return {"pretrain_dir": str(pre_dir), "pretrain_files": len(wanted), "pretrain_words": total, "heldout_words": held,
            "tasks": info}  # fmt: skip


# ----------------------------------------------------------------------------- models


def param_counts(cfg) -> dict[str, int]:
    """Encoder parameters (with and without the embedding tables), built abstractly."""
    import jax
    from flax import nnx

    from ssmlm.models import build_mlm

    m = nnx.eval_shape(lambda: build_mlm(cfg))
    n = lambda mod: sum(x.size for x in jax.tree.leaves(nnx.state(mod, nnx.Param)))  # noqa: E731
    enc, emb = n(m.encoder), n(m.encoder.embeddings)
    return {"encoder": enc, "non_embedding": enc - emb, "mlm_model": n(m)}


def family_models(families: list[str], size: dict) -> dict[str, dict]:
    """model.* overrides per family: BiGS at the reference size, the others matched to its non-embedding
    parameter count by their intermediate size (layers: BiGS's, 1.5x for gMLP's thinner blocks)."""
    from ssmlm.recipe import ModelConfig

    d, layers = size["hidden_size"], size["bigs_layers"]
    common = {"hidden_size": d, "max_seq_length": size["max_seq_length"]}
    ssm = {"num_ssm": size["num_ssm"]}
    ref = {"arch": "bigs", "num_layers": layers, "intermediate_size": size["bigs_intermediate"], **common, **ssm}
    cfg = lambda m: ModelConfig(vocab_size=size["vocab_size"], **m)  # noqa: E731
    target = param_counts(cfg(ref))["non_embedding"]
    out = {}
    for fam in families:
        if fam == "bigs":
            out[fam] = ref
            continue
        base = {"arch": fam, "num_layers": round(layers * (LAYERS[fam] or 1)), **common, **FAMILY_FIXED[fam]}
        if fam == "bert":
            base["num_heads"] = size["num_heads"]
        if fam == "stack_ssm":
            base.update(ssm)
        # The count is linear in the intermediate size: solve, then take the better multiple of `step`.
        step = size["step"]
        count = lambda i, b=base: param_counts(cfg({**b, "intermediate_size": i}))["non_embedding"]  # noqa: E731
        c1, c2 = count(4 * step), count(8 * step)
        guess = 4 * step + (target - c1) * 4 * step / (c2 - c1)
        cands = {max(step, int(guess // step) * step), max(step, int(guess // step + 1) * step)}
        out[fam] = {**base, "intermediate_size": min(cands, key=lambda i: abs(count(i) - target))}
    return out


def same_as_fresh_init(run_dir: Path) -> bool:
    """Are a run's saved parameters exactly those of a freshly built model with its recipe and seed?"""
    import numpy as np
    from flax import nnx

    from ssmlm.models import build_mlm
    from ssmlm.runs import open_run

    run = open_run(run_dir)
    saved, _ = run.load_model()
    fresh = build_mlm(run.recipe.model, seed=run.recipe.train.seed)
    a = dict(nnx.to_flat_state(nnx.state(saved, nnx.Param)))
    b = dict(nnx.to_flat_state(nnx.state(fresh, nnx.Param)))
    return a.keys() == b.keys() and all(
        np.array_equal(np.asarray(a[k].get_value()), np.asarray(b[k].get_value())) for k in a
    )


# ----------------------------------------------------------------------------- runs


class Runner:
    """Runs (or reuses) ssmlm stages quietly and prints one line per finished run."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def __call__(self, stage: str, recipe, run_dir: Path, label: str, result) -> tuple[dict, float, bool]:
        from ssmlm.progress import console
        from ssmlm.train import drive

        self.done += 1
        t0 = time.time()
        path = run_dir / "summary.json"
        reused = path.is_file()
        if reused:
            summary = json.loads(path.read_text())
        else:
            quiet, console.quiet = console.quiet, True  # "initialised from ..." / "resuming ..." lines
            try:
                summary = getattr(drive, stage)(recipe, run_dir, quiet=True)
            finally:
                console.quiet = quiet
        dt = time.time() - t0
        how = "reused" if reused else fmt_time(dt)
        print(f"[{self.done:>3}/{self.total}] {label:<52} {result(summary):<22} {how}", flush=True)
        return summary, dt, reused


def fmt_time(s: float) -> str:
    return f"{int(s // 60)}m{s % 60:04.1f}s" if s >= 60 else f"{s:.1f}s"


def slug(x: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]", "_", x)


# ----------------------------------------------------------------------------- report


def machine() -> dict:
    import jax

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    dev = jax.devices()[0]
    return {"cpu": cpu, "cores": cores, "jax": jax.__version__, "python": platform.python_version(),
            "device": f"{len(jax.devices())} x {dev.platform} ({dev.device_kind})"}  # fmt: skip


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}"


def report(res: dict) -> str:
    tasks, fams = res["settings"]["tasks"], res["settings"]["families"]
    m = res["machine"]
    ep = res["settings"]["epochs"]
    lines = [
        "# Transfer: MLM pretraining on the corpus vs random init, then finetuning",
        "",
        f"Corpus: {res['settings']['corpus']} ({len(res['data']['documents'])} documents; pretraining on the first "
        f"{100 - int(100 * HOLDOUT)}% of each document's paragraphs, {res['data']['pretrain_words']:,} words; "
        f"{res['data']['heldout_words']:,} held-out words). Pretraining: {res['settings']['steps']} steps. "
        f"Finetuning: {ep:g} epoch{'' if ep == 1 else 's'}, batch 32, lr sweep {', '.join(res['settings']['lrs'])}.",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['device']}, jax {m['jax']}.",
        "",
        "Validation accuracy (%) after the last epoch, the best over the lr sweep (the lr in parentheses; "
        "selected on validation, the same rule and sweep for both starts). MLM loss: held-out MLM loss at the "
        "end of the run (for random init, the loss at initialisation).",
        "",
    ]
    head = ["family", "start", "encoder params (non-emb)", "MLM loss", *tasks]
    lines += ["| " + " | ".join(head) + " |", "|---|---|---:|---:|" + "---:|" * len(tasks)]
    for fam in fams:
        f = res["families"][fam]
        params = f"{f['params']['encoder']:,} ({f['params']['non_embedding']:,})"
        for start in STARTS:
            loss = f["mlm_loss"].get(start)
            cells = [f"{pct(b['accuracy'])} ({b['lr']})" for b in (res["best"][fam][t][start] for t in tasks)]
            lines.append(f"| {fam} | {start} | {params} | {'n/a' if loss is None else f'{loss:.3f}'} | "
                         + " | ".join(cells) + " |")  # fmt: skip
    base = [pct(res["tasks"][t]["majority_baseline"]) for t in tasks]
    lines.append("| majority class | | | | " + " | ".join(base) + " |")
    lines += ["", "Pretrained vs random init (best over the sweep on each side):", ""]
    for fam in fams:
        v = res["verdict"][fam]
        diffs = ", ".join(f"{t} {100 * d:+.1f}" for t, d in v["difference"].items())
        word = "beats" if v["pretrained_beats_random_on_every_task"] else "does NOT beat"
        lines.append(f"- {fam}: pretrained {word} random init on every task (points: {diffs})")
    lines += ["", "Every run (final validation accuracy %, best seen during training in parentheses):", ""]
    lrs = res["settings"]["lrs"]
    lines += ["| family | task | start | " + " | ".join(f"lr {lr}" for lr in lrs) + " |",
              "|---|---|---|" + "---:|" * len(lrs)]  # fmt: skip
    for fam in fams:
        for t in tasks:
            for start in STARTS:
                cells = []
                for lr in lrs:
                    r = res["runs"][f"{fam}/{t}/{start}/{lr}"]
                    cells.append(f"{pct(r['accuracy'])} ({pct(r['best_seen'])})")
                lines.append(f"| {fam} | {t} | {start} | " + " | ".join(cells) + " |")
    p = res["families"]
    lines += ["", "Models (encoder parameters include the embedding tables; vocabulary: the corpus's WordPiece):", ""]
    for fam in fams:
        c = p[fam]["config"]
        extra = ", ".join(f"{k} {v}" for k, v in c.items() if k not in ("arch", "hidden_size", "max_seq_length"))
        lines.append(f"- {fam}: d {c['hidden_size']}, {extra}; {p[fam]['params']['encoder']:,} encoder parameters, "
                     f"{p[fam]['params']['non_embedding']:,} without embeddings")  # fmt: skip
    tm = res["timings"]
    lines += ["", "Wall-clock this invocation (reused runs count ~0): " + ", ".join(
        f"{k} {fmt_time(v)}" for k, v in tm.items())]  # fmt: skip
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="directory, glob or file of .txt documents (one per file)")
    ap.add_argument("--out", default="runs/transfer", help="output directory (runs, data, cache, report)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--steps", type=int, default=None, help="pretraining steps (default 800; --quick: 30)")
    ap.add_argument("--lrs", default="1e-4,5e-4", help="finetuning learning rates (the same for both starts)")
    ap.add_argument("--epochs", type=float, default=None, help="finetuning epochs (default 3; --quick: 1)")
    ap.add_argument("--per-class-train", type=int, default=None, help="novels passages per class (default 300)")
    ap.add_argument("--per-class-validation", type=int, default=None, help="default 100")
    ap.add_argument("--order-train", type=int, default=None, help="order sentences for training (default 1000)")
    ap.add_argument("--order-validation", type=int, default=None, help="default 500")
    ap.add_argument("--keep-checkpoints", action="store_true", help="keep finetuning checkpoints (default: deleted)")
    ap.add_argument("--quick", action="store_true", help="tiny models, steps and data: a smoke run of minutes")
    a = ap.parse_args(argv)
    q = a.quick
    defaults = {"steps": (800, 30), "epochs": (3.0, 1.0), "per_class_train": (300, 40),
                "per_class_validation": (100, 20), "order_train": (1000, 256),
                "order_validation": (500, 128)}  # fmt: skip
    for k, (full, quick) in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, quick if q else full)
    a.families = [f.strip() for f in a.families.split(",") if f.strip()]
    a.tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    a.lrs = [x.strip() for x in a.lrs.split(",") if x.strip()]
    for f in a.families:
        if f not in FAMILIES:
            ap.error(f"--families: unknown family {f!r} (known: {', '.join(FAMILIES)})")
    for t in a.tasks:
        if t not in TASKS:
            ap.error(f"--tasks: unknown task {t!r} (known: {', '.join(TASKS)})")
    for lr in a.lrs:
        try:
            float(lr)
        except ValueError:
            ap.error(f"--lrs: {lr!r} is not a number")
    return a


def main(argv=None) -> dict:
    a = parse_args(argv)
    out = Path(a.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SSMLM_HOME", str(out / "cache"))
    import jax

    if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # both starts share shapes: compile once per shape
        jax.config.update("jax_compilation_cache_dir", str(out / "cache" / "jax"))
    from ssmlm.recipe import load_recipe

    t_all = time.time()
    timings: dict[str, float] = {}
    mach = machine()
    print(f"machine: {mach['cpu']}; {mach['cores']} cores; {mach['device']}; jax {mach['jax']}")

    # --- data
    t0 = time.time()
    files = corpus_files(a.corpus)
    docs = read_documents(files)
    size = SIZES["quick" if a.quick else "full"]
    # Run directories are named by their own settings (steps, lr, epochs); what they all share (the
    # corpus text, the task files, the model sizes) is fingerprinted, and another one needs another --out.
    # Checked before any file in OUT/data is rewritten.
    fixed = {"files": [str(f.resolve()) for f in files], "size": size,
             "text": hashlib.sha256(json.dumps(docs, sort_keys=True).encode()).hexdigest()[:16],
             "caps": [a.per_class_train, a.per_class_validation, a.order_train, a.order_validation]}  # fmt: skip
    fp_path = out / "fingerprint.json"
    if fp_path.is_file():
        old = json.loads(fp_path.read_text())
        if {k: old.get(k) for k in fixed} != fixed:
            sys.exit(f"error: {out} holds runs made from another corpus, size or task caps; pass another --out")
    fp_path.write_text(json.dumps(fixed, indent=2))
    data = prepare_data(docs, out / "data", a, a.tasks)
    data["documents"] = {k: len(v) for k, v in docs.items()}
    settings = {
        "corpus": a.corpus,
        "corpus_files": [str(f.resolve()) for f in files],
        "quick": a.quick,
        "size": size,
        "families": a.families,
        "tasks": a.tasks,
        "steps": a.steps,
        "lrs": a.lrs,
        "epochs": a.epochs,
        "per_class_train": a.per_class_train,
        "per_class_validation": a.per_class_validation,
        "order_train": a.order_train,
        "order_validation": a.order_validation,
    }
    for t in a.tasks:
        i = data["tasks"][t]
        print(f"task {t}: {i['num_labels']} classes, {i['train']} train / {i['validation']} validation examples, "
              f"majority baseline {pct(i['majority_baseline'])}%")  # fmt: skip
    print(f"pretraining text: {data['pretrain_words']:,} words in {data['pretrain_files']} files; "
          f"held out: {data['heldout_words']:,} words")  # fmt: skip
    models = family_models(a.families, size)
    timings["data"] = time.time() - t0

    n_runs = len(a.families) * (2 + len(a.tasks) * len(STARTS) * len(a.lrs))
    runner = Runner(n_runs)
    runs_dir = out / "runs"
    fams: dict[str, dict] = {}
    results: dict[str, dict] = {}
    timings.update(pretrain=0.0, random_init=0.0, finetune=0.0)

    for fam in a.families:
        cfg = models[fam]
        base = [f"data.source={json.dumps(data['pretrain_dir'])}", f"data.vocab_size={size['vocab_size']}",
                *(f"model.{k}={v}" for k, v in cfg.items())]  # fmt: skip
        if a.quick:
            base += ["train.batch_size=16", "train.log_every=5", "objective.duplicate_factor=2"]
        starts = {}
        # --- MLM pretraining on the first 80%
        t0 = time.time()
        r = load_recipe("default", [*base, f"name=transfer-{fam}", f"train.steps={a.steps}"])
        d = runs_dir / f"pt-{fam}-{a.steps}steps"
        s, _, _ = runner("pretrain", r, d, f"pretrain {fam} ({a.steps} steps)", mlm_line)
        starts["pretrained"] = (d, (s.get("validation") or {}).get("mlm_loss"))
        timings["pretrain"] += time.time() - t0
        # --- random init: one step at learning rate 0
        t0 = time.time()
        r = load_recipe("default", [*base, f"name=transfer-{fam}-random", "train.steps=1", "train.warmup_steps=1"])
        d = runs_dir / f"pt-{fam}-random"
        s, _, _ = runner("pretrain", r, d, f"random init {fam} (1 step at lr 0)", mlm_line)
        starts["random"] = (d, (s.get("validation") or {}).get("mlm_loss"))
        if not same_as_fresh_init(d):
            raise RuntimeError(f"{d}: the random-init run's parameters differ from a fresh initialisation")
        timings["random_init"] += time.time() - t0
        from ssmlm.runs import open_run

        run = open_run(starts["pretrained"][0])
        fams[fam] = {
            "config": cfg,
            "params": param_counts(run.recipe.model),
            "vocab_size": run.recipe.model.vocab_size,
            "mlm_loss": {k: v[1] for k, v in starts.items()},
            "random_init_equals_fresh_init": True,
            "runs": {k: str(v[0]) for k, v in starts.items()},
        }
        # --- finetuning, both starts, the same settings
        t0 = time.time()
        for task in a.tasks:
            for start, (src, _) in starts.items():
                for lr in a.lrs:
                    ft = [f"train.init_from={json.dumps(str(src))}", *data["tasks"][task]["overrides"],
                          "task.padding=longest", f"task.max_seq_length={cfg['max_seq_length']}",
                          f"train.epochs={a.epochs}", "train.batch_size=32", f"train.learning_rate={lr}"]  # fmt: skip
                    r = load_recipe("finetune_default", ft)
                    d = runs_dir / f"ft-{fam}-{start}-{task}-lr{slug(lr)}-ep{a.epochs:g}"
                    s, dt, reused = runner("finetune", r, d, f"finetune {fam}/{start} {task} lr {lr}", acc_line)
                    if not a.keep_checkpoints:
                        shutil.rmtree(d / "checkpoints", ignore_errors=True)
                    best = s.get("best_validation") or {}
                    results[f"{fam}/{task}/{start}/{lr}"] = {
                        "family": fam, "task": task, "start": start, "lr": lr,
                        "accuracy": (s.get("validation") or {}).get("accuracy"), "best_seen": best.get("accuracy"),
                        "steps": s.get("final_step"), "seconds": round(dt, 1), "reused": reused, "run": str(d),
                    }  # fmt: skip
        timings["finetune"] += time.time() - t0

    best: dict = {}
    verdict: dict = {}
    for fam in a.families:
        best[fam] = {}
        for t in a.tasks:
            best[fam][t] = {}
            for start in STARTS:
                cands = [results[f"{fam}/{t}/{start}/{lr}"] for lr in a.lrs]
                top = max(cands, key=lambda r: -1.0 if r["accuracy"] is None else r["accuracy"])
                best[fam][t][start] = {"accuracy": top["accuracy"], "lr": top["lr"]}
        diff = {t: (best[fam][t]["pretrained"]["accuracy"] or 0.0) - (best[fam][t]["random"]["accuracy"] or 0.0)
                for t in a.tasks}  # fmt: skip
        verdict[fam] = {"pretrained_beats_random_on_every_task": all(v > 0 for v in diff.values()), "difference": diff}
    timings["total"] = time.time() - t_all
    res = {
        "machine": mach,
        "settings": settings,
        "data": {k: v for k, v in data.items() if k != "tasks"},
        "tasks": {k: {kk: vv for kk, vv in v.items() if kk != "overrides"} for k, v in data["tasks"].items()},
        "families": fams,
        "runs": results,
        "best": best,
        "selection": "per (family, task, start): the lr whose final validation accuracy is highest; the same "
        "rule and sweep for both starts",
        "verdict": verdict,
        "timings": {k: round(v, 1) for k, v in timings.items()},
    }
    md = report(res)
    (out / "transfer.json").write_text(json.dumps(res, indent=2))
    (out / "transfer.md").write_text(md)
    print()
    print(md)
    print(f"wrote {out / 'transfer.md'} and {out / 'transfer.json'}")
    return res


def mlm_line(s: dict) -> str:
    loss = (s.get("validation") or {}).get("mlm_loss")
    return "mlm_loss n/a" if loss is None else f"mlm_loss {loss:.3f}"


def acc_line(s: dict) -> str:
    acc = (s.get("validation") or {}).get("accuracy")
    return "accuracy n/a" if acc is None else f"accuracy {100 * acc:.1f}%"


if __name__ == "__main__":
    from ssmlm.errors import UserError

    try:
        main()
    except UserError as e:  # ssmlm's one-line errors (a bad value, Ctrl-C with a checkpoint written)
        sys.exit(f"error: {e}\nre-running the same command resumes; finished runs are reused")
    except KeyboardInterrupt:
        sys.exit("interrupted; re-running the same command resumes; finished runs are reused")
