"""Finetuning tasks: known definitions (built-in and GLUE) and local files with named columns.

Every task loads into the same shape: per split, a list of text columns and a label column, which
`encode` turns into fixed-length arrays (input_ids, token_type_ids, attention_mask, labels).
"""

from __future__ import annotations

import difflib
import random
import re
from pathlib import Path

import numpy as np

from ssmlm.data.config import TaskConfig
from ssmlm.data.taskdef import TaskData, TaskDef
from ssmlm.errors import DataError

GLUE = {
    "cola": TaskDef("cola", ("sentence",), metrics=("matthews",), hub=("nyu-mll/glue", "cola")),
    "sst2": TaskDef("sst2", ("sentence",), hub=("nyu-mll/glue", "sst2")),
    "mrpc": TaskDef("mrpc", ("sentence1", "sentence2"), metrics=("f1", "accuracy"), hub=("nyu-mll/glue", "mrpc")),
    "qqp": TaskDef("qqp", ("question1", "question2"), metrics=("f1", "accuracy"), hub=("nyu-mll/glue", "qqp")),
    "stsb": TaskDef(
        "stsb",
        ("sentence1", "sentence2"),
        num_labels=1,
        metrics=("pearson", "spearman"),
        hub=("nyu-mll/glue", "stsb"),
        select="spearman",  # BiGS Table 1 / GLUE report Spearman for STS-B
    ),
    "mnli": TaskDef(
        "mnli",
        ("premise", "hypothesis"),
        num_labels=3,
        hub=("nyu-mll/glue", "mnli"),
        splits={"train": "train", "validation": "validation_matched", "validation_mismatched": "validation_mismatched"},
    ),
    "qnli": TaskDef("qnli", ("question", "sentence"), hub=("nyu-mll/glue", "qnli")),
    "rte": TaskDef("rte", ("sentence1", "sentence2"), hub=("nyu-mll/glue", "rte")),
}

BUILTIN = {
    "builtin-order": TaskDef(
        "builtin-order",
        ("sentence",),
        description="is this sentence in its original word order (1) or shuffled (0)? From the built-in corpus",
    ),
    "builtin-next": TaskDef(
        "builtin-next",
        ("first", "second"),
        description="does the second sentence follow the first (1) or is it a random one (0)? Built-in corpus",
    ),
}

LONG = {
    "squad": TaskDef("squad", ("question", "context"), "answers", 2, ("f1", "exact_match"),
                     ("rajpurkar/squad", None), head="span", description="SQuAD 1.1 (span extraction)"),
    "squad_v2": TaskDef("squad_v2", ("question", "context"), "answers", 2, ("f1", "exact_match"),
                        ("rajpurkar/squad_v2", None), head="span", description="SQuAD 2.0 (with unanswerable)"),
    "quality": TaskDef("quality", ("input",), "output", 4, ("accuracy",), ("tau/scrolls", "quality"),
                       head="choice", description="SCROLLS QuALITY (multiple choice, EM)"),
    "contract_nli": TaskDef("contract_nli", ("hypothesis", "document"), "label", 3, ("accuracy",),
                            ("tau/scrolls", "contract_nli"), description="SCROLLS ContractNLI (EM)"),
}  # fmt: skip

TASKS: dict[str, TaskDef] = {**BUILTIN, **GLUE, **LONG}
LOCAL_KINDS = {".csv": "csv", ".tsv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def get_task(name: str) -> TaskDef:
    if name not in TASKS:
        hint = difflib.get_close_matches(name, list(TASKS), n=1)
        extra = f"; did you mean '{hint[0]}'?" if hint else ""
        raise DataError(f"unknown task '{name}'{extra} (known: {', '.join(TASKS)})")
    return TASKS[name]


# ----------------------------------------------------------------------------- built-in tasks


def _sentences(min_words=6, max_words=30) -> list[tuple[str, str]]:
    """(sentence, next sentence) pairs of plain prose from the built-in corpus, in corpus order."""
    from ssmlm.data.sources import builtin_corpus

    pairs = []
    for doc in builtin_corpus().documents:
        text = " ".join(doc)
        sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text)]
        ok = [s for s in sents if min_words <= len(s.split()) <= max_words and re.match(r"^[A-Z][\w ,;'()-]+\.$", s)]
        pairs.extend(zip(ok, ok[1:], strict=False))
    return pairs


def builtin_task(name: str, n_train: int = 2000, n_validation: int = 500, seed: int = 0) -> dict[str, dict]:
    rng = random.Random(seed)
    pairs = _sentences()
    rng.shuffle(pairs)
    n = n_train + n_validation
    if len(pairs) < n:
        raise DataError(f"task {name}: the built-in corpus gave only {len(pairs)} sentences, need {n}")
    rows = []
    for i, (a, b) in enumerate(pairs[:n]):
        label = i % 2
        if name == "builtin-order":
            words = a.split()
            if label == 0:
                while words == a.split():
                    rng.shuffle(words)
            rows.append({"sentence": " ".join(words), "label": label})
        else:
            second = b if label == 1 else pairs[rng.randrange(n, len(pairs))][1]
            rows.append({"first": a, "second": second, "label": label})
    cols = lambda rs: {k: [r[k] for r in rs] for k in rs[0]}  # noqa: E731
    return {"train": cols(rows[:n_train]), "validation": cols(rows[n_train:])}


# ----------------------------------------------------------------------------- loading


def _read_local(path: str, where: str) -> dict[str, list]:
    from ssmlm.data.sources import json_rows, load_table

    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"{where} '{path}': no such file")
    kind = LOCAL_KINDS.get(p.suffix)
    if kind is None:
        raise DataError(f"{where} '{path}': unsupported file type; expected one of {sorted(LOCAL_KINDS)}")
    if kind == "json":  # read here, so that a malformed row is reported with its line
        rows = [row for _, row in json_rows(p)]
        keys = list(dict.fromkeys(k for row in rows for k in row))
        return {k: [row.get(k) for row in rows] for k in keys}
    kw = {"delimiter": "\t", "quoting": 3} if p.suffix == ".tsv" else {}
    return load_table(p, kind, **kw).to_dict()


def _read_hub(td: TaskDef, split: str) -> dict[str, list]:
    from ssmlm.data.hub import offline_reason
    from ssmlm.data.sources import quiet_datasets

    offline = offline_reason()  # offline, datasets only looks in its cache: no retries
    with quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(td.hub[0], td.hub[1], split=td.splits[split])
        except Exception as e:
            why = offline or str(e).splitlines()[0][:120]
            raise DataError(
                f"task {td.name}: could not load {td.hub[0]}/{td.hub[1]} from the hub ({why}); put the files locally "
                f"and pass --data-dir DIR (the benchmark's own layout, e.g. GLUE's {td.name.upper()}/train.tsv) "
                f"or --train-file/--validation-file (csv/tsv/jsonl with columns "
                f"{', '.join(td.text_fields)}, {td.label_field})"
            ) from None
    return ds.to_dict()


def load_task(cfg: TaskConfig) -> TaskData:
    """Resolve a task from the recipe's task section (and CLI flags folded into it)."""
    base = get_task(cfg.name) if cfg.name else None
    if base is None and not cfg.train_file:
        raise DataError("no task given: pass --task NAME or --train-file with --text-fields and --label-field")
    td = TaskDef(
        name=cfg.name or Path(cfg.train_file).stem,
        text_fields=tuple(cfg.text_fields) if cfg.text_fields else (base.text_fields if base else ("sentence",)),
        label_field=cfg.label_field or (base.label_field if base else "label"),
        num_labels=cfg.num_labels or (base.num_labels if base else 2),
        metrics=base.metrics if base else (("pearson", "spearman") if cfg.num_labels == 1 else ("accuracy",)),
        hub=base.hub if base else None,
        splits=base.splits if base else {"train": "train", "validation": "validation"},
        select=base.select if base else None,
    )
    if not 1 <= len(td.text_fields) <= 2:
        raise DataError(f"task.text_fields = {list(td.text_fields)}: expected one or two column names")
    files = {"train": cfg.train_file, "validation": cfg.validation_file, "test": cfg.test_file}
    splits: dict[str, dict[str, list]] = {}
    if cfg.name == "contract_nli":
        from ssmlm.data.scrolls import contract_nli_task, read_scrolls, scrolls_from_hub

        def rows(split):
            src = files.get(split) or cfg.data_dir
            return read_scrolls(src, split) if src else scrolls_from_hub("contract_nli", split)

        return contract_nli_task({s: rows(s) for s in ("train", "validation")})
    if cfg.name in BUILTIN and not cfg.train_file:
        splits = builtin_task(cfg.name)
    else:
        for split in ("train", "validation"):
            if files[split]:
                splits[split] = _read_local(files[split], f"task.{split}_file")
            elif cfg.data_dir and td.name in GLUE:
                from ssmlm.data.glue import read_glue_dir

                splits[split] = read_glue_dir(td.name, cfg.data_dir, split)
            elif td.hub:
                splits[split] = _read_hub(td, split)
            elif split == "train":
                raise DataError("task.train_file is required for a task without a known source")
        for extra in set(td.splits) - {"train", "validation"}:
            if td.hub and not files["train"] and not cfg.data_dir:  # e.g. MNLI mismatched from the hub
                splits[extra] = _read_hub(td, extra)
        if files["test"]:
            splits["test"] = _read_local(files["test"], "task.test_file")
        elif cfg.data_dir and td.name in GLUE:
            from ssmlm.data.glue import read_glue_dir

            try:  # test inputs are optional; their predictions become the leaderboard files
                splits["test"] = read_glue_dir(td.name, cfg.data_dir, "test")
                if td.name == "mnli":
                    splits["test_mismatched"] = read_glue_dir(td.name, cfg.data_dir, "test_mismatched")
            except DataError:
                pass
            if td.name == "mnli":
                splits["validation_mismatched"] = read_glue_dir(td.name, cfg.data_dir, "validation_mismatched")
    label_names = None
    for split, cols in splits.items():
        missing = [
            c
            for c in (*td.text_fields, td.label_field)
            if c not in cols and not (split == "test" and c == td.label_field)
        ]
        if missing:
            raise DataError(f"task {td.name} ({split}): missing column(s) {missing}; columns: {list(cols)}")
    # String labels (e.g. 'entailment') are mapped to ids in sorted order of the training labels.
    if td.num_labels > 1 and splits["train"][td.label_field] and isinstance(splits["train"][td.label_field][0], str):
        label_names = sorted(set(splits["train"][td.label_field]))
        index = {n: i for i, n in enumerate(label_names)}
        for split, cols in splits.items():
            if td.label_field in cols:
                try:
                    cols[td.label_field] = [index[v] for v in cols[td.label_field]]
                except KeyError as e:
                    raise DataError(f"task {td.name} ({split}): label {e} not seen in training data") from None
    return TaskData(td, splits, label_names)


def encode(data: TaskData, split: str, tokenizer, max_len: int, padding: str = "max_length") -> dict[str, np.ndarray]:
    """Tokenize one split into right-padded arrays ([PAD] = 0), truncated to max_len.

    padding="max_length" pads every example to max_len, as the official BiGS code must (its kernel length
    is fixed); "longest" pads to the split's longest example (rounded up to a multiple of 8), which is
    the same function for the SSM here (kernels are evaluated at the input length) and much cheaper
    for short GLUE sentences.
    """
    td, cols = data.definition, data.splits[split]
    tok = tokenizer
    tok.enable_truncation(max_length=max_len)
    texts = [[("" if v is None else str(v)) for v in cols[f]] for f in td.text_fields]
    inputs = list(zip(*texts, strict=True)) if len(texts) == 2 else texts[0]
    enc = tok.encode_batch(inputs)
    tok.no_truncation()
    longest = max((len(e.ids) for e in enc), default=1)
    width = max_len if padding == "max_length" else min(max_len, -(-longest // 8) * 8)
    out = {k: np.zeros((len(enc), width), np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")}
    for i, e in enumerate(enc):
        out["input_ids"][i, : len(e.ids)] = e.ids
        out["token_type_ids"][i, : len(e.ids)] = e.type_ids
        out["attention_mask"][i, : len(e.ids)] = 1
    n = len(enc)
    if td.label_field in cols:
        dtype = np.float32 if td.num_labels == 1 else np.int32
        out["labels"] = np.asarray(cols[td.label_field], dtype=dtype)
    else:
        out["labels"] = np.zeros(n, dtype=np.float32 if td.num_labels == 1 else np.int32)
    out["example_weight"] = np.ones(n, dtype=np.float32)
    return out
