"""The recipe sections that name data: ``data:`` (the pretraining corpus and tokenizer) and ``task:`` (a finetuning
task's files, columns and generated books), each with the allowed values of its fields (DATA_RANGES,
TASK_RANGES; ssmlm.checks applies them to a recipe). Plain dataclasses: reading and checking a recipe stays
instant. Imports ssmlm.schema and the standard library only.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from ssmlm.schema import FRACTION, NON_EMPTY, NON_NEGATIVE, POSITIVE, SEQ_LEN, Rule, within


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Pretraining corpus and tokenizer: what `ssmlm preprocess` turns into token shards (no masking: that is
    the objective's)."""

    source: str = "builtin"  # builtin | a file, directory or glob (txt/jsonl/csv/parquet) | hub:NAME[:CONFIG]
    text_field: str = "text"  # column holding the text in jsonl/csv/parquet/hub sources
    split: str = "train"  # hub split
    max_documents: int | None = None  # cap on documents read (None: all)
    # .txt files: cut away Project Gutenberg's header and licence (its START/END markers) before anything reads them
    strip_gutenberg: bool = True
    # how the preprocessing cache knows a local corpus: stat = each file's path, size and modification time (instant);
    # content = each file's name, size and a hash of its first and last MiB (hosts with their own copies of the corpus
    # agree whatever the copies' times). A corpus in a bucket is known by its objects' generations either way
    corpus_key: Literal["stat", "content"] = "stat"
    tokenizer: str = "train"  # 'train' one on the corpus, or a vocab.txt / tokenizer.json path
    # wordpiece (the encoders'), or byte_bpe: a lossless byte-level BPE with the LM reserved tokens (LM recipes)
    tokenizer_type: Literal["wordpiece", "byte_bpe"] = "wordpiece"
    # byte_bpe only: every digit its own token, as in Birdie's Llama-2 tokenizer. Without it a number's tokens depend
    # on what precedes it ("5081" vs " 5081" share none), so copying a number means re-spelling it.
    split_digits: bool = False
    vocab_size: int = 30522  # when training a tokenizer
    lowercase: bool = True
    max_seq_length: int | None = None  # None: the model's max_seq_length
    short_seq_prob: float = 0.1  # chance of a shorter target length, as in BERT data generation
    # how a document's lines become rows (ssmlm.data.packing): fill = cut into rows of exactly the target
    # length, a line's overflow starting the next row (nothing lost); bert = create_pretraining_data: whole
    # lines up to the target, overflow trimmed (discards text); full = fill across documents, [SEP] between
    packing: Literal["fill", "bert", "full"] = "fill"
    validation_fraction: float = 0.01  # documents held out for evaluation
    seed: int = 42


# data.<field> -> its allowed values (None always passes where the field allows it: it means "derive it")
DATA_RANGES: dict[str, Rule] = {
    "source": NON_EMPTY,
    "text_field": NON_EMPTY,
    "max_documents": POSITIVE,
    "tokenizer": NON_EMPTY,
    "vocab_size": POSITIVE,
    "max_seq_length": SEQ_LEN,
    "short_seq_prob": FRACTION,
    "validation_fraction": within(0, 1, hi_open=True),
    "seed": NON_NEGATIVE,
}


@dataclasses.dataclass(frozen=True)
class PhonebookSettings:
    """task.name: phonebook — generated phone books (Birdie §4.3, A.9): the paper finetunes on books of 8-800
    entries with 1-32 queried numbers packed to 16,384 tokens; books are shrunk to fit task.max_seq_length."""

    train_books: int = 8000  # 250 steps × batch 32 sees ≥ 8,000 packed books at the paper's length
    validation_books: int = 64
    entries: list[int] = dataclasses.field(default_factory=lambda: [8, 800])  # [lo, hi]
    queries: list[int] = dataclasses.field(default_factory=lambda: [1, 32])  # [lo, hi]
    form: Literal["qcq", "qc", "cq"] = "qcq"  # question-book-question (the paper's), question first, book first
    digits: int = 10  # the paper's DDD-DDD-DDDD; fewer: one run of digits (a design small models can learn)


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """A finetuning task: a known name, or local files with named columns."""

    # a known task (see `ssmlm finetune --help`), e.g. builtin-order, sst2, mnli; with train_file another name names
    # the local task (None: the training file's name without its split, polarity-train.csv: polarity)
    name: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    data_dir: str | None = None  # directory in the task's file layout (e.g. GLUE TSVs)
    # one column (single sentence) or two (sentence pair); None: the known task's, else 'sentence'. Without a
    # header (header: false): 0-based positions, by default every column but the label
    text_fields: list[str | int] | None = None
    # None: the known task's, else 'label'; without a header a 0-based position, by default the last column. Its
    # values may be of any kind (-1/1, 0/1, pos/neg): classes are their sorted distinct values in the training file
    label_field: str | int | None = None
    num_labels: int | None = None  # 1 means regression; None: the training file's distinct labels (must equal them)
    header: bool = True  # csv/tsv: the first row names the columns; false (--no-header): columns by position
    # no validation file (a local task): this fraction of the training rows is held out, picked by train.seed
    validation_fraction: float = 0.1
    max_seq_length: int | None = None  # None: the checkpoint's max_seq_length
    padding: Literal["max_length", "longest"] = "max_length"  # official BiGS: every input padded to the length
    phonebook: PhonebookSettings = dataclasses.field(default_factory=PhonebookSettings)  # name: phonebook (LMs)
    validation_examples: int = 256  # instruct without a validation file: this many training pairs held out


_COLUMN = Rule(lambda v: not isinstance(v, int) or v >= 0, "a column name or a 0-based position")
_LO_HI = Rule(lambda v: len(v) == 2 and 1 <= v[0] <= v[1], "[lo, hi] with 1 <= lo <= hi")

# task.<field> -> its allowed values ('phonebook.x': a field of the phonebook subsection)
TASK_RANGES: dict[str, Rule] = {
    "num_labels": POSITIVE,
    "phonebook.train_books": POSITIVE,
    "phonebook.validation_books": POSITIVE,
    "phonebook.entries": _LO_HI,
    "phonebook.queries": _LO_HI,
    "phonebook.digits": Rule(lambda v: 1 <= v <= 10, "1 to 10"),
    "validation_examples": NON_NEGATIVE,
    "validation_fraction": within(0, 1, hi_open=True),
    "max_seq_length": SEQ_LEN,
    "text_fields": Rule(
        lambda v: 1 <= len(v) <= 2 and all(_COLUMN.ok(c) for c in v), "one or two column names (or 0-based positions)"
    ),
    "label_field": _COLUMN,
}
