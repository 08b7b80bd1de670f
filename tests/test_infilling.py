"""Story infilling: the file format and its errors, the synthetic generator, the paper's prompt, and that the
evaluation picks the choice with the highest per-token log-likelihood, computed here independently."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import english_lines

from ssmlm.checkpoint_eval.infilling import choose, evaluate_infilling
from ssmlm.data.infilling import (
    BLANK,
    CHAINS,
    InfillingItem,
    option,
    prompt,
    read_jsonl,
    synthetic_items,
    write_jsonl,
)
from ssmlm.data.reserved import PARADIGMS, START
from ssmlm.data.tokenizer import train_byte_bpe
from ssmlm.errors import DataError
from ssmlm.models import build_lm
from ssmlm.models.config import ModelConfig
from ssmlm.recipe import Recipe
from ssmlm.runs import Run
from ssmlm.runs.generate import Generator
from ssmlm.runs.scoring import continuation_logprobs


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    """A Birdie-style generator (prompt in the bidirectional prefix, led by the prefix-LM paradigm token) over a
    tiny random gated SSM and a byte-level BPE trained on the stories' own words."""
    texts = english_lines(200) + [prompt(i) for i in synthetic_items(30, seed=9)]
    tok = train_byte_bpe(texts, 400)
    cfg = ModelConfig(
        arch="gated_ssm",
        hidden_size=32,
        num_layers=2,
        state_size=32,
        vocab_size=tok.get_vocab_size(),
        dropout=0.0,
        initializer_range=0.3,
        max_seq_length=512,
    )
    run = Run(tmp_path_factory.mktemp("infilling"), Recipe(), {"kind": "pretrain"})
    return Generator(run, build_lm(cfg, seed=2), tok, "prefix")


def test_prompt_is_the_papers():
    item = InfillingItem(
        ("A stranger hands a letter to Ellie.", BLANK, "She sails to the island."),
        ("It is a bill.", "She burns it.", "It holds a map.", "She moves away."),
        2,
    )
    assert prompt(item) == (
        "Consider the following sequence of events, then select a choice that best fills in the missing entry:\n"
        "\n"
        "1. A stranger hands a letter to Ellie.\n"
        "2. (blank)\n"
        "3. She sails to the island.\n"
        "\n"
        "Choices:\n"
        "(A) It is a bill.\n"
        "(B) She burns it.\n"
        "(C) It holds a map.\n"
        "(D) She moves away.\n"
        "\n"
        "Which choice best fills in the missing entry?"
    )
    assert option(item, 2) == "(C) It holds a map."


def test_file_round_trip_and_answer_forms(tmp_path):
    items = synthetic_items(5, seed=2)
    assert read_jsonl(write_jsonl(items, tmp_path / "a.jsonl")) == items
    raw = {"events": ["a", BLANK, "c"], "choices": ["w", "x", "y", "z"]}
    lines = [{**raw, "label": "C"}, {**raw, "answer": "b"}, {**raw, "label": 3}, {}]
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(x) for x in lines[:3]) + "\n\n")
    assert [i.answer for i in read_jsonl(tmp_path / "b.jsonl")] == [2, 1, 3]


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"events": ["a", "b", "c"]}, "exactly one '(blank)'; found 0"),
        ({"events": ["a", BLANK, BLANK]}, "exactly one '(blank)'; found 2"),
        ({"events": ["a", BLANK]}, "has 2 entries; expected 3 to 7"),
        ({"events": ["a", BLANK, "c", "d", "e", "f", "g", "h"]}, "has 8 entries"),
        ({"choices": ["w", "x", "y"]}, "'choices' must be a list of 4"),
        ({"answer": "E"}, "'answer' is 'E'; expected 0-3 or 'A'-'D'"),
        ({"answer": 4}, "'answer' is 4"),
        ({"answer": True}, "'answer' is True"),
    ],
)
def test_bad_items_name_file_and_line(tmp_path, bad, message):
    good = {"events": ["a", BLANK, "c"], "choices": ["w", "x", "y", "z"], "answer": 0}
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, **bad}) + "\n")
    with pytest.raises(DataError, match=f"bad.jsonl:2: .*{message}".replace("(", r"\(").replace(")", r"\)")):
        read_jsonl(p)


def test_unreadable_lines(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text("{not json\n")
    with pytest.raises(DataError, match=r"x.jsonl:1: not valid JSON"):
        read_jsonl(p)
    p.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"x.jsonl:1: expected a JSON object"):
        read_jsonl(p)
    with pytest.raises(DataError, match="no such infilling file"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_synthetic_items_are_valid_deterministic_and_have_one_right_choice(tmp_path):
    items = synthetic_items(40, seed=1)
    assert items == synthetic_items(40, seed=1) and items != synthetic_items(40, seed=2)
    assert read_jsonl(write_jsonl(items, tmp_path / "s.jsonl")) == items  # every item passes validation
    assert {i.answer for i in items} == {0, 1, 2, 3} and {len(i.events) for i in items} >= {3, 7}
    for item in items:
        name = next(e for e in item.events if e != BLANK).split()[0]
        chain = next(c for c in CHAINS if any(e.format(name=name) in item.events for e in c))
        story = [e.format(name=name) for e in chain]
        assert [c in story for c in item.choices] == [i == item.answer for i in range(4)]
        # the right choice is the blanked event: the events are a window of the chain, in order
        filled = list(item.events)
        filled[item.blank] = item.choices[item.answer]
        start = story.index(filled[0])
        assert filled == story[start : start + len(filled)]


def test_chosen_choice_is_the_best_per_token_loglikelihood(generator):
    items = synthetic_items(3, seed=5)
    out = evaluate_infilling(generator, items, batch_size=4, quiet=True)
    assert out["metrics"]["items"] == 3
    assert out["metrics"]["accuracy"] == pytest.approx(np.mean([r["correct"] for r in out["records"]]))
    for item, record in zip(items, out["records"], strict=True):
        # each choice laid out by hand: the prompt and a newline in the prefix, START, then "(X) choice"
        prefix, causal = generator.layout(prompt(item) + "\n")
        assert prefix[0] == generator.tokenizer.token_to_id(PARADIGMS["prefix_lm"]) and causal == [
            generator.tokenizer.token_to_id(START)
        ]
        conts = [generator.tokenizer.encode(option(item, i), add_special_tokens=False).ids for i in range(4)]
        scores = [continuation_logprobs(generator.model, [(prefix, causal, c)], batch_size=1)[0] for c in conts]
        mean = [lp / len(c) for (lp, n, _), c in zip(scores, conts, strict=True)]
        assert [n for _, n, _ in scores] == [len(c) for c in conts]
        np.testing.assert_allclose(record["scores"], mean, atol=1e-5)
        assert record["chosen"] == int(np.argmax(mean)) and record["answer"] == item.answer
        assert record["correct"] == (record["chosen"] == item.answer)
    # and the selection itself, on hand-made scores: per-token, not summed
    assert choose([(-6.0, 2, False), (-4.0, 1, False), (-9.0, 6, True), (-2.0, 1, False)]) == (
        2,
        [-3.0, -4.0, -1.5, -2.0],
    )
