"""`analyze adversarial`: the distractor variant of a sentence-pair task (BiGS Table 4, QNLI).

The paper adds "distractor phrases, chosen to be non-ambiguous, in between the hypothesis (H) and premise (P)"
of QNLI examples on which the stack and the gated SSM model predict the same label, and compares accuracy on
"H P" with "H ~ P". It names neither the phrases nor how many tokens they add; here:

* Distractors are content-free filler phrases ("as a matter of fact", "needless to say", ...: `FILLERS`), which
  carry no fact that could answer a question or change an entailment, i.e. non-ambiguous by construction.
* For example i (its index in the split) and seed s, the filler stream is `FILLERS` shuffled by
  ``random.Random(s * 1_000_003 + i)``, reshuffled and appended until long enough, joined by spaces and
  tokenized without special tokens. The distractor at distance D is the first D tokens of that stream, so the
  distractors of one example are nested across distances and the same for every run that shares a tokenizer.
* The D tokens are spliced in at the start of the second segment (right after the [SEP] that closes H, with
  token type 1): H and P are pushed apart by exactly D tokens; nothing else of the input changes.
* Only examples whose plain input plus the largest D fits the run's length are scored (for every run given),
  so every distance scores the same examples and nothing is truncated away. With several runs, ``--agreed``
  (the default then) keeps only the examples on which all runs predict the same label on the plain input: the
  paper's subset. Distance 0 is the plain input: its accuracy is the run's accuracy on the kept examples.
* Default distances: 0, 8, 16, 32, 64, those at most half the (shortest) run's length, so that at 128 tokens
  (GLUE) all five are scored and most QNLI examples still fit.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.analyze.plots import write_csv
from ssmlm.errors import UserError
from ssmlm.markdown import markdown_table

NAME = "adversarial"
FIGURE = "BiGS Table 4"
DEFAULT_DISTANCES = (0, 8, 16, 32, 64)
COLUMNS = ("run", "arch", "task", "split", "distance", "inserted_tokens", "n", "correct", "accuracy")
FILLERS = (
    "as a matter of fact",
    "needless to say",
    "it goes without saying",
    "at the end of the day",
    "for what it is worth",
    "in a manner of speaking",
    "all things considered",
    "by and large",
    "more or less",
    "so to speak",
    "to be honest",
    "in any case",
    "on the whole",
    "generally speaking",
    "as it happens",
    "in other words",
    "believe it or not",
    "for the most part",
    "when all is said and done",
    "as one might expect",
)


def command(
    ckpt: Annotated[
        list[str], typer.Option("--ckpt", metavar="RUN", help="Finetuned sentence-pair classifier (repeat).")
    ],
    distances: Annotated[
        str | None,
        typer.Option(
            "--distances",
            help="Distractor lengths D in tokens (0 = the plain input). Default: 0,8,16,32,64, those at most "
            "half the run's length.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the distractor phrases' order.")] = 0,
    agreed: Annotated[
        bool | None,
        typer.Option("--agreed/--all", help="Keep only examples all runs label alike (default: with 2+ runs)."),
    ] = None,
    split: Annotated[str, typer.Option("--split", help="Split to score (needs labels).")] = "validation",
    data_dir: Annotated[
        str | None, typer.Option("--data-dir", help="Task files in the benchmark's own layout (as `evaluate`).")
    ] = None,
    validation_file: Annotated[
        str | None, typer.Option("--validation-file", help="Local validation file (as `evaluate`).")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 32,
    out: Annotated[
        str | None, typer.Option("--out", metavar="DIR", help="Output directory (default: FIRST_RUN/analysis).")
    ] = None,
):
    """Score a sentence-pair classifier with distractor phrases inserted between its two texts (BiGS Table 4).

    For each distance D, D filler tokens go between the first text (QNLI's question) and the second (its
    sentence); the phrases' order is reproducible from the seed. Accuracy per run and distance goes to
    adversarial.csv, adversarial.png and adversarial.md (the paper's table layout).
    Example: ssmlm analyze adversarial --ckpt runs/bigs-qnli --ckpt runs/stack-qnli --data-dir glue
    """
    checks.option("--batch-size", batch_size, checks.POSITIVE)
    for c in ckpt:
        checks.run_dir(c, "--ckpt")
    dists = parse_distances(distances) if distances else None
    from ssmlm.runs import open_run

    runs = [open_run(c) for c in ckpt]
    out_dir = Path(out) if out else runs[0].dir / "analysis"
    result = analyze_adversarial(runs, out_dir, dists, seed, agreed, split, data_dir, validation_file, batch_size)
    return result  # printed by the CLI: tables, or JSON with --json


def parse_distances(text: str) -> tuple[int, ...]:
    try:
        dists = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--distances '{text}': expected comma-separated token counts, e.g. 0,8,16,32") from None
    if not dists or any(d < 0 for d in dists) or len(set(dists)) < len(dists):
        raise UserError(f"--distances '{text}': expected distinct token counts >= 0, e.g. 0,8,16,32")
    return tuple(sorted(dists))


# ----------------------------------------------------------------------------- the construction


def distractor_ids(tokenizer, distance: int, seed: int, index: int) -> list[int]:
    """The first ``distance`` tokens of example ``index``'s filler stream (see the module doc)."""
    rng = random.Random(seed * 1_000_003 + index)
    ids: list[int] = []
    while len(ids) < distance:
        phrases = list(FILLERS)
        rng.shuffle(phrases)
        ids += tokenizer.encode(" ".join(phrases), add_special_tokens=False).ids
    return ids[:distance]


def second_segment_start(arrays: dict, row: int) -> int:
    """Position of the first token of the second text (the first token with token type 1)."""
    import numpy as np

    types = arrays["token_type_ids"][row] * arrays["attention_mask"][row]
    starts = np.flatnonzero(types == 1)
    if not len(starts):
        raise UserError("adversarial needs a sentence-pair task (two text fields); this row has one segment")
    return int(starts[0])


def with_distractors(arrays: dict, tokenizer, distance: int, seed: int, index=None) -> dict:
    """``arrays`` (encoded rows) with ``distance`` distractor tokens spliced in before each row's second text.

    ``index``: each row's example index in its split (default 0..N-1), which picks its distractor. Every row
    must have room: real length + distance <= width.
    """
    import numpy as np

    n, width = arrays["input_ids"].shape
    index = np.arange(n) if index is None else np.asarray(index)
    out = {k: v.copy() for k, v in arrays.items()}
    if distance == 0:
        return out
    for k in ("input_ids", "token_type_ids", "attention_mask"):
        out[k][:] = 0
    for row in range(n):
        length = int(arrays["attention_mask"][row].sum())
        if length + distance > width:
            raise ValueError(f"row {row}: {length} tokens + {distance} distractor tokens exceed the width {width}")
        b = second_segment_start(arrays, row)
        dist = distractor_ids(tokenizer, distance, seed, int(index[row]))
        ids, types = arrays["input_ids"][row, :length], arrays["token_type_ids"][row, :length]
        out["input_ids"][row, : length + distance] = np.concatenate([ids[:b], dist, ids[b:]])
        out["token_type_ids"][row, : length + distance] = np.concatenate([types[:b], np.ones(distance), types[b:]])
        out["attention_mask"][row, : length + distance] = 1
    return out


# ----------------------------------------------------------------------------- the analysis


def _plain(run, split, data_dir, validation_file) -> dict:
    """A run's plain encoding of ``split``, padded to its full length (room for the distractors)."""
    from ssmlm.analyze.length_bins import task_data
    from ssmlm.data.tasks import encode

    data, max_len, _ = task_data(run, data_dir, validation_file)
    td = data.definition
    if len(td.text_fields) != 2:
        raise UserError(f"{run.dir}: task {td.name} has one text field {list(td.text_fields)}; adversarial needs two")
    if split not in data.splits or td.label_field not in data.splits[split]:
        raise UserError(f"task {td.name}: no labelled '{split}' split (has {list(data.splits)})")
    arrays = encode(data, split, run.tokenizer(), max_len, "max_length")
    return {"arrays": arrays, "task": td.name, "max_len": max_len}


def analyze_adversarial(
    runs,
    out_dir: Path,
    distances=None,
    seed: int = 0,
    agreed: bool | None = None,
    split="validation",
    data_dir=None,
    validation_file=None,
    batch_size=32,
) -> dict:
    import numpy as np

    from ssmlm.analyze.length_bins import predict

    if not runs:
        raise UserError("--ckpt: give at least one finetuned run")
    if len({r.dir.name for r in runs}) < len(runs):
        raise UserError("--ckpt: two runs share a directory name; give runs with distinct names")
    agreed = len(runs) > 1 if agreed is None else agreed
    plain = {r.dir.name: _plain(r, split, data_dir, validation_file) for r in runs}
    counts = {len(p["arrays"]["labels"]) for p in plain.values()}
    if len(counts) > 1:
        raise UserError(f"--ckpt: the runs' '{split}' splits differ in size ({sorted(counts)}); give runs of one task")
    n_all = counts.pop()
    if distances is None:  # room for the distractor and most examples at the shortest run's length
        half = min(p["max_len"] for p in plain.values()) // 2
        distances = tuple(d for d in DEFAULT_DISTANCES if d <= half)
    top = max(distances)
    fits = np.ones(n_all, bool)  # room for the longest distractor in every run's encoding
    for p in plain.values():
        fits &= p["arrays"]["attention_mask"].sum(1) + top <= p["max_len"]
    models = {r.dir.name: r.load_model()[0] for r in runs}
    keep = fits
    if agreed:
        base = [predict(r, plain[r.dir.name]["arrays"], batch_size, models[r.dir.name]) for r in runs]
        keep = fits & np.all([b == base[0] for b in base], axis=0)
    index = np.flatnonzero(keep)
    if not len(index):
        raise UserError(f"no example of '{split}' fits {top} more tokens (and is labelled alike by every run)")
    table = []
    for r in runs:
        p = plain[r.dir.name]
        arrays = {k: v[index] for k, v in p["arrays"].items()}
        tok = r.tokenizer()
        for d in distances:
            preds = predict(r, with_distractors(arrays, tok, d, seed, index), batch_size, models[r.dir.name])
            ok = int((preds == arrays["labels"]).sum())
            table.append(
                {
                    "run": r.dir.name,
                    "arch": r.recipe.model.arch,
                    "task": p["task"],
                    "split": split,
                    "distance": d,
                    "inserted_tokens": d,
                    "n": len(index),
                    "correct": ok,
                    "accuracy": ok / len(index),
                }
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "adversarial.csv"
    write_csv(csv_path, COLUMNS, table)
    first = runs[0]
    examples = out_dir / "adversarial_examples.json"  # what the distractors look like, for reading
    tok = first.tokenizer()
    shown = [{"index": int(i), "distractor": tok.decode(distractor_ids(tok, top, seed, int(i)))} for i in index[:5]]
    examples.write_text(json.dumps({"seed": seed, "distance": top, "examples": shown}, indent=2))
    png = plot(table, out_dir / "adversarial.png", agreed)
    md = out_dir / "adversarial.md"
    md.write_text(markdown(table))
    return {
        "plot": str(png),
        "data": str(csv_path),
        "examples": str(examples),
        "table": str(md),
        "seed": seed,
        "examples_scored": len(index),
        "examples_in_split": n_all,
        "agreed_only": agreed,
        "accuracy": {name: {r["distance"]: r["accuracy"] for r in table if r["run"] == name} for name in models},
    }


def markdown(table: list[dict]) -> str:
    """The paper's layout: one row per run, accuracy (%) on H P (D = 0) and on H ~ P at each D > 0."""
    dists = sorted({r["distance"] for r in table})
    head = ["Run", "Arch", *[("H P" if d == 0 else f"H ~ P, D={d}") for d in dists]]
    rows = []
    for name in dict.fromkeys(r["run"] for r in table):
        mine = {r["distance"]: r for r in table if r["run"] == name}
        rows.append([name, mine[dists[0]]["arch"], *[f"{100 * mine[d]['accuracy']:.1f}" for d in dists]])
    lines = markdown_table(head, rows)
    note = f"{table[0]['task']} {table[0]['split']}, {table[0]['n']} examples; D: distractor tokens between H and P."
    return "\n".join(lines) + f"\n\n{note}\n"


def plot(table: list[dict], out: Path, agreed: bool) -> Path:
    """Accuracy (%) against distractor length, one line per run (the paper's H P vs H ~ P, at several D)."""
    from ssmlm.analyze.plots import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for k, name in enumerate(dict.fromkeys(r["run"] for r in table)):
        mine = [r for r in table if r["run"] == name]
        style = ("o-", "s--", "^:", "D-.")[k % 4]  # runs that agree everywhere draw on top of each other
        ax.plot(
            [r["distance"] for r in mine],
            [100 * r["accuracy"] for r in mine],
            style,
            markersize=7 - k,
            label=f"{name} ({mine[0]['arch']})",
        )
    ax.set_xlabel("distractor tokens inserted between the two texts (D)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 105)
    which = "examples all runs label alike" if agreed else "examples, all that fit"
    ax.set_title(f"{table[0]['task']} with distractors: H ~ P ({table[0]['n']} {which})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out)
    return out


def for_report(run, out_dir: Path) -> dict | None:
    """Table 4 for a finetuned sentence-pair classifier (default distances and seed); None for any other run."""
    from ssmlm.analyze.length_bins import classifier_run

    if classifier_run(run) or len(run.recipe.task.text_fields or ()) == 1:
        return None
    if not run.recipe.task.text_fields:  # a named task: its definition says how many texts it has
        from ssmlm.data.tasks import TASKS

        known = TASKS.get(run.info.get("task", ""))
        if known is None or len(known.text_fields) != 2:
            return None
    result = analyze_adversarial([run], out_dir)
    acc = result["accuracy"][run.dir.name]
    return {
        "title": "Distractors between the two texts",
        "figure": FIGURE,
        "images": [result["plot"]],
        "data": [result["data"]],
        "numbers": {"examples": float(result["examples_scored"]), **{f"accuracy D={d}": v for d, v in acc.items()}},
    }
