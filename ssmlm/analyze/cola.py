"""`analyze cola`: a CoLA-finetuned run's Matthews correlation by sentence length (BiGS Figure 7) and by the
syntactic phenomena of Warstadt & Bowman (2019)'s annotations (BiGS Figure 9).

Predictions come from the run's newest checkpoint on its own validation split, encoded as `ssmlm evaluate`
encodes it (the run's task section: its files or the hub, its max_seq_length and padding). Sentence length is
counted in whitespace-separated words, so runs with different tokenizers share bins.

Annotations (``--annotations FILE``) are a table with a header row, tab-separated for .tsv, comma-separated
otherwise, in the layout of Warstadt & Bowman's annotated CoLA development set:

  sentence   the validation sentence (matched to the split's sentences ignoring case and spacing)
  label, source, id, index   optional, ignored (the gold label is the split's own)
  every other column   one phenomenon each, 1 when the sentence shows it, 0 or empty when not

Their file has 15 major features (Simple, Pred, Adjunct, Arg Types, Arg Altern, Imperative, Binding, Question,
Comp Clause, Auxiliary, to-VP, N/Adj, S-Syntax, Determiner, Violations; the paper's Figure 9 shows 13 of
them) and 63 minor ones; ``--categories`` picks columns. ssmlm/analyze/data/cola_annotated_sample.tsv is a
small hand-written file in this layout (for tests and demos, not CoLA's sentences). For the report, a file
named cola_annotations.tsv (or .csv) in the run directory, or in the task's --data-dir (or its CoLA/), is used
when present; otherwise the report shows the length bins only.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.analyze.plots import write_csv
from ssmlm.errors import DataError, UserError

NAME = "cola"
FIGURE = "BiGS Figures 7 and 9"
SAMPLE = Path(__file__).parent / "data" / "cola_annotated_sample.tsv"
ANNOTATION_FILES = ("cola_annotations.tsv", "cola_annotations.csv")
NOT_CATEGORIES = {"sentence", "label", "source", "id", "index", "idx", "acceptability", "original"}
DEFAULT_BINS = "5,10,15,20"


def command(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Run directory of a CoLA-finetuned run.")],
    annotations: Annotated[
        str | None,
        typer.Option("--annotations", help="Phenomenon annotations of the validation sentences (Figure 9)."),
    ] = None,
    categories: Annotated[
        str | None, typer.Option("--categories", help="Comma-separated annotation columns (default: all).")
    ] = None,
    bins: Annotated[
        str, typer.Option("--bins", help="Upper edges of the length bins, in words (last bin: above the last).")
    ] = DEFAULT_BINS,
    split: Annotated[str, typer.Option("--split", help="Split to score.")] = "validation",
    batch_size: Annotated[int, typer.Option("--batch-size")] = 32,
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default: RUN/analysis).")] = None,
):
    """CoLA Matthews correlation by sentence length and by syntactic phenomenon (BiGS Figures 7 and 9).

    Figure 7 always; Figure 9 with --annotations (Warstadt & Bowman's annotated dev set: a sentence column and
    one 0/1 column per phenomenon; see `ssmlm.analyze.cola`).
    Example: ssmlm analyze cola --ckpt runs/default-cola --annotations CoLA_dev_annotated.tsv
    """
    checks.option("--batch-size", batch_size, checks.POSITIVE)
    checks.run_dir(ckpt, "--ckpt")
    edges = parse_bins(bins)
    if annotations and not Path(annotations).expanduser().is_file():
        raise UserError(f"--annotations '{annotations}': no such file")
    from ssmlm.runs import open_run

    run = open_run(ckpt)
    if not applies(run):
        raise UserError(
            f"{run.dir}: not a CoLA-finetuned run (a {run.kind} run, task {run.info.get('task')!r}); "
            "finetune with --task cola"
        )
    cats = [c.strip() for c in categories.split(",") if c.strip()] if categories else None
    ann = Path(annotations).expanduser() if annotations else None
    result = analyze_cola(run, Path(out) if out else run.dir / "analysis", edges, ann, cats, split, batch_size)
    return result  # printed by the CLI: tables, or JSON with --json


def applies(run) -> bool:
    return run.kind == "finetune" and run.info.get("task") == "cola" and run.info.get("head", "classify") == "classify"


def for_report(run, out_dir: Path) -> dict | None:
    if not applies(run):
        return None
    ann = find_annotations(run)
    result = analyze_cola(run, out_dir, parse_bins(DEFAULT_BINS), ann)
    images = [result["plot_length"]] + ([result["plot_categories"]] if ann else [])
    data = [result["length"], result["predictions"]] + ([result["categories"]] if ann else [])
    return {
        "title": "CoLA by sentence length" + (" and phenomenon" if ann else ""),
        "figure": FIGURE if ann else "BiGS Figure 7",
        "images": images,
        "data": data,
        "numbers": {"mcc": result["mcc"], "examples": result["examples"], **result["mcc_by_length"]},
    }


def find_annotations(run) -> Path | None:
    """cola_annotations.tsv/.csv in the run directory or the task's data directory (or its CoLA/)."""
    dirs = [run.dir]
    if run.recipe.task.data_dir:
        d = Path(run.recipe.task.data_dir).expanduser()
        dirs += [d, d / "CoLA"]
    return next((d / n for d in dirs for n in ANNOTATION_FILES if (d / n).is_file()), None)


def parse_bins(text: str) -> list[int]:
    try:
        edges = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--bins '{text}': expected comma-separated word counts, e.g. {DEFAULT_BINS}") from None
    if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise UserError(f"--bins '{text}': expected increasing positive word counts, e.g. {DEFAULT_BINS}")
    return edges


def length_bins(edges: list[int]) -> list[tuple[str, int, int | None]]:
    """(label, lo, hi) per bin, inclusive word counts; the last bin is open."""
    los = [1] + [e + 1 for e in edges]
    his: list[int | None] = [*edges, None]
    return [(f"{lo}-{hi}" if hi else f"{lo}+", lo, hi) for lo, hi in zip(los, his, strict=True)]


# ----------------------------------------------------------------------------- predictions


def split_predictions(run, split: str = "validation", batch_size: int = 32):
    """(sentences, gold labels, predicted labels, step) of the run's task split, in file order, with the model
    inputs `ssmlm evaluate` builds (ssmlm.data.tasks.encode with the run's task settings); the predictions are
    `length_bins.predict`'s (the one evaluation runner)."""
    import numpy as np

    from ssmlm.analyze.length_bins import predict, run_task
    from ssmlm.data.tasks import encode

    task = run.recipe.task
    data = run_task(run, task)
    if split not in data.splits:
        raise UserError(f"task {data.definition.name} has no '{split}' split (has {list(data.splits)})")
    max_len = task.max_seq_length or run.recipe.model.max_seq_length
    arrays = encode(data, split, run.tokenizer(), max_len, task.padding)
    model, meta = run.load_model()
    pred = predict(run, arrays, batch_size, model)
    sentences = ["" if s is None else str(s) for s in data.splits[split][data.definition.text_fields[0]]]
    return sentences, np.asarray(arrays["labels"]), pred, meta["step"]


# ----------------------------------------------------------------------------- annotations


def normalize(sentence: str) -> str:
    return " ".join(sentence.split()).lower()


def read_annotations(path: Path, categories: list[str] | None = None) -> tuple[list[str], dict[str, set[str]]]:
    """(category names, normalised sentence -> the categories it shows), from a file in the module doc's layout."""
    delimiter = "\t" if path.suffix == ".tsv" else ","
    with path.open(encoding="utf8", newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else 0)
        header = reader.fieldnames or []
        sentence_col = next((c for c in header if c.strip().lower() == "sentence"), None)
        if sentence_col is None:
            raise DataError(f"{path}: no 'sentence' column (columns: {header})")
        available = [c for c in header if c.strip().lower() not in NOT_CATEGORIES]
        if categories:
            missing = [c for c in categories if c not in available]
            if missing:
                raise DataError(f"{path}: no annotation column(s) {missing}; columns: {available}")
            available = categories
        if not available:
            raise DataError(f"{path}: no annotation columns besides {sorted(NOT_CATEGORIES)}")
        shows: dict[str, set[str]] = {}
        for n, row in enumerate(reader, 2):
            found = shows.setdefault(normalize(row[sentence_col] or ""), set())
            for c in available:
                v = (row.get(c) or "").strip()
                if v not in ("", "0", "1"):
                    raise DataError(f"{path}:{n}: column '{c}' = {v!r}; expected 1, 0 or empty")
                if v == "1":
                    found.add(c)
    return available, shows


# ----------------------------------------------------------------------------- the analysis


def score_groups(groups: dict[str, list[int]], gold, pred) -> list[dict]:
    """n, MCC and accuracy of each group of example indices (MCC 0 where undefined, as for CoLA overall)."""
    import numpy as np

    from ssmlm.evaluate.metrics import matthews

    rows = []
    for name, idx in groups.items():
        i = np.asarray(idx, dtype=int)
        n = len(i)
        rows.append(
            {
                "group": name,
                "n": n,
                "mcc": round(matthews(pred[i], gold[i]), 6) if n else None,
                "accuracy": round(float((pred[i] == gold[i]).mean()), 6) if n else None,
            }
        )
    return rows


def analyze_cola(
    run,
    out_dir: Path,
    edges: list[int],
    annotations: Path | None = None,
    categories: list[str] | None = None,
    split: str = "validation",
    batch_size: int = 32,
) -> dict:
    from ssmlm.evaluate.metrics import matthews

    # a malformed or unmatched annotation file fails before anything is written
    names, shows = read_annotations(annotations, categories) if annotations is not None else ([], {})
    sentences, gold, pred, step = split_predictions(run, split, batch_size)
    keys = [normalize(s) for s in sentences]
    matched = [i for i, k in enumerate(keys) if k in shows]
    if annotations is not None and not matched:
        raise DataError(f"{annotations}: none of its sentences is in the run's {split} split")

    words = [len(s.split()) for s in sentences]
    bins = length_bins(edges)
    by_length = {
        label: [i for i, w in enumerate(words) if w >= lo and (hi is None or w <= hi)] for label, lo, hi in bins
    }
    scored = zip(score_groups(by_length, gold, pred), bins, strict=True)
    length_rows = [
        {"bin": r["group"], "lo": lo, "hi": hi or "", **{k: r[k] for k in ("n", "mcc", "accuracy")}}
        for r, (_, lo, hi) in scored
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    title = f"{run.dir.name} (step {step}, {split})"
    overall = round(matthews(pred, gold), 6)
    length_csv = write_csv(out_dir / "cola_length.csv", ("bin", "lo", "hi", "n", "mcc", "accuracy"), length_rows)
    length_png = plot_bars(
        length_rows,
        "bin",
        overall,
        "sentence length (words)",
        f"CoLA MCC by sentence length (BiGS Figure 7): {title}",
        out_dir / "cola_length.png",
    )
    result = {
        "mcc": overall,
        "examples": len(sentences),
        "mcc_by_length": {r["bin"]: r["mcc"] for r in length_rows},
        "length": str(length_csv),
        "plot_length": str(length_png),
    }
    shown = None
    if annotations is not None:
        shown = [shows.get(k, set()) for k in keys]
        groups = {c: [i for i in matched if c in shown[i]] for c in names}
        cat_rows = [
            {"category": r["group"], "n": r["n"], "mcc": r["mcc"], "accuracy": r["accuracy"]}
            for r in score_groups(groups, gold, pred)
        ]
        matched_mcc = round(matthews(pred[matched], gold[matched]), 6)
        cat_csv = write_csv(out_dir / "cola_categories.csv", ("category", "n", "mcc", "accuracy"), cat_rows)
        cat_png = plot_bars(
            cat_rows,
            "category",
            matched_mcc,
            "phenomenon (Warstadt & Bowman 2019)",
            f"CoLA MCC by phenomenon (BiGS Figure 9): {title}",
            out_dir / "cola_categories.png",
            horizontal=True,
        )
        result.update(
            {
                "annotated": len(matched),
                "annotations_unmatched": len(set(shows) - set(keys)),
                "mcc_annotated": matched_mcc,
                "mcc_by_category": {r["category"]: r["mcc"] for r in cat_rows},
                "categories": str(cat_csv),
                "plot_categories": str(cat_png),
            }
        )
    pred_rows = [
        {
            "index": i,
            "sentence": s,
            "words": words[i],
            "label": int(gold[i]),
            "prediction": int(pred[i]),
            "categories": "" if shown is None else ";".join(sorted(shown[i])),
        }
        for i, s in enumerate(sentences)
    ]
    cols = ("index", "sentence", "words", "label", "prediction", "categories")
    result["predictions"] = str(write_csv(out_dir / "cola_predictions.csv", cols, pred_rows))
    return result


# ----------------------------------------------------------------------------- outputs


def plot_bars(
    rows: list[dict], key: str, overall: float, axis: str, title: str, out: Path, horizontal: bool = False
) -> Path:
    """MCC per group as bars (examples per bar written on it), the MCC over all of them dashed."""
    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    labels = [str(r[key]) for r in rows]
    vals = [0.0 if r["mcc"] is None else r["mcc"] for r in rows]
    if horizontal:
        fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.6))
        y = list(range(len(rows)))[::-1]
        ax.barh(y, vals, color="tab:red", height=0.6)
        ax.set_yticks(y, labels)
        ax.axvline(overall, color="navy", ls="--", label=f"all annotated: {overall:.3f}")
        ax.axvline(0, color="black", lw=0.8)
        for yi, r, v in zip(y, rows, vals, strict=True):
            ax.text(v, yi, f" n={r['n']}", va="center", ha="left" if v >= 0 else "right", fontsize=8)
        ax.set_xlabel("Matthews correlation (MCC)")
        ax.set_ylabel(axis)
        ax.set_xlim(min(-0.1, min(vals) - 0.15), 1.05)
    else:
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows) + 2), 4))
        x = list(range(len(rows)))
        ax.bar(x, vals, color="tab:red", width=0.6)
        ax.set_xticks(x, labels)
        ax.axhline(overall, color="navy", ls="--", label=f"all sentences: {overall:.3f}")
        ax.axhline(0, color="black", lw=0.8)
        for xi, r, v in zip(x, rows, vals, strict=True):
            ax.text(xi, v, f"n={r['n']}", ha="center", va="bottom" if v >= 0 else "top", fontsize=8)
        ax.set_xlabel(axis)
        ax.set_ylabel("Matthews correlation (MCC)")
        ax.set_ylim(min(-0.1, min(vals) - 0.1), 1.05)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3, axis="x" if horizontal else "y")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    fig.savefig(out.with_suffix(".svg"))
    plt.close(fig)
    return out
