"""SQuAD: official-script scores on hand-worked cases, windowed features, span decoding, 2.0 null answers."""

import json
import re

import numpy as np
import pytest
from conftest import english_lines
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from ssmlm.data.squad import (
    MODEL_KEYS,
    _max_context,
    build_squad_features,
    decode_spans,
    read_squad_json,
    squad_from_hub,
)
from ssmlm.data.tokenizer import train_wordpiece
from ssmlm.errors import DataError
from ssmlm.evaluate.squad_metrics import exact_match, f1, normalize_answer, squad_scores

# ----------------------------------------------------------------------------- metrics


def test_normalisation():
    # lower → drop punctuation ("brown-fox" → "brownfox") → drop articles → single spaces
    assert normalize_answer("The  Quick, brown-fox!") == "quick brownfox"
    assert normalize_answer("  An apple\ta day ") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # 'the' only as a whole word
    assert normalize_answer("A.") == ""


def test_exact_match_and_f1_by_hand():
    assert exact_match("the Eiffel Tower", "Eiffel tower.") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    # pred {big, red, dog}, gold {red, dog, ran}: 2 shared, P = R = 2/3, F1 = 2/3
    assert f1("the big red dog", "a red dog ran") == pytest.approx(2 / 3)
    # pred {in, 1990s} vs gold {1990s}: P 1/2, R 1 → F1 2/3
    assert f1("in 1990s", "1990s") == pytest.approx(2 / 3)
    # repeated tokens count with multiplicity: pred {a..} → {x, x, y} vs {x, y, y}: shared x, y = 2, F1 = 2/3
    assert f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1("cat", "dog") == 0.0
    # empty vs empty: 1 in v2.0, 0 in the v1.1 script
    assert f1("", "the", version_2=True) == 1.0 and f1("", "", version_2=False) == 0.0
    assert f1("", "dog") == 0.0 and f1("dog", "") == 0.0


def ex(qid, answers, context="c"):
    return {
        "id": qid,
        "question": "q",
        "context": context,
        "answers": {"text": answers, "answer_start": [0] * len(answers)},
    }


def test_squad_scores_v1_max_over_golds():
    examples = [
        ex("a", ["Broncos", "the Denver Broncos"]),  # EM 1 (second gold), F1 1
        ex("b", ["1990s", "the early 1990s"]),  # "in 1990s": EM 0; F1 max(2/3, 1/2) = 2/3
        ex("c", ["Paris"]),  # missing prediction: 0, 0
    ]
    s = squad_scores({"a": "Denver Broncos", "b": "in 1990s"}, examples)
    assert s["exact_match"] == pytest.approx(100 / 3)
    assert s["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert s["total"] == 3 and "HasAns_f1" not in s  # no unanswerable question: scored as v1.1


def test_squad_scores_v2_no_answer():
    examples = [ex("a", ["red dog"]), ex("b", []), ex("c", []), ex("d", ["cat"])]
    preds = {"a": "the red dog", "b": "", "c": "a guess", "d": ""}
    s = squad_scores(preds, examples)
    # a: EM 1 F1 1; b: empty for no-answer EM 1 F1 1; c: answered a no-answer 0/0; d: empty for an answer 0/0
    assert s["exact_match"] == 50.0 and s["f1"] == 50.0
    assert (s["HasAns_exact_match"], s["HasAns_total"]) == (50.0, 2)
    assert (s["NoAns_f1"], s["NoAns_total"]) == (50.0, 2)


# ----------------------------------------------------------------------------- reading


def test_read_official_json(tmp_path):
    data = {
        "version": "v2.0",
        "data": [
            {
                "title": "T",
                "paragraphs": [
                    {
                        "context": "Red dogs run.",
                        "qas": [
                            {
                                "id": "1",
                                "question": "What runs?",
                                "answers": [{"text": "Red dogs", "answer_start": 0}],
                                "is_impossible": False,
                            },
                            {
                                "id": "2",
                                "question": "Why?",
                                "answers": [],
                                "is_impossible": True,
                                "plausible_answers": [{"text": "run", "answer_start": 9}],
                            },
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(data))
    rows = read_squad_json(tmp_path / "dev-v2.0.json")
    assert rows[0] == {
        "id": "1",
        "title": "T",
        "question": "What runs?",
        "context": "Red dogs run.",
        "answers": {"text": ["Red dogs"], "answer_start": [0]},
    }
    assert rows[1]["answers"] == {"text": [], "answer_start": []}  # plausible answers are not golds
    with pytest.raises(DataError, match="no such file"):
        read_squad_json(tmp_path / "nope.json")


def test_hub_offline_is_a_clear_error():
    with pytest.raises(DataError, match="rajpurkar/squad"):
        squad_from_hub(False, "validation")


# ----------------------------------------------------------------------------- features and decoding


@pytest.fixture(scope="module")
def squad_setup():
    lines = english_lines(80, seed=3)
    tok = train_wordpiece(lines * 3, vocab_size=300)
    context = " ".join(lines[:40])  # a few hundred tokens: many windows at max_len 64
    examples = []
    for k, m in enumerate(list(re.finditer(r"\b\w+ \w+\b", context))[::37]):
        examples.append(
            {
                "id": f"q{k}",
                "question": f"Where is answer number {k} in this long text?",
                "context": context,
                "answers": {"text": [m.group()], "answer_start": [m.start()]},
            }
        )
    examples.append(
        {
            "id": "none",
            "question": "Unanswerable?",
            "context": context,
            "answers": {"text": [], "answer_start": []},
        }
    )
    feats = build_squad_features(examples, tok, max_len=64, doc_stride=16, max_query_len=8)
    return tok, examples, feats


def test_features_shapes_windows_and_answers(squad_setup):
    tok, examples, f = squad_setup
    n = len(f["input_ids"])
    assert f["input_ids"].shape == f["token_type_ids"].shape == f["attention_mask"].shape == (n, 64)
    assert f["offsets"].shape == (n, 64, 2) and f["start_positions"].shape == (n,)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    assert (f["input_ids"][:, 0] == cls).all()
    assert ((f["input_ids"] != 0) == (f["attention_mask"] == 1)).all()  # padding is 0 and unattended
    q_len = (f["input_ids"] == sep).argmax(1) - 1
    assert q_len.max() <= 8  # the question is cut to max_query_len
    n_ctx = len(tok.encode(examples[0]["context"], add_special_tokens=False).ids)
    for i, e in enumerate(examples):
        rows = np.flatnonzero(f["example_index"] == i)
        room = 64 - q_len[rows[0]] - 3
        assert len(rows) == 1 + -(-(n_ctx - room) // 16)  # windows start every doc_stride = 16 tokens
        # Every context token is in some window.
        covered = {tuple(o) for r in rows for o in f["offsets"][r] if o[0] >= 0}
        assert len(covered) == n_ctx
        hits = 0
        for r in rows:
            s, t = f["start_positions"][r], f["end_positions"][r]
            assert (s == 0) == (t == 0) and s <= t
            if s:
                off = f["offsets"][r]
                assert e["context"][off[s, 0] : off[t, 1]] == e["answers"]["text"][0]
                assert (f["token_type_ids"][r, s : t + 1] == 1).all()
                hits += 1
        assert hits >= (1 if e["answers"]["text"] else 0)
        if not e["answers"]["text"]:
            assert hits == 0


def test_tokenizer_settings_are_restored(squad_setup):
    tok, examples, _ = squad_setup
    tok.enable_truncation(max_length=7)
    build_squad_features(examples[:1], tok, max_len=64, doc_stride=16)
    assert tok.truncation["max_length"] == 7 and tok.padding is None
    tok.no_truncation()


def peaked_logits(f):
    """Small noise everywhere, a clear peak at the gold start/end in every window that holds it."""
    rng = np.random.default_rng(0)
    start = rng.normal(0, 0.1, f["input_ids"].shape)
    end = rng.normal(0, 0.1, f["input_ids"].shape)
    for r in range(len(start)):
        if f["start_positions"][r]:
            start[r, f["start_positions"][r]] += 10
            end[r, f["end_positions"][r]] += 10
    return start, end


def test_decode_returns_gold_text(squad_setup):
    _, examples, f = squad_setup
    start, end = peaked_logits(f)
    pad = np.full((3, start.shape[1]), -1e9)  # batch padding rows beyond the features are ignored
    preds = decode_spans(np.vstack([start, pad]), np.vstack([end, pad]), f, examples)
    for e in examples[:-1]:
        assert preds[e["id"]] == e["answers"]["text"][0]
    scores = squad_scores(preds, examples[:-1])
    assert scores["exact_match"] == 100.0 and scores["f1"] == 100.0
    with pytest.raises(ValueError, match="evaluate every feature"):  # e.g. eval cut to a few batches
        decode_spans(start[:2], end[:2], f, examples)


def test_decode_constraints(squad_setup):
    _, examples, f = squad_setup
    r = int(np.flatnonzero(f["example_index"] == 0)[0])
    keep = {k: v[r : r + 1] for k, v in f.items()}
    keep["example_index"] = np.array([0])
    ctx = np.flatnonzero(keep["offsets"][0, :, 0] >= 0)
    a, b = int(ctx[2]), int(ctx[20])
    start, end = np.full((1, 64), -10.0), np.full((1, 64), -10.0)
    start[0, b], end[0, a] = 9, 9  # the top pair has its end before its start: not a span
    start[0, 0], end[0, 0] = 50, 50  # [CLS] is never a span in v1.1
    start[0, a + 1], end[0, a + 2] = 3, 3  # the best valid pair (6 > any pair using one peak, -1)
    off = keep["offsets"][0]
    preds = decode_spans(start, end, keep, examples[:1])
    assert preds["q0"] == examples[0]["context"][off[a + 1, 0] : off[a + 2, 1]]
    # a span of 19 tokens is longer than max_answer_len = 5: a shorter one wins
    start2, end2 = np.zeros((1, 64)), np.zeros((1, 64))
    start2[0, a], end2[0, b] = 9, 9
    end2[0, a + 3] = 1
    got = decode_spans(start2, end2, keep, examples[:1], max_answer_len=5)["q0"]
    assert got == examples[0]["context"][off[a, 0] : off[a + 3, 1]]


def test_null_threshold(squad_setup):
    _, examples, f = squad_setup
    rows = np.flatnonzero(f["example_index"] == 0)
    start, end = np.zeros(f["input_ids"].shape), np.zeros(f["input_ids"].shape)
    r = next(r for r in rows if f["start_positions"][r])
    start[r, f["start_positions"][r]], end[r, f["end_positions"][r]] = 4, 4  # best span score 8
    start[rows, 0], end[rows, 0] = 5, 5  # null score 10 in every window …
    start[rows[-1], 0] = 4  # … but the minimum over windows is 9
    gold = examples[0]["answers"]["text"][0]
    decode = lambda **kw: decode_spans(start, end, f, examples[:1], **kw)["q0"]  # noqa: E731
    assert decode(version_2=True) == ""  # 9 - 8 = 1 > 0
    assert decode(version_2=True, null_threshold=0.5) == ""
    assert decode(version_2=True, null_threshold=1.5) == gold
    assert decode(version_2=False) == gold  # v1.1 always answers


# ----------------------------------------------------------------------------- max context (overlapping windows)


def word_tokenizer(words):
    """One token per whitespace word, BERT's [CLS] A [SEP] B [SEP] layout: positions are worked by hand."""
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return tok


@pytest.fixture
def sixteen_words():
    """Context w0 … w15 after a one-token question; max_len 12 leaves 8 context tokens per window, and
    doc_stride 4 gives windows w0–w7, w4–w11 and w8–w15. Context token j sits at 3 + j - window start."""
    words = [f"w{i}" for i in range(16)]
    context = " ".join(words)
    tok = word_tokenizer(["q", *words])
    example = {
        "id": "a",
        "question": "q",
        "context": context,
        "answers": {"text": ["w7"], "answer_start": [context.index("w7")]},
    }
    return example, build_squad_features([example], tok, max_len=12, doc_stride=4, max_query_len=4)


def test_max_context_by_hand(sixteen_words):
    _, f = sixteen_words
    assert len(f["input_ids"]) == 3 and "token_is_max_context" not in MODEL_KEYS  # host-side, not a model input
    # score = min(left, right) + 0.01 · 8. w4: 3 in window 0 (4 left, 3 right) vs 0 in window 1 → window 0;
    # w5: 2 vs 1 → 0; w6: 1 vs 2 → 1; w7: 0 vs 3 → 1; w8: 3 vs 0 → 1; w9: 2 vs 1 → 1; w10: 1 vs 2 → 2.
    owned = {0: range(0, 6), 1: range(6, 10), 2: range(10, 16)}
    starts = [0, 4, 8]
    for w, tokens in owned.items():
        want = np.zeros(12, bool)
        want[[3 + j - starts[w] for j in tokens]] = True
        np.testing.assert_array_equal(f["token_is_max_context"][w], want)
    # w7 is the gold answer: at the right edge of window 0 (start label 10) and max-context in window 1 (7)
    assert list(f["start_positions"]) == [10, 6, 0]


def test_every_context_token_is_max_context_in_exactly_one_window(squad_setup, sixteen_words):
    for f in (squad_setup[2], sixteen_words[1]):
        m = f["token_is_max_context"]
        assert m.dtype == bool and m.shape == f["input_ids"].shape
        assert not m[f["offsets"][..., 0] < 0].any()  # [CLS], question, [SEP], padding: never
        for i in np.unique(f["example_index"]):
            rows = np.flatnonzero(f["example_index"] == i)
            count = {}
            for r in rows:
                for pos in np.flatnonzero(f["offsets"][r, :, 0] >= 0):
                    key = tuple(f["offsets"][r, pos])
                    count[key] = count.get(key, 0) + int(m[r, pos])
            assert set(count.values()) == {1}


def test_max_context_ties():
    # token 7 in (0, 10) and (5, 6): min(7, 2) = min(2, 3) = 2; 0.01 · length favours the longer window 0
    # token 8: min(8, 1) = 1 vs min(3, 2) = 2 → window 1
    assert list(_max_context([(0, 10), (5, 6)], 11)) == [0] * 8 + [1] * 3
    # an exact tie (token 3 in two windows of 5: 1 vs 1, equal lengths) goes to the earlier window
    assert list(_max_context([(0, 5), (2, 5)], 7)) == [0, 0, 0, 0, 1, 1, 1]
    assert list(_max_context([(0, 0)], 0)) == []  # an empty context


def test_decode_starts_spans_only_in_the_max_context_window(sixteen_words):
    example, f = sixteen_words
    start, end = np.full((3, 12), -10.0), np.full((3, 12), -10.0)
    # window 0 is confident in "w6 w7" (8 + 8), but w6 and w7 sit at its right edge ...
    start[0, 3 + 6], end[0, 3 + 7] = 8.0, 8.0
    # ... window 1, where w7 has 3 tokens either side, answers "w7" (5 + 5)
    start[1, 3 + 7 - 4], end[1, 3 + 7 - 4] = 5.0, 5.0
    assert decode_spans(start, end, f, [example])["a"] == "w7"
    without = {k: v for k, v in f.items() if k != "token_is_max_context"}
    assert decode_spans(start, end, without, [example])["a"] == "w6 w7"  # without the rule window 0 wins
    # an end may still lie in a token's non-max-context window: only starts are restricted
    start2, end2 = np.full((3, 12), -10.0), np.full((3, 12), -10.0)
    start2[0, 3 + 5], end2[0, 3 + 7] = 6.0, 6.0  # w5 is max-context in window 0, w7 is not
    assert decode_spans(start2, end2, f, [example])["a"] == "w5 w6 w7"
