"""`analyze length-bins`: a finetuned classifier's accuracy by binned input length (BiGS Figure 6, QNLI).

Each run's task split is loaded and encoded exactly as `ssmlm evaluate` does (`load_task` + `encode` with the
run's tokenizer, task section and length), the model predicts every example, and each example is binned by its
real token length: the non-pad tokens the model saw, special tokens included, after truncation to the run's
length. A bin (lo, hi] holds the examples with lo < length <= hi; the last bin is open (> last edge).

Also home of the helpers the adversarial analysis shares: `task_data`, `classifier_run` and `predict`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.analyze.plots import write_csv
from ssmlm.errors import UserError

NAME = "length-bins"
FIGURE = "BiGS Figure 6"
# The paper's figure does not list its bin edges in the text; GLUE finetuning runs at 128 tokens, so quarters of
# that (and an open bin for longer inputs, empty at 128) cover QNLI's range.
DEFAULT_EDGES = (32, 64, 96, 128)
COLUMNS = ("run", "arch", "task", "split", "bin", "lo", "hi", "n", "correct", "accuracy")


def command(
    ckpt: Annotated[
        list[str], typer.Option("--ckpt", metavar="RUN", help="Finetuned classification run (repeat to compare).")
    ],
    bins: Annotated[
        str, typer.Option("--bins", help="Bin edges in tokens, ascending: bins (0,e1], (e1,e2], ..., (last, inf).")
    ] = ",".join(map(str, DEFAULT_EDGES)),
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
    """Plot a finetuned classifier's accuracy by binned input length in tokens (BiGS Figure 6).

    Works on any classification task the run was finetuned on (QNLI in the paper); the split is encoded as
    `ssmlm evaluate` encodes it. Writes length_bins.csv (accuracy and count per run and bin) and length_bins.png.
    Example: ssmlm analyze length-bins --ckpt runs/bigs-qnli --ckpt runs/stack-qnli --data-dir glue
    """
    checks.option("--batch-size", batch_size, checks.POSITIVE)
    for c in ckpt:
        checks.run_dir(c, "--ckpt")
    edges = parse_edges(bins)
    from ssmlm.runs import open_run

    runs = [open_run(c) for c in ckpt]
    out_dir = Path(out) if out else runs[0].dir / "analysis"
    result = analyze_length_bins(runs, out_dir, edges, split, data_dir, validation_file, batch_size)
    return result  # printed by the CLI: tables, or JSON with --json


def parse_edges(text: str) -> tuple[int, ...]:
    try:
        edges = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--bins '{text}': expected comma-separated token counts, e.g. 32,64,96,128") from None
    if not edges or any(e <= 0 for e in edges) or list(edges) != sorted(set(edges)):
        raise UserError(f"--bins '{text}': expected positive, strictly increasing token counts, e.g. 32,64,96,128")
    return edges


# ----------------------------------------------------------------------------- shared with adversarial


def classifier_run(run) -> str | None:
    """Why ``run`` is not a finetuned classifier (None when it is): these analyses score class predictions."""
    if run.kind != "finetune":
        return f"{run.dir} is a {run.kind} run; finetune it on a classification task first"
    if run.info.get("head", "classify") != "classify":
        return f"{run.dir}: task '{run.info.get('task')}' is a {run.info.get('head')} task, not classification"
    if run.info.get("num_labels", 2) < 2:
        return f"{run.dir}: task '{run.info.get('task')}' is a regression task; accuracy needs classes"
    return None


def task_data(run, data_dir: str | None = None, validation_file: str | None = None):
    """(TaskData, max_len, padding) of a finetuned run's task, resolved as `ssmlm evaluate` resolves it."""
    why = classifier_run(run)
    if why:
        raise UserError(why)
    for opt, path in (("--validation-file", validation_file), ("--data-dir", data_dir)):
        if path and not Path(path).expanduser().exists():
            raise UserError(f"{opt} '{path}': no such file or directory")
    task = dataclasses.replace(
        run.recipe.task,
        validation_file=validation_file or run.recipe.task.validation_file,
        data_dir=data_dir or run.recipe.task.data_dir,
    )
    max_len = task.max_seq_length or run.recipe.model.max_seq_length
    return run_task(run, task), max_len, task.padding


def run_task(run, task):
    """The run's task as its training saw it: the rows its seed held out for validation (no validation file) and,
    for a local task, its label map (ssmlm.data.tasks.load_task)."""
    from ssmlm.data.tasks import load_task

    names = run.info.get("label_names") if task.train_file else None
    return load_task(task, run.recipe.train.seed, names)


def predict(run, arrays: dict, batch_size: int = 32, model=None):
    """Predicted class per example of encoded ``arrays`` (input_ids, token_type_ids, attention_mask, labels,
    example_weight): the run's head through ``ssmlm.evaluate.runner.predict``, the runner `ssmlm evaluate` uses.
    ``model``: the run's model loaded already (callers that predict many times load it once)."""
    import numpy as np

    from ssmlm.evaluate import runner
    from ssmlm.objectives.tasks import HEADS
    from ssmlm.train.parts.task import task_eval_data

    if model is None:
        model, _ = run.load_model()
    head = HEADS[run.info.get("head", "classify")]
    preds = runner.predict(head.eval, model, task_eval_data(arrays, batch_size), progress=f"predicting {run.dir.name}")
    return np.asarray(preds).astype(np.int64)


# ----------------------------------------------------------------------------- the analysis


def bin_label(lo: int, hi: float) -> str:
    return f">{lo}" if math.isinf(hi) else f"{lo + 1}-{hi}"


def bin_rows(lengths, correct, edges: tuple[int, ...]) -> list[dict]:
    """Count and accuracy per length bin (lo, hi]; the last bin is (edges[-1], inf). Empty bins have accuracy None."""
    import numpy as np

    lengths, correct = np.asarray(lengths), np.asarray(correct, bool)
    rows = []
    for lo, hi in zip((0, *edges), (*edges, math.inf), strict=True):
        inside = (lengths > lo) & (lengths <= hi)
        n = int(inside.sum())
        ok = int(correct[inside].sum())
        rows.append(
            {
                "bin": bin_label(lo, hi),
                "lo": lo,
                "hi": hi if math.isfinite(hi) else "",
                "n": n,
                "correct": ok,
                "accuracy": ok / n if n else None,
            }
        )
    return rows


def length_accuracy(run, edges, split="validation", data_dir=None, validation_file=None, batch_size=32) -> dict:
    """One run's per-example lengths, predictions and labels on ``split``, and its rows per bin."""
    import numpy as np

    from ssmlm.data.tasks import encode

    data, max_len, padding = task_data(run, data_dir, validation_file)
    if split not in data.splits:
        raise UserError(f"task {data.definition.name} has no '{split}' split (has {list(data.splits)})")
    if data.definition.label_field not in data.splits[split]:
        raise UserError(f"task {data.definition.name}: split '{split}' has no labels to score")
    arrays = encode(data, split, run.tokenizer(), max_len, padding)
    lengths = arrays["attention_mask"].sum(1)
    preds = predict(run, arrays, batch_size)
    correct = preds == arrays["labels"]
    base = {"run": run.dir.name, "arch": run.recipe.model.arch, "task": data.definition.name, "split": split}
    return {
        "rows": [{**base, **r} for r in bin_rows(lengths, correct, edges)],
        "accuracy": float(np.mean(correct)),
        "n": int(len(correct)),
    }


def analyze_length_bins(
    runs, out_dir: Path, edges=DEFAULT_EDGES, split="validation", data_dir=None, validation_file=None, batch_size=32
) -> dict:
    if not runs:
        raise UserError("--ckpt: give at least one finetuned run")
    results = {r.dir.name: length_accuracy(r, edges, split, data_dir, validation_file, batch_size) for r in runs}
    if len(results) < len(runs):
        raise UserError("--ckpt: two runs share a directory name; give runs with distinct names")
    table = [row for res in results.values() for row in res["rows"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "length_bins.csv"
    write_csv(csv_path, COLUMNS, ({**r, "accuracy": "" if r["accuracy"] is None else r["accuracy"]} for r in table))
    png = plot(table, out_dir / "length_bins.png")
    return {
        "plot": str(png),
        "data": str(csv_path),
        "accuracy": {name: res["accuracy"] for name, res in results.items()},
        "by_bin": {name: {r["bin"]: r["accuracy"] for r in res["rows"] if r["n"]} for name, res in results.items()},
    }


def plot(table: list[dict], out: Path) -> Path:
    """Grouped bars: accuracy (%) per length bin, one colour per run, each bar labelled with its example count."""
    from ssmlm.analyze.plots import pyplot, save_figure

    plt = pyplot()
    labels = list(dict.fromkeys(r["bin"] for r in table))
    runs = list(dict.fromkeys(r["run"] for r in table))
    used = [b for b in labels if any(r["n"] for r in table if r["bin"] == b)]  # drop bins no run has examples in
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(used) * max(1, len(runs) / 2)), 4.2))
    for k, name in enumerate(runs):
        mine = {r["bin"]: r for r in table if r["run"] == name}
        xs = [i + (k - (len(runs) - 1) / 2) * width for i in range(len(used))]
        acc = [100 * mine[b]["accuracy"] if mine[b]["n"] else 0.0 for b in used]
        arch = mine[used[0]]["arch"] if used else ""
        bars = ax.bar(xs, acc, width, label=f"{name} ({arch})")
        for bar, b in zip(bars, used, strict=True):
            ax.annotate(
                f"n={mine[b]['n']}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(len(used)), used)
    ax.set_xlabel("input length (tokens, special tokens included)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 105)
    task = table[0]["task"] if table else ""
    ax.set_title(f"Accuracy by binned length on {task} ({table[0]['split'] if table else ''})")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    save_figure(fig, out)
    return out


def for_report(run, out_dir: Path) -> dict | None:
    """Figure 6 for a finetuned classification run (its task's validation split); None for any other run."""
    if classifier_run(run):
        return None
    result = analyze_length_bins([run], out_dir)
    return {
        "title": "Accuracy by input length",
        "figure": FIGURE,
        "images": [result["plot"]],
        "data": [result["data"]],
        "numbers": {
            "accuracy": result["accuracy"][run.dir.name],
            **{f"accuracy {b} tokens": v for b, v in result["by_bin"][run.dir.name].items()},
        },
    }
