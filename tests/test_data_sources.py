"""Corpus sources, tokenizers and finetuning tasks, read the way a user would point ssmlm at them."""

import json
import subprocess
import sys

import pytest
from conftest import english_lines

from ssmlm.data.preprocess import preprocess, read_metadata
from ssmlm.data.sources import builtin_corpus, load_corpus
from ssmlm.data.tasks import builtin_task, encode, load_task
from ssmlm.data.tokenizer import load_tokenizer, special_ids, train_wordpiece
from ssmlm.errors import DataError
from ssmlm.recipe import DataConfig, TaskConfig


def test_builtin_corpus_is_real_prose():
    corpus = builtin_corpus()
    text = " ".join(" ".join(d) for d in corpus.documents)
    assert len(text) > 1_000_000
    words = text.lower().split()
    # common English function words are frequent: this is prose, not code
    for w in ("the", "of", "is", "to", "a"):
        assert words.count(w) > 5000, w


def test_local_sources_jsonl_csv_parquet(tmp_path):
    import pandas as pd

    lines = english_lines(60)
    df = pd.DataFrame({"body": lines, "other": range(60)})
    df.to_json(tmp_path / "a.jsonl", orient="records", lines=True)
    df.to_csv(tmp_path / "b.csv", index=False)
    df.to_parquet(tmp_path / "c.parquet")
    for name in ("a.jsonl", "b.csv", "c.parquet"):
        c = load_corpus(str(tmp_path / name), text_field="body")
        assert len(c.documents) == 60 and c.documents[0] == [lines[0]]
    with pytest.raises(DataError, match="no column 'text'"):
        load_corpus(str(tmp_path / "b.csv"))
    both = load_corpus(str(tmp_path / "*.jsonl"), text_field="body")
    assert len(both.documents) == 60


def test_hub_source_offline_is_one_clear_error():
    with pytest.raises(DataError, match="offline mode is on"):
        load_corpus("hub:wikitext:wikitext-2-raw-v1")


def test_trained_tokenizer_adds_cls_sep_and_pairs():
    tok = train_wordpiece(english_lines(300), vocab_size=200)
    ids = special_ids(tok)
    assert ids == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    enc = tok.encode("The cat saw the river.", "A dog found the garden.")
    assert enc.ids[0] == ids["cls"] and enc.ids.count(ids["sep"]) == 2 and enc.ids[-1] == ids["sep"]
    assert set(enc.type_ids) == {0, 1}


def test_vocab_txt_loads_like_bert(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = load_tokenizer(tmp_path / "vocab.txt")
    enc = tok.encode("The cats sat on the mat.")
    assert enc.tokens == ["[CLS]", "the", "cat", "##s", "sat", "on", "the", "mat", ".", "[SEP]"]
    (tmp_path / "bad.txt").write_text("a\nb\n")
    with pytest.raises(DataError, match="missing special tokens"):
        load_tokenizer(tmp_path / "bad.txt")


def test_preprocess_with_a_given_vocab(tmp_path, monkeypatch):
    monkeypatch.setenv("SSMLM_HOME", str(tmp_path / "home"))
    words = sorted({w.strip(".").lower() for line in english_lines(200) for w in line.split()})
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]))
    (tmp_path / "corpus.txt").write_text("\n".join(english_lines(200)))
    cfg = DataConfig(source=str(tmp_path / "corpus.txt"), tokenizer=str(tmp_path / "vocab.txt"))
    out = preprocess(cfg, 32, quiet=True)
    meta = read_metadata(out)
    assert meta["vocab_size"] == len(words) + 6
    from ssmlm.data.shards import TokenRows

    ids = TokenRows(out, "train")[:]["tokens"]
    assert (ids[:, 0] == 2).all()  # every sequence starts with [CLS]
    assert 1 not in ids  # every word is in the vocabulary: no [UNK]


@pytest.mark.parametrize("name", ["builtin-order", "builtin-next"])
def test_builtin_tasks(name):
    splits = builtin_task(name, n_train=200, n_validation=50)
    assert len(splits["train"]["label"]) == 200 and len(splits["validation"]["label"]) == 50
    assert sum(splits["train"]["label"]) == 100  # balanced
    if name == "builtin-order":
        pos = [s for s, y in zip(splits["train"]["sentence"], splits["train"]["label"], strict=True) if y == 1]
        neg = [s for s, y in zip(splits["train"]["sentence"], splits["train"]["label"], strict=True) if y == 0]
        assert all(s[0].isupper() and s.endswith(".") for s in pos)
        assert sum(s.endswith(".") for s in neg) < len(neg)  # shuffled words move the final period
    else:
        assert set(splits["train"]) == {"first", "second", "label"}


def test_task_from_local_files_with_string_labels(tmp_path):
    rows = [
        {"p": f"{a}", "h": f"{b}", "y": "yes" if i % 2 else "no"}
        for i, (a, b) in enumerate(zip(english_lines(20), english_lines(20, 1), strict=True))
    ]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TaskConfig(
        train_file=str(tmp_path / "train.jsonl"),
        validation_file=str(tmp_path / "dev.jsonl"),
        text_fields=["p", "h"],
        label_field="y",
    )
    data = load_task(cfg)
    assert data.label_names == ["no", "yes"] and data.splits["train"]["y"][:2] == [0, 1]
    tok = train_wordpiece(english_lines(300), vocab_size=200)
    arr = encode(data, "validation", tok, 24)
    assert arr["input_ids"].shape == (20, 24) and arr["token_type_ids"].max() == 1
    assert (arr["attention_mask"].sum(1) == (arr["input_ids"] != 0).sum(1)).all()
    with pytest.raises(DataError, match="missing column"):
        load_task(TaskConfig(train_file=str(tmp_path / "train.jsonl"), text_fields=["p", "q"], label_field="y"))


def test_cli_help_does_not_import_heavy_libraries():
    code = "import sys, ssmlm.cli; print(sorted(m for m in ('jax', 'flax', 'datasets', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
