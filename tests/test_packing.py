"""Packing documents into MLM rows (ssmlm.data.packing.pack, recipe field data.packing) and the fill rate that
preprocess records.

"Wikipedia-like" text: documents of 3-12 paragraphs, each paragraph one line of 40-250 tokens (ids drawn
directly, so token counts are exact), packed at L = 128 (126 text tokens + [CLS] + [SEP]).
Fill = real tokens ([CLS]/[SEP] included) / (rows x L). What the modes reach on it (3000 documents):
  fill  0.947 with short_seq_prob 0, 0.90 with BERT's 0.1. Per-document packing cannot reach 0.95 here:
        a document's last row is on average half empty, and BERT's short rows (10% of rows, uniform
        length in [2, 126]) cost another ~5% by themselves.
  full  1.000 with short_seq_prob 0, 0.951 with 0.1 (the short rows' expected cost: 0.9516).
  bert  0.98 / 0.97, but only by discarding ~38% of the text.
"""

import json

import numpy as np
import pytest
from conftest import english_lines

from ssmlm.data.packing import pack, pack_document, rows_to_array

L = 128
MAX = L - 2
SEP = 3


def wiki_docs(n_docs, seed=0):
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(5, 30000, int(k)).tolist() for k in rng.integers(40, 251, int(p))]
        for p in rng.integers(3, 13, n_docs)
    ]


def flatten(docs):
    lines = [line for d in docs for line in d]
    tokens = np.array([t for line in lines for t in line], np.int32)
    return tokens, [len(line) for line in lines], [len(d) for d in docs]


def fill_rate(row_lengths):
    return (row_lengths.sum() + 2 * len(row_lengths)) / (len(row_lengths) * L)


@pytest.fixture(scope="module")
def wiki():
    docs = wiki_docs(3000)
    return docs, flatten(docs)


def run_pack(wiki, mode, short_seq_prob, seed=0):
    _, (tokens, line_lengths, doc_lines) = wiki
    return pack(tokens, line_lengths, doc_lines, MAX, short_seq_prob, np.random.default_rng(seed), mode, SEP)


# ----------------------------------------------------------------------------- fill (default)


def test_fill_is_lossless_and_rows_stay_in_their_document(wiki):
    docs, (tokens, _, _) = wiki
    row_tokens, row_lengths = run_pack(wiki, "fill", 0.1)
    assert row_lengths.min() >= 1 and row_lengths.max() <= MAX
    # nothing lost or duplicated, in order ...
    np.testing.assert_array_equal(row_tokens, tokens)
    # ... and every document ends at a row end, so a document's rows concatenate to the document
    doc_ends = np.cumsum([sum(map(len, d)) for d in docs])
    assert set(doc_ends.tolist()) <= set(np.cumsum(row_lengths).tolist())


def test_fill_rows_are_full_up_to_the_documents_last(wiki):
    docs, _ = wiki
    _, row_lengths = run_pack(wiki, "fill", 0.0)
    n = np.array([sum(map(len, d)) for d in docs])
    rows_per_doc = -(-n // MAX)
    assert len(row_lengths) == rows_per_doc.sum()  # the fewest rows per-document packing can use
    last = np.cumsum(rows_per_doc) - 1
    full = np.delete(row_lengths, last)
    assert np.all(full == MAX)
    np.testing.assert_array_equal(row_lengths[last], n - (rows_per_doc - 1) * MAX)


def test_fill_rates(wiki):
    """The numbers in the module docstring. short_seq_prob = 0.1 is the shipped BiGS recipes' value."""
    fill0 = fill_rate(run_pack(wiki, "fill", 0.0)[1])
    fill1 = fill_rate(run_pack(wiki, "fill", 0.1)[1])
    full0 = fill_rate(run_pack(wiki, "full", 0.0)[1])
    full1 = fill_rate(run_pack(wiki, "full", 0.1)[1])
    assert 0.94 <= fill0 < 0.95  # per document: the document's last row is the only loss
    assert 0.89 <= fill1 < fill0  # plus BERT's short rows
    assert full0 >= 0.999  # across documents, every row but the split's last is full
    # the expected cost of the short rows alone: 0.9 * L + 0.1 * (mean target 64 + 2) over L
    assert full1 == pytest.approx((0.9 * L + 0.1 * 66) / L, abs=0.004) and full1 >= 0.945


def test_short_seq_prob_keeps_berts_meaning(wiki):
    _, row_lengths = run_pack(wiki, "full", 0.1)
    short = row_lengths[:-1] < MAX - 1  # MAX - 1: a row whose edge separator was left out
    # 10% of rows get a target drawn uniformly from [2, MAX]; 1/125 of those draw MAX
    assert np.mean(short) == pytest.approx(0.1 * (1 - 2 / 125), abs=0.006)
    assert row_lengths[:-1][short].min() >= 2
    assert np.mean(row_lengths[:-1][short]) == pytest.approx(63, abs=2)


# ----------------------------------------------------------------------------- bert


def bert_chunks(doc, target):
    """create_pretraining_data's chunks before truncation: whole lines until the target is reached."""
    chunks, current = [], []
    for i, line in enumerate(doc):
        current.extend(line)
        if current and (len(current) >= target or i == len(doc) - 1):
            chunks.append(current)
            current = []
    return chunks


def test_bert_accumulates_whole_lines_and_trims_randomly(wiki):
    docs, (tokens, _, _) = wiki
    row_tokens, row_lengths = run_pack(wiki, "bert", 0.0)
    rows = np.split(row_tokens, np.cumsum(row_lengths)[:-1])
    chunks = [c for d in docs for c in bert_chunks(d, MAX)]
    assert len(rows) == len(chunks)
    fronts, overflows = [], []
    for row, chunk in zip(rows, chunks, strict=True):
        assert len(row) == min(len(chunk), MAX)
        over = len(chunk) - len(row)
        front = next(f for f in range(over + 1) if chunk[f : f + len(row)] == row.tolist())
        fronts.append(front)
        overflows.append(over)
    fronts, overflows = np.array(fronts), np.array(overflows)
    # rows are full: only a document's last chunk can fall short of the target
    assert np.mean(row_lengths == MAX) > 0.85
    # trimmed from both ends, a fair coin per token: the front takes half the overflow on average
    trimmed = overflows > 0
    assert np.mean(trimmed) > 0.8
    assert np.sum(fronts[trimmed] == 0) > 0 and np.sum(fronts[trimmed] == overflows[trimmed]) > 0
    assert fronts.sum() / overflows.sum() == pytest.approx(0.5, abs=0.01)
    # it discards text: paragraphs overflow the row by a lot
    assert row_lengths.sum() < 0.7 * len(tokens)


def test_bert_draws_one_target_per_document():
    doc = [[7] * 10 for _ in range(40)]  # 400 tokens in 10-token lines
    lengths = []
    for seed in range(60):
        rows = pack_document(doc, 100, 1.0, np.random.default_rng(seed), "bert")
        lengths.append({len(r) for r in rows[:-1]})
    # within a document every chunk closes at the same target (rounded up to whole lines)
    assert all(len(s) <= 1 for s in lengths)
    assert len(set().union(*lengths)) > 5


# ----------------------------------------------------------------------------- full


def test_full_crosses_documents_with_a_separator(wiki):
    docs, (tokens, _, _) = wiki
    row_tokens, row_lengths = run_pack(wiki, "full", 0.0)
    assert row_lengths.max() <= MAX and np.all(row_lengths[:-1] >= MAX - 1)
    rows = np.split(row_tokens, np.cumsum(row_lengths)[:-1])
    assert all(r[0] != SEP and r[-1] != SEP for r in rows)  # never a separator next to [CLS] or [SEP]
    # the stream is the documents joined by one [SEP], less the separators at row edges
    text = row_tokens[row_tokens != SEP]
    np.testing.assert_array_equal(text, tokens)
    left_out = len(docs) - 1 - (row_tokens == SEP).sum()
    assert 0 <= left_out < 0.05 * len(docs)  # only where a document ends at a row's edge


def test_full_skips_empty_documents():
    doc_lines = [2, 1, 1, 1]
    line_lengths = [3, 2, 0, 1, 7]  # the third document has no tokens
    tokens = np.arange(10, 23, dtype=np.int32)
    row_tokens, row_lengths = pack(tokens, line_lengths, doc_lines, 4, 0.0, np.random.default_rng(0), "full", SEP)
    # stream 10 11 12 13 | 14 SEP 15 SEP | 16 17 18 19 | 20 21 22: a row-closing separator is left out
    assert row_tokens.tolist() == [10, 11, 12, 13, 14, SEP, 15, 16, 17, 18, 19, 20, 21, 22]
    assert row_lengths.tolist() == [4, 3, 4, 3]


# ----------------------------------------------------------------------------- common


@pytest.mark.parametrize("mode", ["fill", "bert", "full"])
def test_rows_fit_and_packing_is_deterministic(wiki, mode):
    row_tokens, row_lengths = run_pack(wiki, mode, 0.5, seed=3)
    assert 1 <= row_lengths.min() and row_lengths.max() <= MAX
    again = run_pack(wiki, mode, 0.5, seed=3)
    np.testing.assert_array_equal(again[0], row_tokens)
    np.testing.assert_array_equal(again[1], row_lengths)
    assert len(run_pack(wiki, mode, 0.5, seed=4)[1]) != len(row_lengths)
    base = rows_to_array(row_tokens, row_lengths, L, 2, SEP)
    assert base.shape == (len(row_lengths), L) and base.dtype == np.int32
    assert (base != 0).mean() == pytest.approx(fill_rate(row_lengths), abs=1e-12)


def test_rows_to_array_layout():
    base = rows_to_array(np.array([5, 6, 7, 8, 9], np.int32), np.array([3, 2]), 6, 2, 3)
    assert base.tolist() == [[2, 5, 6, 7, 3, 0], [2, 8, 9, 3, 0, 0]]
    with pytest.raises(ValueError, match="does not fit"):
        rows_to_array(np.arange(5, dtype=np.int32), np.array([5]), 6, 2, 3)


def test_pack_edge_cases():
    rng = np.random.default_rng(0)
    for mode in ["fill", "bert", "full"]:
        row_tokens, row_lengths = pack(np.zeros(0, np.int32), [], [], 10, 0.1, rng, mode, SEP)
        assert len(row_tokens) == len(row_lengths) == 0
        assert rows_to_array(row_tokens, row_lengths, 12, 2, SEP).shape == (0, 12)
        assert pack_document([[], [5, 6]], 10, 0.0, rng, mode) == [[5, 6]]
    with pytest.raises(ValueError, match="packing mode"):
        pack(np.zeros(0, np.int32), [], [], 10, 0.1, rng, "greedy")
    with pytest.raises(ValueError, match="sep_id"):
        pack(np.arange(3), [3], [1], 10, 0.1, rng, "full")
    with pytest.raises(ValueError, match="disagree"):
        pack(np.arange(3), [2], [1], 10, 0.1, rng)


# ----------------------------------------------------------------------------- preprocess


def paragraph_corpus(root, n_docs=24):
    """Documents of 2-6 paragraph lines, each paragraph 3-12 generated sentences (~30-130 tokens)."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for i in range(n_docs):
        sentences = iter(english_lines(200, seed=i))
        paragraphs = [" ".join(next(sentences) for _ in range(int(k))) for k in rng.integers(3, 13, rng.integers(2, 7))]
        (root / f"doc{i:02d}.txt").write_text("\n".join(paragraphs) + "\n")
    return root


def saved_rows(out, split):
    from ssmlm.data.shards import TokenRows

    return TokenRows(out, split)[:]["tokens"].astype(np.int64)


def test_preprocess_records_the_fill_rate_of_its_arrays(tmp_path):
    from ssmlm.data.preprocess import FORMAT_VERSION, preprocess
    from ssmlm.recipe import DataConfig

    corpus = paragraph_corpus(tmp_path / "corpus")
    outs = {}
    for mode in ["fill", "bert", "full"]:
        cfg = DataConfig(source=str(corpus), vocab_size=200, validation_fraction=0.25, packing=mode)
        out = preprocess(cfg, 64, out_root=tmp_path / "data", quiet=True)
        meta = json.loads((out / "metadata.json").read_text())
        assert meta["format_version"] == FORMAT_VERSION == 3 and meta["packing"] == mode
        text_tokens = 0
        for split in ["train", "validation"]:
            rows = saved_rows(out, split)
            assert len(rows) == meta["splits"][split]["sequences"] > 0
            assert meta["splits"][split]["fill_rate"] == pytest.approx((rows != 0).sum() / rows.size)
            assert np.all((rows != 0).sum(1) <= 64)
            unique = rows  # unmasked and not duplicated: masking copies are made at training time
            inner = unique[:, 1:] != 0
            inner[np.arange(len(unique)), (unique != 0).sum(1) - 2] = False  # the closing [SEP]
            text_tokens += int((inner & (unique[:, 1:] != meta["special_ids"]["sep"])).sum())
        assert meta["fill_rate"] == meta["splits"]["train"]["fill_rate"]
        outs[mode] = (out, meta, text_tokens)

    assert len({o for o, _, _ in outs.values()}) == 3  # the mode is part of the cache key
    fill, bert, full = (outs[m][1] for m in ["fill", "bert", "full"])
    assert outs["fill"][2] == outs["full"][2] == fill["tokens"]  # nothing lost
    assert outs["bert"][2] < 0.9 * bert["tokens"]  # trimmed away
    assert fill["fill_rate"] > 0.85 and full["fill_rate"] > fill["fill_rate"]
