"""SCROLLS QuALITY / ContractNLI: reading the jsonl format, features, truncation, labels, exact match."""

import json
import zipfile

import numpy as np
import pytest
from conftest import english_lines

from ssmlm.data.scrolls import (
    contract_nli_task,
    encode_quality,
    parse_quality,
    read_scrolls,
    scrolls_exact_match,
    scrolls_from_hub,
)
from ssmlm.data.tasks import encode
from ssmlm.data.tokenizer import train_wordpiece
from ssmlm.errors import DataError

OPTIONS = ["the red ball", "a quiet  house", "the river", "an open window"]


def quality_row(i, story, gold=None, options=OPTIONS):
    opts = "".join(f" ({letter}) {o}\n" for letter, o in zip("ABCD", options, strict=True))
    return {
        "id": f"qa{i}",
        "pid": f"qa{i}_0",
        "input": f"What did the cat see {i}?\n\n{opts}\n\n\n{story}",
        "output": gold if gold is not None else options[i % 4],
    }


def cnli_row(i, label, doc):
    return {
        "id": f"c{i}",
        "pid": f"c{i}_0",
        "input": f"The party may share data {i}.\n\n{doc}",
        "output": label,
    }


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_rows(rows):
    """Rows as read_scrolls returns them (outputs merged), without touching disk."""
    return [
        {"id": r["id"], "pid": r["pid"], "input": r["input"], "outputs": [r["output"]] if r["output"] else []}
        for r in rows
    ]


@pytest.fixture(scope="module")
def tok():
    return train_wordpiece(english_lines(300) + OPTIONS * 20, vocab_size=300)


def test_read_merges_references_and_reads_zip(tmp_path):
    rows = [cnli_row(0, "Entailment", "Doc."), cnli_row(0, "Entailment", "Doc."), cnli_row(1, "", "Doc.")]
    write_jsonl(tmp_path / "validation.jsonl", rows)
    got = read_scrolls(tmp_path, "validation")  # a folder of {split}.jsonl
    assert [r["id"] for r in got] == ["c0", "c1"]
    assert got[0]["outputs"] == ["Entailment", "Entailment"] and got[1]["outputs"] == []  # hidden test label
    with zipfile.ZipFile(tmp_path / "contract_nli.zip", "w") as z:  # the hub's archive layout
        z.write(tmp_path / "validation.jsonl", "contract_nli/validation.jsonl")
    assert read_scrolls(tmp_path / "contract_nli.zip", "validation") == got
    with pytest.raises(DataError, match="no train.jsonl"):
        read_scrolls(tmp_path / "contract_nli.zip", "train")
    with pytest.raises(DataError, match="no such file"):
        read_scrolls(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n')
    with pytest.raises(DataError, match="line 1"):
        read_scrolls(tmp_path / "bad.jsonl")


def test_hub_offline_is_a_clear_error():
    with pytest.raises(DataError, match="tau/scrolls quality.zip"):
        scrolls_from_hub("quality", "validation")


def test_quality_parsing():
    story = "Chapter one.\n\nThe cat saw the river."
    ex = parse_quality(read_rows([quality_row(2, story)])[0])
    assert ex["question"] == "What did the cat see 2?"
    assert ex["options"] == [
        "the red ball",
        "a quiet house",
        "the river",
        "an open window",
    ]  # spaces collapsed
    assert ex["story"] == story and ex["label"] == 2
    assert parse_quality(read_rows([quality_row(1, story, gold="a quiet house")])[0])["label"] == 1
    assert parse_quality(read_rows([quality_row(1, story, gold="")])[0])["label"] == -1  # test split
    with pytest.raises(DataError, match="none of the options"):
        parse_quality(read_rows([quality_row(1, story, gold="a dog")])[0])
    with pytest.raises(DataError, match="found 3 options"):
        bad = quality_row(1, story)
        bad["input"] = bad["input"].replace(" (B) ", " ")
        parse_quality(read_rows([bad])[0])


def test_quality_features(tok):
    long_story = " ".join(english_lines(100, seed=1))  # far longer than max_len
    short_story = "The cat saw the river."
    examples = [parse_quality(r) for r in read_rows([quality_row(0, long_story), quality_row(3, short_story)])]
    f = encode_quality(examples, tok, max_len=48)
    assert f["input_ids"].shape == f["token_type_ids"].shape == f["attention_mask"].shape == (2, 4, 48)
    assert f["labels"].tolist() == [0, 3] and f["example_weight"].tolist() == [1.0, 1.0]
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    ids = f["input_ids"]
    assert (ids[:, :, 0] == cls).all()
    assert (f["attention_mask"][0] == 1).all() and ids[0, 0, -1] == sep  # long story: truncated to fill max_len
    story_ids = tok.encode(long_story, add_special_tokens=False).ids
    for c, opt in enumerate(examples[0]["options"]):
        first = tok.encode(f"{examples[0]['question']} {opt}", add_special_tokens=False).ids
        assert ids[0, c, 1 : 1 + len(first)].tolist() == first
        assert ids[0, c, len(first) + 1] == sep
        assert ids[0, c, len(first) + 2 : -1].tolist() == story_ids[: 48 - len(first) - 3]  # the story's start
        assert (f["token_type_ids"][0, c, : len(first) + 2] == 0).all()
        assert (f["token_type_ids"][0, c, len(first) + 2 :] == 1).all()
    # short story: padded with 0 and unattended after the final [SEP]
    n = int(f["attention_mask"][1, 2].sum())
    assert ids[1, 2, n - 1] == sep and (ids[1, 2, n:] == 0).all() and (f["token_type_ids"][1, 2, n:] == 0).all()
    assert not np.array_equal(ids[1, 0], ids[1, 1])  # the choices differ
    # a long question + option is cut to max_first_len so the story still gets room
    g = encode_quality(examples, tok, max_len=48, max_first_len=6)
    assert (g["input_ids"][:, :, 7] == sep).all()


def test_contract_nli_task_and_encoding(tmp_path, tok):
    long_doc = " ".join(english_lines(80, seed=2))
    labels = ["Not mentioned", "Entailment", "Contradiction", "Entailment"]
    train = read_scrolls(
        write_jsonl(tmp_path / "train.jsonl", [cnli_row(i, lab, long_doc) for i, lab in enumerate(labels)])
    )
    val = read_scrolls(write_jsonl(tmp_path / "validation.jsonl", [cnli_row(9, "Contradiction", "Short doc.")]))
    test = read_scrolls(write_jsonl(tmp_path / "test.jsonl", [cnli_row(8, "", "Short doc.")]))
    data = contract_nli_task({"train": train, "validation": val, "test": test})
    # sorted unique training outputs, as the official run_glue.py
    assert data.label_names == ["Contradiction", "Entailment", "Not mentioned"]
    assert data.splits["train"]["label"] == [2, 1, 0, 1] and data.splits["validation"]["label"] == [0]
    assert data.splits["test"]["label"] == [-1]
    assert data.splits["train"]["hypothesis"][0] == "The party may share data 0."
    assert data.splits["train"]["document"][0] == long_doc
    arr = encode(data, "train", tok, max_len=64)
    assert arr["input_ids"].shape == (4, 64) and (arr["attention_mask"] == 1).all()  # truncated to max_len
    hyp = tok.encode("The party may share data 0.", add_special_tokens=False).ids
    assert arr["input_ids"][0, 1 : 1 + len(hyp)].tolist() == hyp  # the hypothesis is kept whole
    assert arr["labels"].tolist() == [2, 1, 0, 1]
    short = encode(data, "validation", tok, max_len=64)
    assert short["attention_mask"][0].sum() < 64
    with pytest.raises(DataError, match="not seen in training"):
        contract_nli_task({"train": train[:1], "validation": val})


def test_exact_match():
    preds = ["Entailment", "the River", "Not mentioned", "a house"]
    refs = [["Entailment"], ["river"], ["Contradiction"], ["a quiet house", "house"]]
    assert scrolls_exact_match(preds, refs) == 75.0  # normalised (case, articles); any reference counts
    with pytest.raises(ValueError):
        scrolls_exact_match(preds[:1], refs)
