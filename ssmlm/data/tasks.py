"""Finetuning tasks: known definitions (built-in and GLUE) and local files with named columns.

Every task loads into the same shape: per split, a list of text columns and a label column, which
`encode` turns into fixed-length arrays (input_ids, token_type_ids, attention_mask, labels).
"""

from __future__ import annotations

import difflib
import random
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ssmlm.data import labels
from ssmlm.data.config import TaskConfig
from ssmlm.data.task_files import Table, hold_out, positions, read_task_file
from ssmlm.data.taskdef import TaskData, TaskDef
from ssmlm.errors import DataError

if TYPE_CHECKING:
    import numpy as np

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
    "squad": TaskDef(
        "squad",
        ("question", "context"),
        "answers",
        2,
        ("f1", "exact_match"),
        ("rajpurkar/squad", None),
        head="span",
        description="SQuAD 1.1 (span extraction)",
    ),
    "squad_v2": TaskDef(
        "squad_v2",
        ("question", "context"),
        "answers",
        2,
        ("f1", "exact_match"),
        ("rajpurkar/squad_v2", None),
        head="span",
        description="SQuAD 2.0 (with unanswerable)",
    ),
    "quality": TaskDef(
        "quality",
        ("input",),
        "output",
        4,
        ("accuracy",),
        ("tau/scrolls", "quality"),
        head="choice",
        description="SCROLLS QuALITY (multiple choice, EM)",
    ),
    "contract_nli": TaskDef(
        "contract_nli",
        ("hypothesis", "document"),
        "label",
        3,
        ("accuracy",),
        ("tau/scrolls", "contract_nli"),
        description="SCROLLS ContractNLI (EM)",
    ),
}

TASKS: dict[str, TaskDef] = {**BUILTIN, **GLUE, **LONG}


def get_task(name: str) -> TaskDef:
    if name not in TASKS:
        hint = difflib.get_close_matches(name, list(TASKS), n=1)
        extra = f"; did you mean '{hint[0]}'?" if hint else ""
        raise DataError(
            f"unknown task '{name}'{extra} (known: {', '.join(TASKS)}; "
            "a task of your own: --train-file FILE or task.train_file)"
        )
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

SPLIT_SUFFIX = re.compile(r"[-_.](train|training)$", re.IGNORECASE)


def local_task_name(train_file: str) -> str:
    """A local task's name: its training file's stem without the split (polarity-train.csv, polarity_train.csv,
    polarity.train.csv: polarity; a file named just train.csv: train)."""
    stem = Path(train_file).stem
    return SPLIT_SUFFIX.sub("", stem) or stem


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


def _definition(cfg: TaskConfig) -> TaskDef:
    """A known task's definition, or with --train-file and a name no task has (or none), a local task named after
    it (or its training file), by default one text column 'sentence' and the label column 'label'. A known name
    with --train-file keeps that task's columns, label count and metrics (e.g. `--task sst2 --train-file`)."""
    base = get_task(cfg.name) if cfg.name and not (cfg.train_file and cfg.name not in TASKS) else None
    if base is None and not cfg.train_file:
        raise DataError("no task given: pass --task NAME or --train-file with --text-fields and --label-field")
    text = tuple(map(str, cfg.text_fields)) if cfg.text_fields else (base.text_fields if base else ("sentence",))
    return TaskDef(
        name=cfg.name or local_task_name(cfg.train_file),
        text_fields=text,
        label_field=str(cfg.label_field) if cfg.label_field is not None else (base.label_field if base else "label"),
        num_labels=cfg.num_labels or (base.num_labels if base else 0),  # 0: the training file's count of labels
        metrics=base.metrics if base else (("pearson", "spearman") if cfg.num_labels == 1 else ("accuracy",)),
        hub=base.hub if base else None,
        splits=base.splits if base else {"train": "train", "validation": "validation"},
        select=base.select if base else None,
    )


def _source_splits(cfg: TaskConfig, td: TaskDef, files: dict) -> dict[str, dict[str, list]]:
    """The splits no file gives: from a GLUE folder (--data-dir) or the hub, with label ids; a known task's test
    inputs and MNLI's mismatched sets."""
    from ssmlm.data.glue import read_glue_dir

    glue_dir = cfg.data_dir and td.name in GLUE
    splits: dict[str, dict[str, list]] = {}
    for split in ("train", "validation"):
        if files[split]:
            continue
        if glue_dir:
            splits[split] = read_glue_dir(td.name, cfg.data_dir, split)
        elif td.hub:
            splits[split] = _read_hub(td, split)
        elif split == "train":
            raise DataError("task.train_file is required for a task without a known source")
    for extra in set(td.splits) - {"train", "validation"}:
        if td.hub and not files["train"] and not cfg.data_dir:  # e.g. MNLI mismatched from the hub
            splits[extra] = _read_hub(td, extra)
    if glue_dir and not files["test"]:
        try:  # test inputs are optional; their predictions become the leaderboard files
            splits["test"] = read_glue_dir(td.name, cfg.data_dir, "test")
            if td.name == "mnli":
                splits["test_mismatched"] = read_glue_dir(td.name, cfg.data_dir, "test_mismatched")
        except DataError:
            pass
        if td.name == "mnli":
            splits["validation_mismatched"] = read_glue_dir(td.name, cfg.data_dir, "validation_mismatched")
    return splits


def _check_columns(td: TaskDef, split: str, cols: dict, path: Path | None) -> None:
    need = [*td.text_fields, *([] if split.startswith("test") else [td.label_field])]
    missing = [c for c in need if c not in cols]
    if missing:
        where = f"{split}, {path}" if path else split
        hint = "; name them with --text-fields and --label-field" if path else ""
        raise DataError(f"task {td.name} ({where}): missing column(s) {missing}; columns: {list(cols)}{hint}")


def _local_labels(td: TaskDef, cfg: TaskConfig, tables: dict[str, Table], names: list | None):
    """The local files' labels in place, as class ids by the label map (``names``: a finetuned run's; else the
    training file's) or as numbers (regression); a known task's files read without its training file hold ids.
    Returns (the definition with its label count, the map or None, the line describing it or None)."""
    field = td.label_field
    labelled = {s: t for s, t in tables.items() if field in t.columns}
    seen: dict = {}
    for s, t in labelled.items():  # the cells as the file spells them, before they are read as numbers
        if not s.startswith("test"):
            labels.require(t.columns[field], field, t.at)
        labels.same_spelling(t.columns[field], field, t.at, seen)
    if td.num_labels != 1 and names is None and "train" in labelled:
        _check_label_column(td, cfg, labelled["train"])
    for t in labelled.values():
        if t.path.suffix in (".csv", ".tsv"):
            t.columns[field] = labels.typed(t.columns[field])
    if td.num_labels == 1:
        for s, t in labelled.items():
            t.columns[field] = labels.to_numbers(t.columns[field], field, t.at, s.startswith("test"))
        return td, None, None
    train = tables.get("train")
    if names is None and train is not None:
        names = labels.label_map(train.columns[field], field, str(train.path), cfg.num_labels, train.at)
        if td.num_labels and len(names) > td.num_labels:
            raise DataError(
                f"task {td.name} has {td.num_labels} labels, but {train.path} holds {len(names)} in "
                f"column '{field}': {labels.listing(names)}"
            )
    if names is None:  # a known task's own split from a local file: label ids already
        for s, t in labelled.items():
            t.columns[field] = labels.to_class_ids(t.columns[field], td.num_labels, field, t.at, s.startswith("test"))
        return td, None, None
    for s, t in labelled.items():
        t.columns[field] = labels.to_ids(t.columns[field], names, field, t.at, s.startswith("test"))
    td = td if td.num_labels else replace(td, num_labels=len(names))
    return td, list(names), labels.balance(names, train.columns[field]) if train is not None else None


def _check_label_column(td: TaskDef, cfg: TaskConfig, train: Table) -> None:
    """A classification task's label column looks like one (labels.label_like); otherwise the flags named the
    wrong columns (a label-first file read text first, label last): refused, naming the columns that do look like
    label and text, in the flags' own syntax, rather than training a classifier with a class per sentence."""
    field = td.label_field
    values = train.columns[field]
    if cfg.num_labels or labels.label_like(values):  # --num-labels N: the user counted the classes
        return
    rows, distinct, median = labels.shape(values)
    found = f"{distinct:,} distinct values in {rows:,} rows, median length {median} characters"
    numeric = lambda vs: all(labels.as_number(v) is not None for v in vs if not labels.missing(v))  # noqa: E731
    if numeric(values):
        if any(not x.is_integer() for v in values if (x := labels.as_number(v)) is not None):
            return  # scores: labels.label_map says how to read them (regression, or classes)
        raise DataError(
            f"{train.path}: label column '{field}' holds {found}; for regression pass --num-labels 1, to use its "
            f"values as classes --num-labels {distinct}"
        )
    like = [c for c, v in train.columns.items() if labels.label_like(v)]
    text = [c for c, v in train.columns.items() if c not in like and not numeric(v)]
    if len(like) == 1 and 1 <= len(text) <= 2:
        flags = ("--no-header " if not cfg.header else "") + f"--label-field {like[0]} --text-fields {','.join(text)}"
        advice = f"column {like[0]} looks like the labels and {', '.join(text)} like the text: pass {flags}"
    else:
        columns = list(train.columns)
        advice = f"name the label and text columns with --label-field and --text-fields (columns: {columns})"
    if median <= labels.LONG:  # short values, only many of them: perhaps a task with that many classes
        advice += f"; for {distinct:,} classes pass --num-labels {distinct}"
    raise DataError(f"{train.path}: column '{field}' does not look like labels ({found}); {advice}")


def _check_texts(td: TaskDef, tables: dict[str, Table]) -> None:
    """No empty text cell in a local file: an example with no text to read is a mistake in the file."""
    for t in tables.values():
        for f in td.text_fields:
            i = next((i for i, v in enumerate(t.columns.get(f, ())) if labels.blank(v)), None)
            if i is not None:
                raise DataError(f"{t.at(i)}: empty text in column '{f}'")


def load_task(cfg: TaskConfig, seed: int = 0, label_names: list | None = None) -> TaskData:
    """Resolve a task from the recipe's task section (and CLI flags folded into it).

    ``seed`` (the run's) picks the validation rows held out of a local training file when no validation file is
    given (``task.validation_fraction``); ``label_names``: a finetuned run's label map, which evaluation uses
    rather than one read again. Every local label is checked here, before any tokenising.
    """
    if cfg.name == "contract_nli":
        from ssmlm.data.scrolls import contract_nli_task, read_scrolls, scrolls_from_hub

        def rows(split):
            src = {"train": cfg.train_file, "validation": cfg.validation_file}.get(split) or cfg.data_dir
            return read_scrolls(src, split) if src else scrolls_from_hub("contract_nli", split)

        return contract_nli_task({s: rows(s) for s in ("train", "validation")})
    td = _definition(cfg)
    if not 1 <= len(td.text_fields) <= 2:
        raise DataError(f"task.text_fields = {list(td.text_fields)}: expected one or two column names")
    if cfg.name in BUILTIN and not cfg.train_file:
        return TaskData(td, builtin_task(cfg.name))
    files = {"train": cfg.train_file, "validation": cfg.validation_file, "test": cfg.test_file}
    expected = (*td.text_fields, td.label_field)
    tables = {s: read_task_file(f, f"task.{s}_file", cfg.header, expected) for s, f in files.items() if f}
    if not cfg.header and tables:
        first = tables.get("train") or next(iter(tables.values()))
        text, label = positions(len(first.columns), cfg.text_fields, cfg.label_field, first.path)
        td = replace(td, text_fields=text, label_field=label)
    splits = _source_splits(cfg, td, files)
    for split, cols in splits.items():
        _check_columns(td, split, cols, None)
    for split, t in tables.items():
        _check_columns(td, split, t.columns, t.path)
    _check_texts(td, tables)
    td, names, notes = _local_labels(td, cfg, tables, label_names)
    notes = [notes] if notes else []
    if (
        names
        and any(td.label_field in splits.get(s, {}) for s in ("train", "validation"))
        and any(labels.key(v) != labels.key(i) for i, v in enumerate(names))
    ):
        raise DataError(
            f"task {td.name}: the training file's labels ({labels.listing(names)}) are not the "
            "label ids of its other splits; pass --validation-file too"
        )
    if "train" in tables and "validation" not in tables and "validation" not in splits:
        if cfg.validation_fraction > 0:
            train = tables["train"]
            tables["train"], tables["validation"] = hold_out(train, cfg.validation_fraction, seed)
            notes.append(
                f"validation: {cfg.validation_fraction * 100:g}% of {train.path.name} held out "
                f"({len(tables['validation']):,} rows, seed {seed})"
            )
        else:
            notes.append("validation: none (no validation file and task.validation_fraction = 0)")
    splits.update({s: t.columns for s, t in tables.items()})
    return TaskData(td, splits, names, notes)


def encode(data: TaskData, split: str, tokenizer, max_len: int, padding: str = "max_length") -> dict[str, np.ndarray]:
    """Tokenize one split into right-padded arrays ([PAD] = 0), truncated to max_len.

    padding="max_length" pads every example to max_len, as the official BiGS code must (its kernel length
    is fixed); "longest" pads to the split's longest example (rounded up to a multiple of 8), which is
    the same function for the SSM here (kernels are evaluated at the input length) and much cheaper
    for short GLUE sentences.
    """
    import numpy as np  # here, not at the top: the CLI lists TASKS in its --help, which stays free of numpy

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
