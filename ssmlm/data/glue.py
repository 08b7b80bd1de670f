"""GLUE from the original benchmark download (one folder of TSVs per task) and leaderboard submissions.

`read_glue_dir` returns the columns under the hub (`nyu-mll/glue`) names and label ids, so a task read
from local TSVs goes through the same pipeline as one loaded from the hub. Test splits carry label -1.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from ssmlm.errors import DataError

# GLUE TSVs are not CSV-quoted: a quote character is literal text, and some fields are long.
csv.field_size_limit(2**31 - 1)

MNLI_LABELS = ["entailment", "neutral", "contradiction"]  # hub order
BINARY_NLI_LABELS = ["entailment", "not_entailment"]


@dataclass(frozen=True)
class GlueLayout:
    folder: str  # folder name in the GLUE download, also the submission file stem
    columns: dict[str, str]  # TSV column -> hub column
    label: str  # TSV label column
    label_names: list[str] | None = None  # string labels in hub id order; None: ints (or floats for STS-B)
    headerless_train: tuple[str, ...] = ()  # column names for headerless train/dev files (CoLA)
    files: dict[str, str] = field(
        default_factory=lambda: {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
    )


_MNLI_FILES = {
    "train": "train.tsv",
    "validation": "dev_matched.tsv",
    "validation_matched": "dev_matched.tsv",
    "validation_mismatched": "dev_mismatched.tsv",
    "test": "test_matched.tsv",
    "test_matched": "test_matched.tsv",
    "test_mismatched": "test_mismatched.tsv",
}

LAYOUTS = {
    "cola": GlueLayout(
        "CoLA",
        {"sentence": "sentence"},
        "label",
        headerless_train=("source", "label", "original_label", "sentence"),
    ),
    "sst2": GlueLayout("SST-2", {"sentence": "sentence"}, "label"),
    "mrpc": GlueLayout("MRPC", {"#1 String": "sentence1", "#2 String": "sentence2"}, "Quality"),
    "qqp": GlueLayout("QQP", {"question1": "question1", "question2": "question2"}, "is_duplicate"),
    "stsb": GlueLayout("STS-B", {"sentence1": "sentence1", "sentence2": "sentence2"}, "score"),
    "mnli": GlueLayout(
        "MNLI",
        {"sentence1": "premise", "sentence2": "hypothesis"},
        "gold_label",
        MNLI_LABELS,
        files=_MNLI_FILES,
    ),
    "qnli": GlueLayout("QNLI", {"question": "question", "sentence": "sentence"}, "label", BINARY_NLI_LABELS),
    "rte": GlueLayout("RTE", {"sentence1": "sentence1", "sentence2": "sentence2"}, "label", BINARY_NLI_LABELS),
}


def _layout(task_name: str) -> GlueLayout:
    key = task_name.lower().replace("-", "").replace("_", "")
    if key not in LAYOUTS:
        raise DataError(f"'{task_name}' is not a GLUE task with a TSV layout (known: {', '.join(LAYOUTS)})")
    return LAYOUTS[key]


def _task_dir(data_dir: Path, lay: GlueLayout) -> Path:
    """The task's folder: ``data_dir`` itself, or its GLUE subfolder (e.g. glue_data/SST-2)."""
    for d in (data_dir, data_dir / lay.folder):
        if d.is_dir() and any((d / f).is_file() for f in lay.files.values()):
            return d
    return data_dir


def _read_tsv(path: Path, header: tuple[str, ...] | None = None) -> list[dict[str, str]]:
    # utf-8-sig: the MSR paraphrase files start with a byte-order mark.
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        return []
    if header is None:
        header, rows = tuple(rows[0]), rows[1:]
    # A handful of QQP/STS-B rows are malformed (too few fields); the hub version drops them too.
    return [dict(zip(header, r, strict=True)) for r in rows if len(r) == len(header)]


def _mrpc_from_msr(d: Path, split: str) -> list[dict[str, str]] | None:
    """An MRPC folder with only the MSR release: train/dev = msr_paraphrase_train.txt split by dev_ids.tsv."""
    name = "msr_paraphrase_test.txt" if split == "test" else "msr_paraphrase_train.txt"
    if not (d / name).is_file() or (split != "test" and not (d / "dev_ids.tsv").is_file()):
        return None
    rows = _read_tsv(d / name)
    if split == "test":
        return rows
    dev = {tuple(ln.split("\t")[:2]) for ln in (d / "dev_ids.tsv").read_text().splitlines()}
    return [r for r in rows if ((r["#1 ID"], r["#2 ID"]) in dev) == (split == "validation")]


def read_glue_dir(task_name: str, data_dir: str | Path, split: str) -> dict[str, list]:
    """One split of a GLUE task from its original TSV folder, as hub-named columns with label ids.

    Splits: train, validation (dev.tsv; dev_matched.tsv for MNLI), validation_mismatched (MNLI), test.
    """
    lay = _layout(task_name)
    if split not in lay.files:
        raise DataError(f"GLUE {lay.folder}: no split '{split}' (known: {', '.join(lay.files)})")
    d = _task_dir(Path(data_dir).expanduser(), lay)
    path = d / lay.files[split]
    test = split.startswith("test")
    if path.is_file():
        rows = _read_tsv(path, None if test or not lay.headerless_train else lay.headerless_train)
    elif lay.folder == "MRPC" and (msr := _mrpc_from_msr(d, split)) is not None:
        rows = msr
    else:
        raise DataError(f"GLUE {lay.folder} {split}: {d} has no {lay.files[split]}")
    need = [*lay.columns, *([] if test else [lay.label])]
    if rows and any(c not in rows[0] for c in need):
        raise DataError(f"{path}: expected columns {need}, found {list(rows[0])}")
    cols: dict[str, list] = {hub: [r[tsv] for r in rows] for tsv, hub in lay.columns.items()}
    # Test labels are hidden in GLUE (the MSR MRPC test file has them, but the hub sets -1 too).
    if test or not rows:
        cols["label"] = [-1] * len(rows)
    else:
        cols["label"] = [_label(lay, r[lay.label], path, i) for i, r in enumerate(rows)]
    # Row index, as the hub's `idx` column: GLUE test files number their rows.
    ids = next((k for k in ("index", "id") if rows and k in rows[0]), None)
    cols["idx"] = [int(r[ids]) for r in rows] if ids else list(range(len(rows)))
    return cols


def _label(lay: GlueLayout, value: str, path: Path, i: int):
    try:
        if lay.label_names is not None:
            return lay.label_names.index(value)
        return float(value) if lay.folder == "STS-B" else int(value)
    except ValueError:
        raise DataError(f"{path}, row {i + 1}: unexpected label '{value}'") from None


# ----------------------------------------------------------------------------- leaderboard submissions

_SUBMISSION_NAMES = {
    "mnli": "MNLI-m",
    "mnlim": "MNLI-m",
    "mnlimatched": "MNLI-m",
    "mnlimm": "MNLI-mm",
    "mnlimismatched": "MNLI-mm",
    "ax": "AX",
}


def write_glue_submission(
    task_name: str, predictions: list, out_dir: str | Path, label_names: list[str] | None = None
) -> Path:
    """Write ``{Task}.tsv`` (``index<TAB>prediction``) as the GLUE leaderboard expects.

    ``predictions`` are label ids in hub order (or the strings themselves); ``label_names`` maps ids
    when a run's labels are in another order (e.g. sorted strings from local files). MNLI-m/-mm/AX:
    task_name 'mnli' / 'mnli-mm' / 'ax'.
    """
    key = task_name.lower().replace("-", "").replace("_", "")
    stem = _SUBMISSION_NAMES.get(key)
    lay = LAYOUTS["mnli"] if stem else _layout(task_name)
    stem = stem or lay.folder
    names = label_names or lay.label_names  # NLI tasks are submitted as label strings, others as ids
    lines = ["index\tprediction"]
    for i, p in enumerate(predictions):
        if lay.folder == "STS-B":
            text = f"{min(max(float(p), 0.0), 5.0):.3f}"  # the leaderboard scores 0-5 similarities
        elif isinstance(p, str):
            text = p
        else:
            text = str(names[int(p)]) if names else str(int(p))
        lines.append(f"{i}\t{text}")
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path
