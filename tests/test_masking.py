"""Document packing (ssmlm.data.packing), static MLM masking (ssmlm.objectives.mlm) and offline preprocessing
(ssmlm.data.preprocess; streaming, resume and shards: test_preprocess_stream.py).
Packing modes and fill rates: test_packing.py.

The statistics run on real-ish token streams: a WordPiece trained with ssmlm's own trainer on Python's
offline documentation (pydoc_data.topics) and on generated English-like sentences.
"""

import json
import random

import numpy as np
import pytest
from tokenizers import Tokenizer

from ssmlm.data.packing import pack_document
from ssmlm.data.tokenizer import SPECIALS, special_ids, train_byte_bpe, train_wordpiece
from ssmlm.objectives.mlm import mask_batch

SUBJECTS = [
    "the miller",
    "a young girl",
    "my uncle",
    "the captain",
    "an old woman",
    "the children",
    "our cook",
    "the village priest",
    "a tired horse",
    "the king",
]
VERBS = ["carried", "painted", "forgot", "borrowed", "discovered", "washed", "described", "repaired", "sold"]
OBJECTS = [
    "the wooden boat",
    "a silver spoon",
    "the broken fence",
    "seven apples",
    "the long letter",
    "a heavy basket",
    "the blue curtains",
    "an ancient map",
]
TAILS = [
    "before the storm",
    "on a cold evening",
    "without a word",
    "for the market",
    "beside the well",
    "while singing softly",
    "at the end of summer",
]


def sentences(n, seed=0):
    rng = random.Random(seed)
    return [
        f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."
        for _ in range(n)
    ]


def pydoc_lines(limit=4000):
    from pydoc_data.topics import topics

    out = []
    for key in sorted(topics):
        for raw in topics[key].splitlines():
            line = raw.strip()
            if line and not line.startswith((">>>", "...")):
                out.append(line)
    return out[:limit]


@pytest.fixture(scope="module")
def corpus():
    """(tokenizer, special ids, encoded documents) from pydoc topics + generated sentences."""
    lines = pydoc_lines() + sentences(600)
    tok = train_wordpiece(lines, vocab_size=600)
    ids = special_ids(tok)
    encoded = [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    docs = [encoded[i : i + 40] for i in range(0, len(encoded), 40)]  # 40 lines a document
    return tok, ids, docs


def build_rows(docs, ids, length, short_seq_prob=0.1, seed=0):
    rng = np.random.default_rng(seed)
    chunks = [c for d in docs for c in pack_document(d, length - 2, short_seq_prob, rng)]
    base = np.zeros((len(chunks), length), np.int32)
    for i, c in enumerate(chunks):
        base[i, : len(c) + 2] = [ids["cls"], *c, ids["sep"]]
    return base, chunks


# ----------------------------------------------------------------------------- pack_document


@pytest.mark.parametrize("max_tokens,short_seq_prob", [(30, 0.0), (30, 0.1), (62, 0.5), (9, 1.0)])
def test_pack_document_bounds_and_order(corpus, max_tokens, short_seq_prob):
    _, _, docs = corpus
    rng = np.random.default_rng(0)
    for doc in docs[:60]:
        chunks = pack_document(doc, max_tokens, short_seq_prob, rng)
        assert all(1 <= len(c) <= max_tokens for c in chunks)
        # every token preserved, in order, nothing duplicated
        assert [t for c in chunks for t in c] == [t for line in doc for t in line]


def test_pack_document_fills_rows_across_lines():
    rng = np.random.default_rng(1)
    doc = [list(range(100 * i, 100 * i + int(n))) for i, n in enumerate(rng.integers(1, 12, 80))]
    chunks = pack_document(doc, 20, 0.0, np.random.default_rng(0))
    # every row but the last is exactly full: a line that does not fit continues in the next row
    assert all(len(c) == 20 for c in chunks[:-1]) and 1 <= len(chunks[-1]) <= 20
    assert any(c[0] not in {line[0] for line in doc} for c in chunks), "no row starts inside a line"
    assert [t for c in chunks for t in c] == [t for line in doc for t in line]


def test_pack_document_splits_overlong_lines_instead_of_dropping():
    doc = [[1, 2, 3], list(range(10, 35)), [7, 8]]
    chunks = pack_document(doc, 10, 0.0, np.random.default_rng(0))
    assert chunks == [[1, 2, 3, *range(10, 17)], list(range(17, 27)), [*range(27, 35), 7, 8]]


def test_pack_document_short_sequences():
    doc = [[i] * 3 for i in range(400)]
    long = pack_document(doc, 60, 0.0, np.random.default_rng(0))
    short = pack_document(doc, 60, 1.0, np.random.default_rng(0))
    assert all(len(c) == 60 for c in long[:-1])
    assert np.mean([len(c) for c in short]) < 0.75 * np.mean([len(c) for c in long])
    again = pack_document(doc, 60, 1.0, np.random.default_rng(0))
    assert again == short
    assert pack_document([], 10, 0.1, np.random.default_rng(0)) == []


# ----------------------------------------------------------------------------- mask_batch


def run_mask(base, ids, vocab, max_pred, seed=0, prob=0.15):
    return mask_batch(base, set(ids.values()), vocab, ids["mask"], prob, max_pred, np.random.default_rng(seed))


@pytest.mark.parametrize("length,max_pred", [(64, 10), (32, 3), (64, 64)])
def test_mask_batch_structure(corpus, length, max_pred):
    tok, ids, docs = corpus
    base, _ = build_rows(docs, ids, length)
    vocab = tok.get_vocab_size()
    out = run_mask(base, ids, vocab, max_pred)
    inp, pos, lab = out["input_ids"], out["masked_lm_positions"], out["masked_lm_ids"]
    n = len(base)
    assert inp.shape == base.shape and pos.shape == (n, max_pred) and lab.shape == (n, max_pred)
    assert inp.dtype == pos.dtype == lab.dtype == np.int32
    specials = {ids["cls"], ids["sep"], ids["pad"]}
    for r in range(n):
        n_tokens = int((base[r] != ids["pad"]).sum())
        expected = min(max_pred, max(1, round(0.15 * n_tokens)))
        used = pos[r][pos[r] > 0]
        assert len(used) == expected, (r, n_tokens)
        # sorted, unique, unused slots are 0 and at the end
        assert np.all(np.diff(used) > 0)
        assert np.all(pos[r, len(used) :] == 0) and np.all(lab[r, len(used) :] == 0)
        # never [CLS]/[SEP]/[PAD]; labels are the original tokens
        assert not specials & set(base[r, used].tolist())
        np.testing.assert_array_equal(lab[r, : len(used)], base[r, used])
        # every other position is untouched
        keep = np.ones(length, bool)
        keep[used] = False
        np.testing.assert_array_equal(inp[r, keep], base[r, keep])


def test_mask_batch_80_10_10(corpus):
    tok, ids, docs = corpus
    base, _ = build_rows(docs, ids, 64)
    base = np.concatenate([base] * 4)  # more rows: ~ 4 x 800 rows x ~9 masks
    vocab = tok.get_vocab_size()
    out = run_mask(base, ids, vocab, 20, seed=3)
    pos, lab = out["masked_lm_positions"], out["masked_lm_ids"]
    rows, slots = np.nonzero(pos > 0)
    new = out["input_ids"][rows, pos[rows, slots]]
    orig = lab[rows, slots]
    total = len(new)
    assert total > 10_000
    is_mask = new == ids["mask"]
    is_same = (new == orig) & ~is_mask
    is_random = ~is_mask & ~is_same
    # 3.5 standard deviations or so
    assert np.mean(is_mask) == pytest.approx(0.8, abs=0.015)
    assert np.mean(is_same) == pytest.approx(0.1 + 0.1 / vocab, abs=0.011)
    assert np.mean(is_random) == pytest.approx(0.1 - 0.1 / vocab, abs=0.011)
    # random replacements are uniform over the whole vocabulary
    rnd = new[is_random]
    assert rnd.min() >= 0 and rnd.max() < vocab
    assert np.mean(rnd) == pytest.approx((vocab - 1) / 2, abs=0.06 * vocab)
    hist = np.histogram(rnd, bins=4, range=(0, vocab))[0] / len(rnd)
    np.testing.assert_allclose(hist, 0.25, atol=0.05)
    # masked positions are spread over the sequence, not biased to the start
    p = pos[pos > 0]
    lengths = (base != 0).sum(1)
    rel = (pos / np.maximum(lengths - 1, 1)[:, None])[pos > 0]
    assert 0.4 < np.mean(rel) < 0.6 and p.max() > 55


def test_mask_batch_deterministic_and_seed_dependent(corpus):
    tok, ids, docs = corpus
    base, _ = build_rows(docs[:10], ids, 32)
    a = run_mask(base, ids, tok.get_vocab_size(), 5, seed=11)
    b = run_mask(base, ids, tok.get_vocab_size(), 5, seed=11)
    c = run_mask(base, ids, tok.get_vocab_size(), 5, seed=12)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])
    # the input is not modified in place
    base2, _ = build_rows(docs[:10], ids, 32)
    np.testing.assert_array_equal(base, base2)


def test_mask_batch_edge_rows():
    ids = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    base = np.array(
        [
            [2, 3, 0, 0, 0, 0, 0, 0],  # nothing to mask
            [2, 9, 3, 0, 0, 0, 0, 0],  # one candidate: max(1, round(0.45)) = 1
            [2, 9, 9, 9, 9, 9, 9, 3],  # full row: round(0.15 * 8) = 1
        ],
        np.int32,
    )
    out = run_mask(base, ids, 20, 4, prob=0.15)
    pos = out["masked_lm_positions"]
    np.testing.assert_array_equal(pos[0], 0)
    np.testing.assert_array_equal(pos[1], [1, 0, 0, 0])
    assert (pos[2] > 0).sum() == 1 and 1 <= pos[2, 0] <= 6
    out = run_mask(base, ids, 20, 4, prob=0.5)  # round(0.5 * 8) = 4 of the 6 candidates
    assert (out["masked_lm_positions"][2] > 0).sum() == 4


def test_mask_batch_max_predictions_longer_than_sequence():
    ids = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    base = np.array([[2, 10, 11, 12, 13, 3, 0, 0]], np.int32)
    out = run_mask(base, ids, 50, 10, prob=0.5)  # e.g. data.max_predictions: 10 with max_seq_length 8
    assert out["masked_lm_positions"].shape == (1, 10)
    assert (out["masked_lm_positions"] > 0).sum() == 3


def test_mask_batch_random_replacements_from_given_ids():
    base = np.tile(np.array([[2, *range(10, 40), 3]], np.int32), (2000, 1))
    allowed = np.arange(5, 12)  # preprocess passes every id but the special tokens
    out = mask_batch(base, {0, 2, 3}, 12, 4, 0.15, 5, np.random.default_rng(0), allowed)
    pos, lab = out["masked_lm_positions"], out["masked_lm_ids"]
    rows, slots = np.nonzero(pos > 0)
    new = out["input_ids"][rows, pos[rows, slots]]
    rnd = new[(new != 4) & (new != lab[rows, slots])]
    assert len(rnd) > 500 and set(rnd.tolist()) == set(allowed.tolist())


# ----------------------------------------------------------------------------- tokenizer


def varied_lines(n: int, seed: int = 0) -> list[str]:
    """Prose-like lines of made-up words: many word forms and characters (accents, digits, capitals), as a real
    corpus has, so that the trainer meets many "##c" pieces and many merges of equal count."""
    rng = random.Random(seed)
    onsets, vowels = (
        ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr"],
        list("aeiouyéèàöüøñ"),
    )
    words = ["".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    out = []
    for _ in range(n):
        ws = [
            rng.choice(words) if rng.random() < 0.9 else str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(12)
        ]
        ws[0] = ws[0].capitalize()
        out.append(" ".join(ws) + rng.choice([".", "!", "?", ";"]))
    return out


def test_train_wordpiece_is_deterministic():
    """The same lines give the same tokenizer.json, byte for byte (before: a different id assignment, and so a
    different dataset, on each call: tokenizers' trainer iterates a hash map, huggingface/tokenizers#1794)."""
    lines = varied_lines(3000)
    first = train_wordpiece(lines, vocab_size=2000).to_str()
    assert all(train_wordpiece(lines, vocab_size=2000).to_str() == first for _ in range(3))
    tok = Tokenizer.from_str(first)
    assert len(json.loads(first)["added_tokens"]) == len(SPECIALS)  # the "##c" pieces are plain vocabulary again
    assert tok.encode("Bastelo dira!").tokens[1:3] == tok.encode("bastelo dira!").tokens[1:3]
    assert "[UNK]" not in tok.encode(lines[7]).tokens


def test_train_byte_bpe_is_deterministic():
    lines = [line + "\n" for line in varied_lines(3000)]
    first = train_byte_bpe(lines, 2000).to_str()
    assert all(train_byte_bpe(lines, 2000).to_str() == first for _ in range(3))


def test_train_wordpiece_specials_and_post_processor():
    tok = train_wordpiece(sentences(200), vocab_size=400)
    assert special_ids(tok) == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    enc = tok.encode("The king sold seven apples.")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    assert enc.tokens[1:3] == ["the", "king"] and enc.tokens[-2] == "."  # lower-cased, punctuation split
    assert tok.decode(enc.ids) == "the king sold seven apples."
    pair = tok.encode("the king", "the cook")
    assert pair.tokens == ["[CLS]", "the", "king", "[SEP]", "the", "cook", "[SEP]"]
    assert pair.type_ids == [0, 0, 0, 0, 1, 1, 1]
    assert 50 < tok.get_vocab_size() <= 400


# ----------------------------------------------------------------------------- preprocess


@pytest.fixture
def local_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SSMLM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(30):
        (d / f"doc{i:02d}.txt").write_text("\n".join(sentences(20, seed=100 + i)) + "\n")
    return d


def load_rows(out, split):
    from ssmlm.data.shards import TokenRows

    return TokenRows(out, split)[:]["tokens"].astype(np.int64)


def test_preprocess_local_corpus_and_reuse(local_corpus, tmp_path):
    from ssmlm.data.preprocess import preprocess
    from ssmlm.recipe import DataConfig

    cfg = DataConfig(source=str(local_corpus), vocab_size=300, validation_fraction=0.2, seed=1)
    out = preprocess(cfg, 32, quiet=True)
    assert out.parent == tmp_path / "home" / "data" and out.name.startswith("corpus-L32-")
    meta = json.loads((out / "metadata.json").read_text())
    assert (out / "tokenizer.json").is_file() and (out / "train").is_dir() and (out / "validation").is_dir()
    assert meta["max_seq_length"] == 32 and meta["documents"] == 30
    assert meta["special_ids"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert meta["vocab_size"] <= 300
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]

    train, val = load_rows(out, "train"), load_rows(out, "validation")
    assert meta["splits"]["train"]["sequences"] == len(train)
    assert len(val) == meta["splits"]["validation"]["sequences"] > 0
    assert train.shape[1] == 32
    plain = np.concatenate([train, val])  # preprocessing no longer masks: the rows are the text
    # [CLS] first, [SEP] after the text, padding after that; all tokens of the corpus accounted for
    assert np.all(plain[:, 0] == 2)
    n_real = (plain != 0).sum(1)
    assert np.all(plain[np.arange(len(plain)), n_real - 1] == 3)
    assert np.all(np.isin(plain[:, 1:][plain[:, 1:] != 0], [2], invert=True))
    assert int((n_real - 2).sum()) == meta["tokens"]
    # the text survives: every training sequence decodes to a piece of one document of the corpus
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    docs = [" ".join(p.read_text().split()).lower() for p in sorted(local_corpus.glob("*.txt"))]
    for row in plain[: len(train)]:
        text = tok.decode([int(t) for t in row if t > 4])
        assert text and any(text in d for d in docs), text
    # reuse: same path, nothing rewritten
    stamp = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = preprocess(cfg, 32, quiet=True)
    assert again == out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamp  # reused: nothing tokenised or written

    # a different sequence length or a changed corpus gives a new directory
    (local_corpus / "doc00.txt").write_text("\n".join(sentences(25, seed=999)) + "\n")
    changed = preprocess(cfg, 32, quiet=True)
    assert changed != out and (changed / "metadata.json").is_file()


def test_preprocess_ignores_masking_settings(local_corpus):
    """Masking (and its duplicate_factor copies) is applied at training time: preprocessing's output, and
    its cache key, do not depend on it."""
    import dataclasses

    from ssmlm.data.preprocess import preprocess
    from ssmlm.recipe import DataConfig

    base = DataConfig(source=str(local_corpus), vocab_size=300, seed=1)
    one = preprocess(base, 32, quiet=True)
    names = {f.name for f in dataclasses.fields(DataConfig)}
    masking = {k: v for k, v in {"duplicate_factor": 3, "masked_lm_prob": 0.3}.items() if k in names}
    assert preprocess(dataclasses.replace(base, **masking), 32, quiet=True) == one
    assert json.loads((one / "metadata.json").read_text())["splits"]["train"]["sequences"] == len(
        load_rows(one, "train")
    )
