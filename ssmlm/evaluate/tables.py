"""Result tables in the layout of the BiGS paper, built from `ssmlm evaluate` JSON files.

Each file is {"run", "task", "split", "step", "metrics": {...}} with optional "arch" / "route" (or "label")
naming its row.
Table 1 reports, ×100: accuracy for MNLI (matched), QNLI, RTE, SST-2; F1 for QQP and MRPC; Matthews
correlation for CoLA; Spearman for STS-B; AVG is their mean. Several files for the same model and task
(e.g. seeds; the paper averages six runs) are averaged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ssmlm.errors import UserError
from ssmlm.markdown import markdown_table
from ssmlm.models.config import route_label

# (column, task, metric, scale)
GLUE_TABLE1 = [
    ("MNLI", "mnli", "accuracy", 100.0),
    ("QNLI", "qnli", "accuracy", 100.0),
    ("QQP", "qqp", "f1", 100.0),
    ("RTE", "rte", "accuracy", 100.0),
    ("SST2", "sst2", "accuracy", 100.0),
    ("MRPC", "mrpc", "f1", 100.0),
    ("COLA", "cola", "matthews", 100.0),
    ("STSB", "stsb", "spearman", 100.0),
]
# Tables 2 and 3: SQuAD F1 (already in percent); QuALITY / ContractNLI exact match (accuracy ×100).
LONG_TASKS = [
    ("SQuAD", "squad", "f1", 1.0),
    ("QALT", "quality", "accuracy", 100.0),
    ("CNLI", "contract_nli", "accuracy", 100.0),
]


def _task_key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _model_label(r: dict) -> str:
    """An explicit "label", else "arch / route" (route looked up for known archs), else the run's name."""
    if r.get("label"):
        return str(r["label"])
    if r.get("arch") and r.get("route"):
        return f"{r['arch']} / {r['route']}"
    if r.get("arch"):
        return route_label(r["arch"]) or r["arch"]  # the family's declared "arch / route" label
    return Path(str(r.get("run", "?"))).name


def results_table(
    result_files: list[Path],
    columns: list[tuple[str, str, str, float]] = GLUE_TABLE1,
    split: str = "validation",
    average: bool = True,
) -> pd.DataFrame:
    """Rows = models (see `_model_label`), columns = tasks, plus AVG.

    Only results on ``split`` count (MNLI matched is 'validation'). Missing cells are NaN; AVG is the
    mean of the available cells (the paper's AVG has all eight).
    """
    want = {_task_key(task): (col, metric, scale) for col, task, metric, scale in columns}
    cells: dict[tuple[str, str], list[float]] = {}
    rows: list[str] = []
    for path in result_files:
        try:
            r = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: not a results JSON file ({type(e).__name__})") from None
        spec = want.get(_task_key(str(r.get("task", ""))))
        if spec is None or r.get("split", "validation") != split or spec[1] not in r.get("metrics", {}):
            continue
        label = _model_label(r)
        if label not in rows:
            rows.append(label)
        cells.setdefault((label, spec[0]), []).append(float(r["metrics"][spec[1]]) * spec[2])
    names = [c[0] for c in columns]
    data = [[_mean(cells.get((row, c))) for c in names] for row in rows]
    df = pd.DataFrame(data, index=pd.Index(rows, name="model"), columns=names, dtype=float)
    if average:
        df["AVG"] = df[names].mean(axis=1, skipna=True)
    return df


def _mean(values: list[float] | None) -> float:
    return sum(values) / len(values) if values else math.nan


def to_markdown(df: pd.DataFrame, digits: int = 1) -> str:
    """A GitHub markdown table; missing values print as '-' like the paper."""
    head = [df.index.name or "", *map(str, df.columns)]
    body = [
        [str(idx), *("-" if pd.isna(v) else f"{v:.{digits}f}" for v in row)]
        for idx, row in zip(df.index, df.values, strict=True)
    ]
    # the label column left-aligned, numbers right-aligned
    return "\n".join(markdown_table(head, body, align="l" + "r" * len(df.columns), pad=True)) + "\n"


def save_table(df: pd.DataFrame, path: str | Path, digits: int = 1) -> Path:
    """Write .csv (pandas) or .md (markdown) by the file's suffix."""
    p = Path(path).expanduser()
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".csv":
        df.round(digits + 2).to_csv(p)
    elif p.suffix == ".md":
        p.write_text(to_markdown(df, digits))
    else:
        raise UserError(f"{path}: table files are .csv or .md")
    return p
