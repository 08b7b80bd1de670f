"""Instruction-tuning pairs (Birdie App. A.2): every local layout converts to prompt/response, bad lines name
FILE:LINE, subsets are seeded, and a hub source offline fails in one line naming the local-file way out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ssmlm.data.instruct import load_pairs
from ssmlm.errors import DataError, UserError


def jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_prompt_response_layout(tmp_path):
    f = jsonl(tmp_path / "a.jsonl", [{"prompt": "Say hi.", "response": "Hi!"}, "", {"prompt": "2+2?", "response": "4"}])
    assert load_pairs(str(f)) == [{"prompt": "Say hi.", "response": "Hi!"}, {"prompt": "2+2?", "response": "4"}]


def test_alpaca_and_flan_layouts(tmp_path):
    f = jsonl(
        tmp_path / "b.jsonl",
        [
            {"instruction": "Translate to French.", "input": "cat", "output": "chat"},
            {"instruction": "Name a colour.", "input": "", "output": "Blue"},
            {"inputs": "Premise: x. Is it true?", "targets": "yes"},
            {"inputs": "Summarise: y", "target": "y"},
        ],
    )
    assert load_pairs(str(f)) == [
        {"prompt": "Translate to French.\n\ncat", "response": "chat"},
        {"prompt": "Name a colour.", "response": "Blue"},  # no input: no blank line
        {"prompt": "Premise: x. Is it true?", "response": "yes"},
        {"prompt": "Summarise: y", "response": "y"},
    ]


def test_sharegpt_conversations_first_human_then_first_gpt(tmp_path):
    conv = {
        "conversations": [
            {"from": "system", "value": "You are helpful."},
            {"from": "gpt", "value": "(a stray turn before any human one)"},
            {"from": "human", "value": "What is 3*3?"},
            {"from": "gpt", "value": "9"},
            {"from": "human", "value": "And 4*4?"},
            {"from": "gpt", "value": "16"},
        ],
        "source": "x",
    }
    # a .json file holding a list of records works as well as JSON lines
    f = tmp_path / "c.json"
    f.write_text(json.dumps([conv]))
    assert load_pairs(str(f)) == [{"prompt": "What is 3*3?", "response": "9"}]


@pytest.mark.parametrize(
    "bad,why",
    [
        ("{not json", "not a JSON object"),
        ('["a list"]', "expected a JSON object"),
        ('{"question": "q", "answer": "a"}', "unknown layout"),
        ('{"prompt": "p", "response": 3}', "'response' is int"),
        ('{"prompt": "p", "response": "  "}', "empty response"),
        ('{"conversations": [{"from": "human", "value": "hi"}]}', "no gpt turn"),
        ('{"conversations": "hi"}', "list of"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, bad, why):
    f = jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "response": "r"}, "", bad])
    with pytest.raises(DataError, match=why) as e:
        load_pairs(str(f))
    assert str(e.value).startswith(f"{f}:3: ")  # line 3: blank lines count
    assert "\n" not in str(e.value)


def test_bad_record_in_json_list_and_empty_file(tmp_path):
    f = tmp_path / "l.json"
    f.write_text(json.dumps([{"prompt": "p", "response": "r"}, {"x": 1}]))
    with pytest.raises(DataError, match=r"l\.json:record 1: unknown layout"):
        load_pairs(str(f))
    with pytest.raises(DataError, match="no records"):
        load_pairs(str(jsonl(tmp_path / "e.jsonl", [""])))


def test_limit_is_a_seeded_subset_in_file_order(tmp_path):
    recs = [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(20)]
    f = str(jsonl(tmp_path / "n.jsonl", recs))
    a = load_pairs(f, limit=5, seed=3)
    assert a == load_pairs(f, limit=5, seed=3)
    assert len(a) == 5 and a == [r for r in recs if r in a]
    assert len({tuple(p["prompt"] for p in load_pairs(f, limit=5, seed=s)) for s in range(6)}) > 1
    assert load_pairs(f, limit=100) == recs


@pytest.mark.parametrize("source", ["flan", "openhermes", "someone/some-instructions"])
def test_hub_offline_is_one_line_naming_the_local_file_option(source):
    # conftest switches the hub off and gives it an empty cache
    with pytest.raises(UserError, match="local .jsonl/.json file") as e:
        load_pairs(source)
    assert "\n" not in str(e.value) and "offline" in str(e.value)


def test_unknown_source(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_pairs(str(tmp_path / "missing.jsonl"))
