"""SQuAD v2 by generation (Birdie §4.4, Figure 2): contains-label and F1 on hand-made strings, the answerable
subset of a hand-written dev file, length bins, the evaluation loop on a tiny pretrained LM, and the analysis."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from conftest import invoke

from ssmlm.analyze.squad_length import analyze_squad_length
from ssmlm.data.qa import load_answerable, prompt
from ssmlm.errors import DataError, UserError
from ssmlm.evaluate import squad_metrics
from ssmlm.evaluate.qa_metrics import (
    DEFAULT_BINS,
    by_length,
    contains_label,
    contains_label_normalized,
    token_f1,
)

# --- metrics ---------------------------------------------------------------------------------------------------


def test_contains_label_is_a_literal_substring():
    assert contains_label("It was built in 1889 by Eiffel.", ["1889"]) == 1.0
    assert contains_label("It was built in 1889.", ["1890", "Eiffel"]) == 0.0
    assert contains_label("the eiffel tower", ["Eiffel Tower"]) == 0.0  # case counts
    assert contains_label("the Eiffel Tower", ["Eiffel Tower."]) == 0.0  # so does punctuation
    assert contains_label("anything", ["", "  "]) == 0.0  # an empty gold is no label
    assert contains_label("Paris", ["Paris"]) == 1.0


def test_contains_label_normalized_ignores_case_punctuation_articles():
    assert contains_label_normalized("the eiffel tower", ["Eiffel Tower"]) == 1.0
    assert contains_label_normalized("It is the Eiffel Tower!", ["The Eiffel Tower."]) == 1.0
    assert contains_label_normalized("1,000 people", ["1000"]) == 1.0  # "1,000" -> "1000"
    assert contains_label_normalized("London", ["Paris", "France"]) == 0.0
    assert contains_label_normalized("a", ["the"]) == 0.0  # "the" normalises to nothing: no label


def test_token_f1_is_squads_f1_max_over_golds():
    # "the cat sat" vs "a cat sat on it": normalised pred [cat, sat], gold [cat, sat, on, it];
    # overlap 2 -> precision 1, recall 1/2 -> F1 2/3
    assert token_f1("the cat sat", ["a cat sat on it"]) == pytest.approx(2 / 3)
    # the best gold wins: exact match on the second one
    assert token_f1("Denmark", ["Norway", "Denmark"]) == 1.0
    # verbosity is penalised: 1 of 4 tokens right -> precision 1/4, recall 1 -> F1 0.4
    assert token_f1("it was in France", ["France"]) == pytest.approx(0.4)
    for pred, golds in [("in the year 1066", ["1066", "year 1066"]), ("", ["x"]), ("Norman rule", ["Normans"])]:
        assert token_f1(pred, golds) == max(squad_metrics.f1(pred, g) for g in golds)


# --- data ------------------------------------------------------------------------------------------------------

CONTEXTS = [
    "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region in France.",
    "The Eiffel Tower was built in 1889 for the World's Fair in Paris.",
]


def qa(qid: str, question: str, answers: list[str], impossible: bool = False) -> dict:
    """One question of the official layout (answer_start values are not read by the generation task)."""
    spans = [{"text": a, "answer_start": 0} for a in answers]
    if impossible:  # v2.0: the unanswerable ones keep only plausible (non-gold) answers
        return {"id": qid, "question": question, "is_impossible": True, "answers": [], "plausible_answers": spans}
    return {"id": qid, "question": question, "is_impossible": False, "answers": spans}


def dev_json(path: Path) -> Path:
    """A dev-v2.0.json in the official layout: 2 paragraphs, 5 answerable questions and 1 unanswerable one."""
    first = [
        qa("q1", "In what country is Normandy located?", ["France", "France"]),
        qa("q2", "When were the Normans in Normandy?", ["10th and 11th centuries", "in the 10th and 11th centuries"]),
        qa("q3", "Who gave their name to Normandy in the 1000s?", ["Normans"], impossible=True),
    ]
    second = [
        qa("q4", "When was the Eiffel Tower built?", ["1889"]),
        qa("q5", "Where is the Eiffel Tower?", ["Paris"]),
        qa("q6", "Why was the tower built?", ["for the World's Fair"]),
    ]
    paragraphs = [{"context": CONTEXTS[0], "qas": first}, {"context": CONTEXTS[1], "qas": second}]
    path.mkdir(parents=True, exist_ok=True)
    data = {"version": "v2.0", "data": [{"title": "T", "paragraphs": paragraphs}]}
    (path / "dev-v2.0.json").write_text(json.dumps(data))
    return path


def test_load_answerable_drops_unanswerable(tmp_path):
    d = dev_json(tmp_path / "squad")
    items = load_answerable(str(d))
    assert [it["id"] for it in items] == ["q1", "q2", "q4", "q5", "q6"]  # q3 is unanswerable
    assert items[0] == {
        "id": "q1",
        "context": CONTEXTS[0],
        "question": "In what country is Normandy located?",
        "answers": ["France"],  # the repeated gold kept once
    }
    assert items[1]["answers"] == ["10th and 11th centuries", "in the 10th and 11th centuries"]
    # a file path works as well as its directory
    assert load_answerable(str(d / "dev-v2.0.json")) == items
    assert prompt(items[2]) == CONTEXTS[1] + "\n\nWhen was the Eiffel Tower built?"


def test_limit_is_a_seeded_subset(tmp_path):
    d = str(dev_json(tmp_path / "squad"))
    all_ids = [it["id"] for it in load_answerable(d)]
    a = [it["id"] for it in load_answerable(d, limit=3, seed=1)]
    assert a == [it["id"] for it in load_answerable(d, limit=3, seed=1)]  # deterministic
    assert len(a) == 3 and len(set(a)) == 3
    assert a == [i for i in all_ids if i in a]  # kept in file order
    draws = {tuple(it["id"] for it in load_answerable(d, limit=3, seed=s)) for s in range(8)}
    assert len(draws) > 1  # the seed matters
    assert len(load_answerable(d, limit=99)) == 5


def test_missing_local_files_and_offline_hub(tmp_path):
    with pytest.raises(DataError, match="dev-v2.0.json"):
        load_answerable(str(tmp_path))  # a directory without the file
    with pytest.raises(DataError, match="train-v2.0.json"):
        load_answerable(str(dev_json(tmp_path / "squad")), split="train")
    # conftest switches the hub off and points its cache at an empty folder
    with pytest.raises(UserError, match="--data-dir") as e:
        load_answerable(None)
    assert "\n" not in str(e.value)


# --- length bins -----------------------------------------------------------------------------------------------


def test_by_length_bins():
    recs = [
        {"context_tokens": 10, "contains": 1.0, "contains_normalized": 1.0, "f1": 0.5},
        {"context_tokens": 127, "contains": 0.0, "contains_normalized": 1.0, "f1": 0.25},
        {"context_tokens": 128, "contains": 1.0, "contains_normalized": 1.0, "f1": 1.0},
        {"context_tokens": 5000, "contains": 0.0, "contains_normalized": 0.0, "f1": 0.0},
    ]
    rows = by_length(recs)
    assert [r["bin"] for r in rows] == ["0-128", "128-256", "640+"]  # empty bins are left out
    assert [r["n"] for r in rows] == [2, 1, 1]
    assert rows[0]["contains"] == 50.0 and rows[0]["contains_normalized"] == 100.0
    assert rows[0]["f1"] == pytest.approx(37.5)
    assert rows[1]["f1"] == 100.0 and rows[2]["contains"] == 0.0
    assert rows[2]["lo"] == 640 and rows[2]["hi"] is None and math.isinf(DEFAULT_BINS[-1])
    custom = by_length(recs, bins=[0, 100, 10_000])
    assert [(r["bin"], r["n"]) for r in custom] == [("0-100", 1), ("100-10000", 3)]
    with pytest.raises(ValueError, match="outside"):
        by_length(recs, bins=[0, 100])


# --- evaluation on a tiny pretrained LM ------------------------------------------------------------------------


def test_evaluate_squad_on_a_tiny_model(tiny_lm, tmp_path):
    from ssmlm.checkpoint_eval.squad_gen import evaluate_squad
    from ssmlm.evaluate.qa_metrics import score
    from ssmlm.models.decode import Sampling
    from ssmlm.runs.generate import load_generator

    gen = load_generator(tiny_lm)
    items = load_answerable(str(dev_json(tmp_path / "squad")), limit=3, seed=0)
    out = evaluate_squad(gen, items, max_new_tokens=5, progress=False)
    recs = out["records"]
    assert [r["id"] for r in recs] == [it["id"] for it in items]
    for r, it in zip(recs, items, strict=True):
        # the context length is counted with the run's own tokenizer
        assert r["context_tokens"] == len(gen.tokenizer.encode(it["context"], add_special_tokens=False).ids)
        # greedy, "{context}\n\n{question}", 5 new tokens at most, cut at a blank line
        assert r["prediction"] == gen(f"{it['context']}\n\n{it['question']}", Sampling(max_new_tokens=5), ["\n\n"])
        assert "\n\n" not in r["prediction"]
        assert {k: r[k] for k in ("contains", "contains_normalized", "f1")} == score(r["prediction"], it["answers"])
    m = out["metrics"]
    assert m["items"] == 3
    assert m["contains_label"] == pytest.approx(100 * sum(r["contains"] for r in recs) / 3)
    assert m["contains_label_normalized"] == pytest.approx(100 * sum(r["contains_normalized"] for r in recs) / 3)
    assert m["f1"] == pytest.approx(100 * sum(r["f1"] for r in recs) / 3)
    assert sum(b["n"] for b in out["by_length"]) == 3
    # An untrained model answers nothing right; make the first item's gold its own answer and the summary
    # must read 1 of 3 right (the other golds are absent from any answer).
    first = recs[0]["prediction"]
    assert squad_metrics.normalize_answer(first), "the tiny model's answer normalises to nothing"
    rigged = [{**items[0], "answers": [first]}] + [{**it, "answers": ["zzzz"]} for it in items[1:]]
    m = evaluate_squad(gen, rigged, max_new_tokens=5, progress=False)["metrics"]
    assert m["contains_label"] == m["contains_label_normalized"] == m["f1"] == pytest.approx(100 / 3)


# --- analysis --------------------------------------------------------------------------------------------------


def write_eval(run_dir: Path, name: str, by_len: list[dict]) -> None:
    (run_dir / "eval").mkdir(parents=True, exist_ok=True)
    result = {
        "run": name,
        "task": "squad_v2",
        "metrics": {"contains_label": 1.0, "f1": 2.0, "items": 3},
        "by_length": by_len,
        "records": [],
    }
    (run_dir / "eval" / "squad_v2-validation.json").write_text(json.dumps(result))


def test_analyze_squad_length_csv(tmp_path):
    recs_a = [
        {"context_tokens": 50, "contains": 1.0, "contains_normalized": 1.0, "f1": 0.5},
        {"context_tokens": 300, "contains": 0.0, "contains_normalized": 1.0, "f1": 0.2},
        {"context_tokens": 310, "contains": 1.0, "contains_normalized": 1.0, "f1": 0.4},
    ]
    recs_b = [{"context_tokens": 700, "contains": 1.0, "contains_normalized": 1.0, "f1": 1.0}]
    write_eval(tmp_path / "a", "birdie", by_length(recs_a))
    write_eval(tmp_path / "b", "clm", by_length(recs_b))
    # an unrelated eval file in the run does not confuse it
    (tmp_path / "a" / "eval" / "lm-validation.json").write_text("{}")
    out = analyze_squad_length([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    assert Path(out["plot"]).stat().st_size > 0
    with open(out["data"]) as f:
        rows = list(csv.DictReader(f))
    assert [(r["run"], r["bin"], int(r["n"])) for r in rows] == [
        ("birdie", "0-128", 1),
        ("birdie", "256-384", 2),
        ("clm", "640+", 1),
    ]
    assert float(rows[1]["contains"]) == 50.0 and float(rows[1]["contains_normalized"]) == 100.0
    assert float(rows[1]["f1"]) == pytest.approx(30.0)
    assert float(rows[0]["f1"]) == 50.0 and rows[2]["hi"] == ""


def test_analyze_cli_and_missing_evaluation(tmp_path):
    write_eval(
        tmp_path / "a",
        "birdie",
        [{"bin": "0-128", "lo": 0, "hi": 128, "n": 2, "contains": 50.0, "contains_normalized": 50.0, "f1": 25.0}],
    )
    invoke("analyze", "squad-length", "--ckpt", tmp_path / "a", "--out", tmp_path / "o")
    assert (tmp_path / "o" / "squad_length.png").is_file()
    (tmp_path / "bare").mkdir()
    r = invoke("analyze", "squad-length", "--ckpt", tmp_path / "a", "--ckpt", tmp_path / "bare", code=None)
    assert r.exit_code != 0 and "bare" in r.output and "squad_v2" in r.output and "Traceback" not in r.output
