"""SCROLLS QuALITY (4-way multiple choice) and ContractNLI (3-way classification) for encoder models.

SCROLLS rows are JSON lines {id, pid, input, output}; rows sharing an id are alternative references,
merged here into ``outputs``. A query task's ``input`` is the query, a blank line, then the document:

  QuALITY      "question\\n\\n (A) ...\\n (B) ...\\n (C) ...\\n (D) ...\\n\\nstory"; output = the gold option
  ContractNLI  "hypothesis\\n\\ncontract"; output in {Entailment, Contradiction, Not mentioned}

Test outputs are not public (empty): their labels are -1. The SCROLLS metric for both is exact match.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np

from ssmlm.data.squad import untruncated
from ssmlm.data.taskdef import TaskData, TaskDef
from ssmlm.errors import DataError
from ssmlm.evaluate.squad_metrics import normalize_answer

N_CHOICES = 4
_OPTION = re.compile(r"\s*\(([A-D])\)\s*")


# ----------------------------------------------------------------------------- reading


def _merge(lines: list[str], where: str) -> list[dict]:
    rows: dict[str, dict] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            row = rows.setdefault(r["id"], {"id": r["id"], "pid": r.get("pid"), "input": r["input"], "outputs": []})
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{where}, line {n}: not a SCROLLS row ({type(e).__name__}: {e})") from None
        if r.get("output"):
            row["outputs"].append(r["output"])
    return list(rows.values())


def read_scrolls(path: str | Path, split: str = "validation") -> list[dict]:
    """Rows {id, pid, input, outputs} from a .jsonl file, a folder with {split}.jsonl, or the hub's zip."""
    p = Path(path).expanduser()
    if p.suffix == ".zip" and p.is_file():
        with zipfile.ZipFile(p) as z:
            member = next((m for m in z.namelist() if m.endswith(f"/{split}.jsonl") or m == f"{split}.jsonl"), None)
            if member is None:
                raise DataError(f"{p}: holds no {split}.jsonl")
            return _merge(z.read(member).decode("utf-8").splitlines(), f"{p}:{member}")
    if p.is_dir():
        p = p / f"{split}.jsonl"
    if not p.is_file():
        raise DataError(f"SCROLLS file '{p}': no such file")
    return _merge(p.read_text(encoding="utf-8").splitlines(), str(p))


def scrolls_from_hub(name: str, split: str) -> list[dict]:
    """tau/scrolls {name}.zip from the hub (or its cache); a one-line DataError when it cannot be had."""
    from ssmlm.data.hub import offline_reason

    offline = offline_reason()  # offline, huggingface_hub only looks in its cache: no retries
    try:
        from huggingface_hub import hf_hub_download

        zip_path = hf_hub_download("tau/scrolls", f"{name}.zip", repo_type="dataset")
    except Exception as e:
        raise DataError(
            f"could not fetch tau/scrolls {name}.zip ({offline or type(e).__name__}); download it and pass the "
            f"zip or its {split}.jsonl instead"
        ) from None
    return read_scrolls(zip_path, split)


def _query_and_text(row: dict) -> tuple[str, str]:
    k = row["input"].find("\n\n")
    if k < 0:
        raise DataError(f"SCROLLS row {row['id']}: input has no blank line between query and document")
    return row["input"][:k].strip(), row["input"][k + 2 :]


# ----------------------------------------------------------------------------- QuALITY


def parse_quality(row: dict) -> dict:
    """{id, question, options (4), story, label}; label is the gold option's index, -1 without output."""
    question, rest = _query_and_text(row)
    d = rest.find("(D)")
    end = rest.find("\n\n", d) if d >= 0 else -1
    if end < 0:
        raise DataError(f"QuALITY row {row['id']}: no '(A) ... (D) ...' options followed by a blank line")
    options = [" ".join(t.split()) for t in _OPTION.split(rest[:end])[2::2]]  # split keeps the letters
    if len(options) != N_CHOICES:
        raise DataError(f"QuALITY row {row['id']}: found {len(options)} options, expected {N_CHOICES}")
    label = -1
    if row["outputs"]:
        gold = " ".join(row["outputs"][0].split())
        if gold not in options:
            raise DataError(f"QuALITY row {row['id']}: output '{gold[:60]}' is none of the options")
        label = options.index(gold)
    return {
        "id": row["id"],
        "question": question,
        "options": options,
        "story": rest[end:].strip(),
        "label": label,
    }


def encode_quality(
    examples: list[dict], tokenizer, max_len: int, max_first_len: int | None = None
) -> dict[str, np.ndarray]:
    """(B, 4, L) multiple-choice arrays: each choice is [CLS] question option [SEP] story [SEP].

    The question + option segment is cut to ``max_first_len`` tokens (default max_len // 2); the
    story fills the rest and is truncated at its end. Padding is 0. Also labels (B,), example_weight (B,).
    """
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    first_cap = max_first_len or max_len // 2
    with untruncated(tokenizer):
        stories = tokenizer.encode_batch([ex["story"] for ex in examples], add_special_tokens=False)
        firsts = tokenizer.encode_batch(
            [f"{ex['question']} {opt}" for ex in examples for opt in ex["options"]], add_special_tokens=False
        )
    b = len(examples)
    ids = np.zeros((b, N_CHOICES, max_len), np.int32)
    types, mask = np.zeros_like(ids), np.zeros_like(ids)
    for i, story in enumerate(stories):
        for c in range(N_CHOICES):
            first = firsts[i * N_CHOICES + c].ids[:first_cap]
            second = story.ids[: max(max_len - len(first) - 3, 0)]
            seq = [cls, *first, sep, *second, sep]
            ids[i, c, : len(seq)] = seq
            types[i, c, len(first) + 2 : len(seq)] = 1
            mask[i, c, : len(seq)] = 1
    labels = np.array([ex["label"] for ex in examples], dtype=np.int32)
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": mask,
        "labels": labels,
        "example_weight": np.ones(b, np.float32),
    }


# ----------------------------------------------------------------------------- ContractNLI


def contract_nli_task(splits: dict[str, list[dict]]) -> TaskData:
    """A pair-classification TaskData (hypothesis, document) for `ssmlm.data.tasks.encode`.

    Labels are the sorted unique training outputs, as the official BiGS run_glue.py does
    (Contradiction 0, Entailment 1, Not mentioned 2); rows without an output get -1.
    """
    if "train" not in splits:
        raise DataError("contract_nli: a train split is needed to fix the label set")
    names = sorted({r["outputs"][0] for r in splits["train"] if r["outputs"]})
    cols = {}
    for split, rows in splits.items():
        pairs = [_query_and_text(r) for r in rows]
        labels = []
        for r in rows:
            out = r["outputs"][0] if r["outputs"] else None
            if out is not None and out not in names:
                raise DataError(f"contract_nli ({split}) row {r['id']}: label '{out}' not seen in training data")
            labels.append(names.index(out) if out is not None else -1)
        cols[split] = {
            "hypothesis": [h for h, _ in pairs],
            "document": [d for _, d in pairs],
            "label": labels,
            "id": [r["id"] for r in rows],
        }
    td = TaskDef("contract_nli", ("hypothesis", "document"), num_labels=len(names), metrics=("accuracy",))
    return TaskData(td, cols, names)


# ----------------------------------------------------------------------------- metric


def scrolls_exact_match(predictions: list[str], references: list[list[str]]) -> float:
    """SCROLLS EM in percent: a prediction counts when it equals any reference after SQuAD normalisation."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    hits = [
        any(normalize_answer(p) == normalize_answer(r) for r in refs)
        for p, refs in zip(predictions, references, strict=True)
    ]
    return 100.0 * sum(hits) / max(len(hits), 1)
