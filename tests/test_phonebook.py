"""Phone-book retrieval (Birdie §4.3): the book generator's text, determinism and fitting; prompt/response
packing and its exact-match evaluation; scoring; the evaluator on a tiny LM run; `analyze phonebook`."""

from __future__ import annotations

import csv
import dataclasses
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from conftest import english_lines, invoke

from ssmlm.data.phonebook import PhoneBook, books, make_book, read_prompt_response, render, write_jsonl
from ssmlm.data.reserved import END, PARADIGMS, START
from ssmlm.data.tokenizer import train_byte_bpe
from ssmlm.errors import DataError, UserError
from ssmlm.evaluate.retrieval import entry_bin, parse_numbers, score_book, summarize
from ssmlm.objectives.batch import make_batch
from ssmlm.objectives.prompts import PromptResponseObjective, encode_pair, segment_exact

LINE = re.compile(r"^[A-Z][A-Za-z'\-]+ [A-Z][A-Za-z'\-]+: \d{3}-\d{3}-\d{4}$")


def book_lines(book: PhoneBook) -> dict[str, str]:
    """name -> number, read back from the prompt's "Phonebook:" block."""
    block = book.prompt.split("Phonebook:\n")[1].split("\n\n")[0]
    return dict(line.split(": ") for line in block.splitlines())


# ----------------------------------------------------------------------------- the text


def test_wording_for_one_two_and_many_names():
    names = ["Ann Lee", "Bo Diaz", "Cy Young"]
    numbers = ["111-222-3333", "444-555-6666", "777-888-9999"]
    b = render(names, numbers, [2, 0], "qcq")
    assert b.prompt == (
        "What are the phone numbers for Cy Young and Ann Lee? Find them in the phonebook below.\n"
        "\n"
        "Phonebook:\n"
        "Ann Lee: 111-222-3333\n"
        "Bo Diaz: 444-555-6666\n"
        "Cy Young: 777-888-9999\n"
        "\n"
        "What are the phone numbers for Cy Young and Ann Lee? Find them in the phonebook above."
    )
    assert b.response == " 777-888-9999, 111-222-3333" and b.entries == 3 and b.queries == 2
    one = render(names, numbers, [1], "qc")
    assert one.prompt == (
        "What is the phone number for Bo Diaz? Find it in the phonebook below.\n\nPhonebook:\n"
        "Ann Lee: 111-222-3333\nBo Diaz: 444-555-6666\nCy Young: 777-888-9999"
    )
    assert one.response == " 444-555-6666"  # each number after a space, as in the book
    three = render(names, numbers, [1, 2, 0], "cq")
    assert three.prompt.startswith("Phonebook:\nAnn Lee: 111-222-3333\n")
    assert three.prompt.endswith(
        "\n\nWhat are the phone numbers for Bo Diaz, Cy Young, and Ann Lee? Find them in the phonebook above."
    )


def test_random_book_format_names_and_response_order():
    b = make_book(np.random.default_rng(0), entries=40, queries=5)
    lines = b.prompt.splitlines()
    q = f"What are the phone numbers for {', '.join(b.names[:-1])}, and {b.names[-1]}? Find them in the phonebook"
    assert lines[0] == q + " below." and lines[1] == "" and lines[2] == "Phonebook:"
    assert all(LINE.match(ln) for ln in lines[3:43]), lines[3:6]
    assert lines[43] == "" and lines[44] == q + " above." and len(lines) == 45
    table = book_lines(b)
    assert len(table) == 40 and len(set(table.values())) == 40  # unique names and numbers
    assert b.entries == 40 and len(set(b.names)) == 5 and set(b.names) <= set(table)
    assert b.numbers == [table[n] for n in b.names]
    assert b.response == " " + ", ".join(b.numbers)
    # the same rng state gives the same book, another state another one
    assert make_book(np.random.default_rng(0), 40, 5) == b
    assert make_book(np.random.default_rng(1), 40, 5).names != b.names


def test_books_depend_only_on_seed_and_index():
    few, more = books(3, seed=5, entries=(8, 30)), books(6, seed=5, entries=(8, 30))
    assert few == more[:3]
    assert books(3, seed=6, entries=(8, 30)) != few
    many = books(40, seed=1, entries=(8, 12), queries=(1, 32))
    assert all(8 <= b.entries <= 12 and 1 <= b.queries <= b.entries for b in many)
    assert max(b.queries for b in many) > 8  # queries ~ U{1..min(32, entries)}, not capped lower
    assert {b.queries for b in many} >= {1, 2}


def test_books_fit_a_token_budget_with_a_real_tokenizer():
    text = [b.prompt for b in books(20, seed=9, entries=(8, 40))] + english_lines(50)
    tok = train_byte_bpe(text, 400)

    def count(book):
        return sum(len(tok.encode(t, add_special_tokens=False).ids) for t in (book.prompt, book.response))

    free = books(12, seed=2, entries=(30, 60), queries=(1, 4))
    fitted = books(12, seed=2, entries=(30, 60), queries=(1, 4), fit=count, max_len=300)
    assert all(count(b) + 3 <= 300 for b in fitted)
    assert sum(f.entries < b.entries for f, b in zip(fitted, free, strict=True)) >= 6  # most had to shrink
    for f, b in zip(fitted, free, strict=True):
        table, full = book_lines(f), book_lines(b)
        assert len(table) == f.entries and f.numbers == [table[n] for n in f.names]
        assert table.items() <= full.items()  # a subset of the book's lines, in the book's order
        assert list(table) == [n for n in full if n in table]
        assert f.names == b.names[: f.queries] and f.queries >= 1  # the asked lines are kept first
        if count(b) + 3 <= 300:
            assert f == b  # a book that fits is untouched
    with pytest.raises(DataError, match="one entry needs"):
        books(1, seed=2, entries=(8, 8), fit=count, max_len=20)


def test_jsonl_round_trip_and_bad_lines(tmp_path):
    bs = books(3, seed=0, entries=(8, 10))
    path = write_jsonl(tmp_path / "pb.jsonl", bs)
    rows = read_prompt_response(path)
    assert [PhoneBook.from_dict(r) for r in rows] == bs
    assert rows[0]["queries"] == bs[0].queries
    bad = tmp_path / "bad.jsonl"
    for text, msg in [
        ('{"prompt": "a", "response": "b"}\n\nnot json\n', r"bad.jsonl:3: not JSON"),
        ('{"prompt": "a"}\n', r"bad.jsonl:1: field 'response'"),
        ("[1, 2]\n", r"bad.jsonl:1: expected a JSON object"),
        ('{"prompt": "a", "response": ""}\n', r"bad.jsonl:1: empty 'response'"),
        ("\n", "holds no prompt/response"),
    ]:
        bad.write_text(text)
        with pytest.raises(DataError, match=msg) as e:
            read_prompt_response(bad)
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- packing


@pytest.fixture(scope="module")
def tokenizer():
    return train_byte_bpe(english_lines(100) + ["What is 123-456-7890?"] * 5, 600)


def pairs(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = ["cat", "dog", "tree", "river", "house", "bird"]
    return [
        {"prompt": " ".join(rng.choice(words, rng.integers(1, 6))), "response": f"{rng.choice(words)} {i}", "id": i}
        for i in range(n)
    ]


def test_encode_pair_and_row_layout(tokenizer):
    ids = {t: tokenizer.token_to_id(t) for t in (START, END, PARADIGMS["prefix_lm"])}
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    prefix, target = encode_pair(tokenizer, "the cat", "a dog", ids)
    assert prefix.tolist() == [ids[PARADIGMS["prefix_lm"]], *enc("the cat")]
    assert target.tolist() == [*enc("a dog"), ids[END]]
    assert encode_pair(tokenizer, "the cat", "a dog", ids, "none")[0].tolist() == enc("the cat")

    ps = [{"prompt": "the cat", "response": "a dog"}, {"prompt": "my sister saw", "response": "the river"}]
    obj = PromptResponseObjective(ps, ps, tokenizer, seq_len=40, batch_size=2, seed=0)
    batch = obj.eval_batches()[0]  # file order: both pairs in row 0, row 1 empty padding
    (p1, t1), (p2, t2) = obj.val
    n1, n2 = len(p1) + len(t1), len(p2) + len(t2)
    row = lambda a: np.asarray(a)[0]  # noqa: E731
    tokens = [*p1, ids[START], *t1[:-1], *p2, ids[START], *t2[:-1]]
    assert row(batch.tokens)[: n1 + n2].tolist() == tokens and not row(batch.tokens)[n1 + n2 :].any()
    assert row(batch.targets)[len(p1) : n1].tolist() == t1.tolist()  # START predicts the first response token
    assert row(batch.targets)[n1 - 1] == ids[END] == row(batch.targets)[n1 + n2 - 1]  # END is each last target
    pad = [0] * (40 - n1 - n2)
    assert row(batch.loss_weights).tolist() == [0] * len(p1) + [1] * len(t1) + [0] * len(p2) + [1] * len(t2) + pad
    assert row(batch.token_types).tolist() == [1] * len(p1) + [3] * len(t1) + [1] * len(p2) + [3] * len(t2) + pad
    assert row(batch.segment_ids).tolist() == [1] * n1 + [2] * n2 + [0] * (40 - n1 - n2)
    assert row(batch.positions)[n1 : n1 + n2].tolist() == list(range(n2))
    assert not np.asarray(batch.segment_ids)[1].any()  # the padding row


def test_epochs_are_deterministic_and_visit_every_pair_once(tokenizer):
    ps = pairs(57)
    obj = PromptResponseObjective(ps, [], tokenizer, seq_len=48, batch_size=4, seed=3)
    for epoch in range(3):
        rows = obj.epoch_rows(epoch)
        seen = sorted(i for r in rows for i in r)
        assert seen == list(range(57))  # nothing repeated or lost
        assert all(sum(len(p) + len(t) for p, t in (obj.train[i] for i in r)) <= 48 for r in rows)
        assert max(len(r) for r in rows) > 1  # short pairs share rows
    assert obj.epoch_rows(0) != obj.epoch_rows(1)
    # the stream: epoch 0's rows, then epoch 1's; a fresh objective (resume) gives the same batches
    stream = obj.epoch_rows(0) + obj.epoch_rows(1) + obj.epoch_rows(2)
    again = PromptResponseObjective(ps, [], tokenizer, seq_len=48, batch_size=4, seed=3)
    steps = (len(obj.epoch_rows(0)) + len(obj.epoch_rows(1))) // 4 + 1
    for step in reversed(range(steps)):  # out of order on purpose
        b = again.train_batch(step)
        want = [obj._row(obj.train, stream[step * 4 + j]) for j in range(4)]
        assert np.array_equal(b.tokens, np.stack([w["tokens"] for w in want]))
        assert np.array_equal(b.targets, np.stack([w["targets"] for w in want]))
    assert obj.steps_per_epoch == len(obj.epoch_rows(0)) // 4
    other = PromptResponseObjective(ps, [], tokenizer, seq_len=48, batch_size=4, seed=4)
    assert other.epoch_rows(0) != obj.epoch_rows(0)
    # this process's slice of every global batch
    part = PromptResponseObjective(ps, [], tokenizer, seq_len=48, batch_size=4, seed=3, rows=(2, 4))
    assert np.array_equal(part.train_batch(5).tokens, obj.train_batch(5).tokens[2:4])


def test_long_pairs_fail_or_lose_the_prompts_left(tokenizer):
    long = [{"prompt": " ".join(["the cat saw the river"] * 20), "response": "a dog"}]
    with pytest.raises(DataError, match=r"train pair 3: \d+ tokens .* exceed seq_len 32"):
        PromptResponseObjective(pairs(3) + long, [], tokenizer, seq_len=32, batch_size=2, seed=0)
    with pytest.raises(UserError, match="objective.paradigm = 'end_half'"):
        PromptResponseObjective(pairs(3), [], tokenizer, seq_len=32, batch_size=2, seed=0, paradigm="end_half")
    obj = PromptResponseObjective(long, [], tokenizer, seq_len=32, batch_size=2, seed=0, truncate=True)
    (prefix, target), (full, _) = obj.train[0], encode_pair(tokenizer, long[0]["prompt"], "a dog", obj.ids)
    assert len(prefix) + len(target) == 32
    assert prefix[0] == full[0] and prefix[1:].tolist() == full[-(len(prefix) - 1) :].tolist()


def test_eval_batches_pad_the_last_and_keep_file_order(tokenizer):
    val = pairs(11, seed=1)
    obj = PromptResponseObjective(pairs(4), val, tokenizer, seq_len=32, batch_size=3, seed=0)
    batches = obj.eval_batches()
    firsts = [np.asarray(b.tokens)[r] for b in batches for r in range(3)]
    samples = sum(int(np.asarray(b.segment_ids).max(1).sum()) for b in batches)
    assert samples == 11 and all(b.tokens.shape == (3, 32) for b in batches)
    assert not firsts[-1].any()  # padded
    # the first row starts with pair 0
    p0, t0 = obj.val[0]
    assert firsts[0][: len(p0)].tolist() == p0.tolist()
    assert len(obj.eval_batches(1)) == 1


def test_exact_match_per_sample_under_teacher_forcing():
    # two rows; row 0 holds samples 1 (targets at 1-2) and 2 (targets at 4-6), row 1 sample 1 (targets 1-3)
    V = 10
    targets = np.array([[0, 3, 4, 0, 5, 6, 7, 0], [0, 2, 2, 9, 0, 0, 0, 0]])
    weights = np.array([[0, 1, 1, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0, 0]], np.float32)
    segments = np.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0, 0, 0]])
    batch = make_batch(np.ones_like(targets), targets, weights, segment_ids=segments, token_types=segments > 0)
    predicted = targets.copy()
    predicted[0, 5] = 1  # sample 2 of row 0 misses one target slot
    predicted[1, 5] = 3  # a miss on padding does not count

    def model(tokens, **_):  # logits whose argmax is ``predicted``, probability 0.5 on it
        logits = np.full((*tokens.shape, V), 0.0, np.float32)
        np.put_along_axis(logits, predicted[..., None], np.log(0.5 * (V - 1) / 0.5), axis=-1)
        return jnp.asarray(logits)

    out = PromptResponseObjective.eval(model, batch)
    assert float(out["samples"]) == 3 and float(out["exact"]) == 2
    scores = PromptResponseObjective.score([out, out])
    assert scores["exact_match"] == pytest.approx(2 / 3) and scores["samples"] == 6
    assert scores["token_accuracy"] == pytest.approx(7 / 8) and scores["target_tokens"] == 16  # 8 per call
    # p(argmax) = 0.5, every other token 0.5 / 9: 7 slots at -log 0.5, the miss at -log(0.5/9)
    assert scores["loss"] == pytest.approx((7 * np.log(2) + np.log(18)) / 8, rel=1e-5)
    s, e = segment_exact(jnp.asarray(predicted != targets), jnp.asarray(weights), jnp.asarray(segments))
    assert (int(s), int(e)) == (3, 2)


# ----------------------------------------------------------------------------- scoring


def test_score_book_by_position():
    gold = ["111-222-3333", "444-555-6666", "777-888-9999"]
    assert parse_numbers("x 111-222-3333,444-555-6666 12-345-6789 777-888-99990") == gold[:2] + ["777-888-9999"]
    assert score_book("111-222-3333, 444-555-6666, 777-888-9999", gold) == {
        "queries": 3,
        "correct": 3,
        "all_correct": True,
        "digits": 30,
        "digits_correct": 30,
        "malformed": False,
    }
    assert score_book("444-555-6666, 111-222-3333, 777-888-9999", gold)["correct"] == 1  # order matters
    assert score_book("111-222-3333", gold) == {
        "queries": 3,
        "correct": 1,
        "all_correct": False,
        "digits": 30,
        "digits_correct": 10,
        "malformed": False,
    }
    assert score_book("", gold)["correct"] == 0
    # digits count position by position within the j-th number: 3 of 10 right here, none for the missing two
    assert score_book("191-000-0030", gold)["digits_correct"] == 3


def test_shorter_numbers_for_small_designs():
    """task.phonebook.digits: the paper's 10 as DDD-DDD-DDDD (unchanged books), fewer as one run of digits,
    scored by runs of exactly that length; too few numbers for the entries is a DataError."""
    ten = books(3, seed=5, entries=(4, 8), queries=(1, 2))
    assert ten == books(3, seed=5, entries=(4, 8), queries=(1, 2), digits=10)
    four = books(3, seed=5, entries=(4, 8), queries=(1, 2), digits=4)
    for a, b in zip(ten, four, strict=True):
        assert a.names == b.names and a.entries == b.entries  # the same books but for the numbers
        assert all(re.fullmatch(r"\d{4}", n) for n in b.numbers)
        assert all(f"{n}: {p}" in b.prompt for n, p in zip(b.names, b.numbers, strict=True))
    gold = ["0471", "9935"]
    assert parse_numbers("0471, 99351, 9935 12 0471", like="0471") == ["0471", "9935", "0471"]
    assert score_book("0471, 9935", gold) == {
        "queries": 2,
        "correct": 2,
        "all_correct": True,
        "digits": 8,
        "digits_correct": 8,
        "malformed": False,
    }
    assert score_book("0471, 9934", gold)["digits_correct"] == 7
    with pytest.raises(DataError, match="1-digit numbers for up to 8 entries"):
        books(1, seed=0, entries=(4, 8), digits=1)


def test_summarize_tables():
    recs = [
        {"entries": 10, "queries": 1, "correct": 1, "all_correct": True, "digits": 10, "digits_correct": 10},
        {"entries": 12, "queries": 2, "correct": 1, "all_correct": False, "digits": 20, "digits_correct": 15},
        {"entries": 300, "queries": 2, "correct": 2, "all_correct": True, "digits": 20, "digits_correct": 20},
        {"entries": 700, "queries": 4, "correct": 0, "all_correct": False, "digits": 40, "digits_correct": 4},
    ]
    m = summarize(recs)
    assert m["books"] == 4 and m["numbers"] == 9
    assert m["number_accuracy"] == pytest.approx(4 / 9) and m["all_correct"] == pytest.approx(0.5)
    assert list(m["by_queries"]) == ["1", "2", "4"]
    assert m["digit_accuracy"] == pytest.approx(49 / 90)
    assert m["by_queries"]["2"] == {"books": 2, "number_accuracy": 0.75, "all_correct": 0.5, "digit_accuracy": 35 / 40}
    assert list(m["by_entries"]) == ["8-15", "256-511", "512+"]
    assert m["by_entries"]["8-15"] == {
        "books": 2,
        "number_accuracy": pytest.approx(2 / 3),
        "all_correct": 0.5,
        "digit_accuracy": 25 / 30,
    }
    assert [entry_bin(n) for n in (1, 7, 8, 15, 16, 800)] == ["1-7", "1-7", "8-15", "8-15", "16-31", "512+"]
    assert "empty_replies" not in m  # records without their text: nothing to say
    said = [{**r, "generated": g} for r, g in zip(recs, ["0471", " \n", "", "12"], strict=True)]
    assert summarize(said)["empty_replies"] == 0.5


def test_malformed_replies_are_counted_beside_empty_ones():
    """A reply that is not numbers of the books' shape joined by commas (e.g. 3 digits for 4) scores no digit:
    it is counted as malformed, so that a digit accuracy of 0 is told apart from wrong digits."""
    four, ten = ["3433", "0471"], ["111-222-3333", "444-555-6666"]
    for reply in (" 3433, 0471", "3433", "3433,0471 ", ""):
        assert not score_book(reply, four)["malformed"], reply
    for reply in ("999", " 34-33", "3433, 04711", "3433 0471", "3433,", "3433.", "the number is 3433"):
        assert score_book(reply, four)["malformed"], reply
    assert score_book("999", four)["digits_correct"] == 0  # what the malformed share explains
    assert not score_book(" 111-222-3333, 444-555-6666", ten)["malformed"]
    assert score_book("111-222-333", ten)["malformed"] and score_book("1112223333", ten)["malformed"]
    recs = [
        {"entries": 2, "queries": 2, "numbers": four, "generated": g, **score_book(g, four)}
        for g in (" 3433, 0471", "", "999", " 3433, 999")
    ]
    m = summarize(recs)
    assert m["empty_replies"] == 0.25 and m["malformed_replies"] == 0.5  # an empty reply is not also malformed
    assert "malformed_replies" not in summarize([{k: v for k, v in r.items() if k != "malformed"} for r in recs])


# ----------------------------------------------------------------------------- a tiny LM run


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A 2-step pretrained tiny gated-SSM LM (Birdie mixture) whose tokenizer has seen phone books."""
    tmp = tmp_path_factory.mktemp("pb")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for i in range(20):
        text = english_lines(20, seed=i) + [b.prompt + "\n" + b.response for b in books(2, i, entries=(4, 8))]
        (corpus / f"doc{i:02d}.txt").write_text("\n".join(text) + "\n")
    recipe = {
        "base": "lm_tiny",
        "name": "pb",
        "model": {
            "arch": "gated_ssm",
            "hidden_size": 32,
            "num_layers": 1,
            "state_size": 32,
            "num_heads": 2,
            "max_seq_length": 256,
        },
        "data": {"source": str(corpus), "vocab_size": 500},
        "objective": {"mixture": "birdie", "min_sample_space": 16},
        "train": {
            "steps": 2,
            "batch_size": 2,
            "log_every": 1,
            "eval_every": 0,
            "checkpoint_every": 0,
            "out_dir": str(tmp / "runs"),
        },
    }
    (tmp / "pb.yaml").write_text(yaml.safe_dump(recipe))
    invoke("pretrain", tmp / "pb.yaml", "-q")
    return tmp / "runs" / "pb"


def contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


@pytest.mark.parametrize("digits", [10, 4])
def test_a_number_is_written_with_the_tokens_it_is_read_with(lm_run, digits):
    """With the run's byte-level BPE, " 3433" (after ": " in the book) and "3433" are different tokens: the reply
    leads each number with a space, so the ids to write are the book line's ids for that number."""
    from ssmlm.checkpoint_eval.phonebook import phonebook_items
    from ssmlm.runs import open_run

    tok = open_run(lm_run).tokenizer()
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    for b in phonebook_items(tok, 256, n=4, seed=3, entries=(4, 8), queries=(1, 3), digits=digits):
        reply, prompt, at = enc(b.response), enc(b.prompt), 0
        for j, (name, number) in enumerate(zip(b.names, b.numbers, strict=True)):
            line, head = enc(f"{name}: {number}"), enc(f"{name}:")
            assert line[: len(head)] == head and contains(prompt, line)  # the book line, as the book encodes it
            read = line[len(head) :]  # the number's ids in the book
            written = reply[at : at + len(read) + (j > 0)]
            assert written == [*enc(",")[: j > 0], *read], (number, written, read)
            at += len(written)
        assert at == len(reply)
    assert enc(f" {number}") == read != enc(number)  # the old reply's form was not the book's


class Silent:
    """A generator that answers nothing (phonebook's evaluation drawn without a model)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, prompt, sampling, stop=()):
        return ""


def test_validation_and_test_books_differ_and_each_is_stable_for_a_seed(lm_run):
    from ssmlm.checkpoint_eval.lm import EvalRequest, phonebook
    from ssmlm.data.phonebook import SPLIT_SEEDS, phonebook_books, split_seed
    from ssmlm.runs import open_run

    run = open_run(lm_run)
    gen = Silent(run.tokenizer())

    def drawn(split: str) -> list[list[str]]:
        result = phonebook(run, gen, EvalRequest(limit=3, split=split, entries=(4, 8)))
        return [r["numbers"] for r in result["records"]]

    val, test = drawn("validation"), drawn("test")
    assert val != test and drawn("validation") == val and drawn("test") == test
    # the documented offsets from train.seed (finetuning: the seed itself and seed + 1,000,003)
    assert SPLIT_SEEDS == {"validation": 2_000_003, "test": 3_000_017}
    settings = dataclasses.replace(run.recipe.task.phonebook, entries=[4, 8])
    for split, offset in (("validation", 2_000_003), ("test", 3_000_017)):
        want = phonebook_books(settings, gen.tokenizer, 256, 3, run.recipe.train.seed + offset)
        assert drawn(split) == [b.numbers for b in want]
    with pytest.raises(UserError, match=r"^--split 'train': phone books are drawn for validation or test"):
        split_seed("train")


def test_evaluator_on_a_tiny_model(lm_run):
    from ssmlm.checkpoint_eval.phonebook import evaluate_phonebook, phonebook_items
    from ssmlm.runs.generate import load_generator

    gen = load_generator(lm_run)
    assert gen.mode == "prefix"
    items = phonebook_items(gen.tokenizer, 256, n=2, seed=0, entries=(4, 12), queries=(1, 3))
    enc = lambda s: gen.tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    assert all(len(enc(b.prompt)) + len(enc(b.response)) + 3 <= 256 for b in items)
    assert max(b.entries for b in items) > 1
    result = evaluate_phonebook(gen, items, progress=False)
    recs = result["records"]
    assert [r["index"] for r in recs] == [0, 1]
    for r, b in zip(recs, items, strict=True):
        assert isinstance(r["generated"], str) and "\n" not in r["generated"]
        assert r["numbers"] == b.numbers and r["entries"] == b.entries and r["queries"] == b.queries
        scored = score_book(r["generated"], b.numbers)
        assert {k: r[k] for k in scored} == scored
        assert score_book(f"{b.response}\n", b.numbers)["all_correct"]  # the right numbers score 1
    assert result["metrics"] == summarize(recs) and result["metrics"]["books"] == 2
    json.dumps(result)  # what `ssmlm evaluate` will write


def test_prompt_objective_through_a_real_model_under_jit(lm_run):
    from flax import nnx

    from ssmlm.checkpoint_eval.phonebook import phonebook_items
    from ssmlm.runs.generate import load_generator

    gen = load_generator(lm_run)
    items = phonebook_items(gen.tokenizer, 256, n=3, seed=1, entries=(2, 4), queries=(1, 2))
    ps = [{"prompt": b.prompt, "response": b.response} for b in items]
    obj = PromptResponseObjective(ps, ps, gen.tokenizer, 256, batch_size=2, seed=0)
    batch = obj.eval_batches()[0]
    out = nnx.jit(PromptResponseObjective.eval)(gen.model, batch)
    logits = np.asarray(
        gen.model(batch.tokens, segment_ids=batch.segment_ids, token_types=batch.token_types, positions=batch.positions)
    )
    hit, w, seg = logits.argmax(-1) == batch.targets, batch.loss_weights, batch.segment_ids
    samples = [(r, k) for r in range(2) for k in range(1, seg[r].max() + 1)]
    exact = sum(bool(hit[r][(seg[r] == k) & (w[r] > 0)].all()) for r, k in samples)
    assert float(out["samples"]) == len(samples) and float(out["exact"]) == exact
    assert float(out["count"]) == w.sum() and float(out["correct"]) == (hit * w).sum()
    loss, _ = nnx.jit(PromptResponseObjective.loss)(gen.model, batch, None)
    assert np.isfinite(float(loss))


def write_eval(run, records, name="phonebook-validation.json"):
    (run / "eval").mkdir(exist_ok=True)
    path = run / "eval" / name
    path.write_text(
        json.dumps({"run": str(run), "task": "phonebook", "metrics": summarize(records), "records": records})
    )
    return path


def test_analyze_phonebook_plot_and_csv(lm_run, tmp_path):
    import os
    import shutil

    other = tmp_path / "other"
    other.mkdir()
    for f in ("run.json", "recipe.yaml"):
        shutil.copy(lm_run / f, other / f)
    r = invoke("analyze", "phonebook", "--ckpt", other, code=None)
    assert r.exit_code != 0 and "ssmlm evaluate --ckpt" in r.output and "--task phonebook" in r.output
    old = write_eval(other, [{"entries": 9, "queries": 1, "correct": 0, "all_correct": False}], "phonebook-z.json")
    os.utime(old, (1, 1))  # older (though later by name): only the newest evaluation counts
    write_eval(
        other,
        [
            {"entries": 9, "queries": 1, "correct": 1, "all_correct": True},
            {"entries": 20, "queries": 2, "correct": 1, "all_correct": False},
            {"entries": 21, "queries": 2, "correct": 2, "all_correct": True},
        ],
        "phonebook-b.json",
    )
    write_eval(lm_run, [{"entries": 40, "queries": 3, "correct": 1, "all_correct": False}])
    out = tmp_path / "plots"
    invoke("analyze", "phonebook", "--ckpt", other, "--ckpt", lm_run, "--out", out)
    assert (out / "phonebook.png").stat().st_size > 1000
    rows = list(csv.DictReader((out / "phonebook.csv").open()))
    got = {(r["run"], r["axis"], r["bin"]): (int(r["books"]), float(r["number_accuracy_pct"])) for r in rows}
    assert got == {
        ("other", "by_queries", "1"): (1, 100.0),
        ("other", "by_queries", "2"): (2, 75.0),
        ("other", "by_entries", "8-15"): (1, 100.0),
        ("other", "by_entries", "16-31"): (2, 75.0),
        ("pb", "by_queries", "3"): (1, pytest.approx(100 / 3)),
        ("pb", "by_entries", "32-63"): (1, pytest.approx(100 / 3)),
    }


def test_a_seeds_book_is_the_same_in_every_install():
    """The phone books behind the docs' Birdie results, pinned: these lines were drawn with faker 40.63.0 (the
    version pyproject.toml requires exactly, since Faker keeps a seed's names only within one version). A change
    of Faker, numpy's generator or the drawing code that changes them fails here."""
    book = make_book(np.random.default_rng(2_000_003), 6, 2)
    assert book.prompt.splitlines()[3:9] == [
        "Sydney Walters: 367-952-1136",
        "Gregory Johnson: 030-774-3676",
        "Erica Brown: 545-434-3440",
        "Sarah Wallace: 574-731-4615",
        "Richard Stewart: 135-408-1864",
        "Nicholas Morales: 987-344-8546",
    ]
    assert book.names == ["Erica Brown", "Gregory Johnson"] and book.numbers == ["545-434-3440", "030-774-3676"]
