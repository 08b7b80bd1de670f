"""Streaming preprocessing (ssmlm.data.preprocess, format 3): unmasked token shards written chunk by chunk,
resumable after an interruption, split across hosts, read back through TokenRows / TokenDocuments."""

import dataclasses
import json

import numpy as np
import pytest
from conftest import english_lines

import ssmlm.data.preprocess as prep
from ssmlm.data.loader import Batches, eval_batches
from ssmlm.data.packing import pack, rows_to_array
from ssmlm.data.shards import TokenDocuments, TokenRows
from ssmlm.data.sources import load_corpus
from ssmlm.data.tokenizer import load_tokenizer, special_ids
from ssmlm.errors import Interrupted, UserError
from ssmlm.recipe import DataConfig

L = 32
CHUNK = 3000  # characters per chunk: a few documents each, so small corpora make many shards


def write_docs(d, n, lines=12, seed=0):
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"doc{i:03d}.txt").write_text("\n".join(english_lines(lines, seed=seed + i)) + "\n")
    return d


@pytest.fixture
def vocab(tmp_path):
    """A fixed vocabulary: the tokenizer is not retrained per run, and is shared by hosts."""
    words = sorted({w.strip(".").lower() for line in english_lines(400) for w in line.split()})
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *words]) + "\n")
    return path


def cfg_for(corpus, vocab=None, **kw):
    return DataConfig(source=str(corpus), tokenizer=str(vocab) if vocab else "train", vocab_size=150, **kw)


def all_rows(out, split="train"):
    rows = TokenRows(out, split)
    return rows[:]["tokens"]


def test_shards_and_metadata(tmp_path):
    corpus = write_docs(tmp_path / "c", 30)
    out = prep.preprocess(cfg_for(corpus, validation_fraction=0.2), L, tmp_path / "data", True, chunk_chars=CHUNK)
    meta = json.loads((out / "metadata.json").read_text())
    keys = (
        "fingerprint",
        "format_version",
        "source",
        "corpus",
        "documents",
        "tokens",
        "max_seq_length",
        "vocab_size",
        "special_ids",
        "tokenizer",
        "packing",
        "fill_rate",
        "splits",
        "config",
        "shards",
    )
    assert not [k for k in keys if k not in meta]
    assert meta["format_version"] == prep.FORMAT_VERSION == 3 and meta["documents"] == 30
    assert len(meta["shards"]) > 3 and (out / "tokenizer.json").is_file()
    assert sum(s["documents"] for s in meta["shards"]) == 30
    for split in prep.SPLITS:
        rows = all_rows(out, split)
        assert rows.dtype == np.int32 and rows.shape == (meta["splits"][split]["sequences"], L)
        assert sum(s[split] for s in meta["shards"]) == len(rows) > 0
        assert meta["splits"][split]["fill_rate"] == pytest.approx((rows != 0).mean())
        assert (rows[:, 0] == 2).all()  # [CLS]
        n_real = (rows != 0).sum(1)
        assert (rows[np.arange(len(rows)), n_real - 1] == 3).all()  # [SEP] closes the text, then padding
    assert meta["fill_rate"] == meta["splits"]["train"]["fill_rate"]
    # fill packing loses nothing: every text token of the corpus is in some row
    both = np.concatenate([all_rows(out, s) for s in prep.SPLITS])
    assert int(((both != 0).sum(1) - 2).sum()) == meta["tokens"]
    assert not list(out.rglob("*.tmp"))
    # reuse: the same inputs return the same directory without rewriting it
    stamp = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = prep.preprocess(cfg_for(corpus, validation_fraction=0.2), L, tmp_path / "data", True, chunk_chars=CHUNK)
    assert again == out and {p: p.stat().st_mtime_ns for p in out.rglob("*")} == stamp


@pytest.mark.parametrize("mode", ["fill", "bert", "full"])
def test_single_chunk_rows_equal_pack(tmp_path, vocab, mode):
    """One chunk: the train rows are exactly rows_to_array(pack(...)) of the training documents."""
    corpus = write_docs(tmp_path / "c", 12)
    cfg = cfg_for(corpus, vocab, packing=mode, validation_fraction=0.2, seed=3)
    out = prep.preprocess(cfg, L, tmp_path / "data", True)
    assert len(json.loads((out / "metadata.json").read_text())["shards"]) == 1
    tok = load_tokenizer(out / "tokenizer.json")
    ids = special_ids(tok)
    for split in prep.SPLITS:
        docs = [d for d in load_corpus(str(corpus)).documents if prep._is_validation(d, 0.2) == (split != "train")]
        lines = [[e.ids for e in tok.encode_batch(d, add_special_tokens=False)] for d in docs]
        flat = np.array([t for d in lines for line in d for t in line], np.int32)
        rt, rl = pack(
            flat,
            [len(x) for d in lines for x in d],
            [len(d) for d in lines],
            L - 2,
            cfg.short_seq_prob,
            prep.shard_rng(3, 0, split),
            mode,
            ids["sep"],
        )
        np.testing.assert_array_equal(all_rows(out, split), rows_to_array(rt, rl, L, ids["cls"], ids["sep"]))


def test_masking_settings_do_not_change_the_fingerprint(tmp_path):
    corpus = write_docs(tmp_path / "c", 3)
    base = cfg_for(corpus)
    names = {f.name for f in dataclasses.fields(DataConfig)}
    masking = {
        k: v for k, v in {"masked_lm_prob": 0.3, "max_predictions": 7, "duplicate_factor": 2}.items() if k in names
    }
    assert prep.output_dir(dataclasses.replace(base, **masking), L) == prep.output_dir(base, L)
    for change in (
        {"seed": 1},
        {"packing": "full"},
        {"short_seq_prob": 0.0},
        {"lowercase": False},
        {"tokenizer_type": "byte_bpe", "split_digits": True},
    ):
        assert prep.output_dir(dataclasses.replace(base, **change), L) != prep.output_dir(base, L), change
    assert prep.output_dir(base, 64) != prep.output_dir(base, L)
    lm = dataclasses.replace(base, tokenizer_type="byte_bpe")
    assert prep.output_dir(dataclasses.replace(lm, split_digits=True), L) != prep.output_dir(lm, L)


def test_every_data_field_is_in_the_cache_key(tmp_path):
    """Every data: field decides the tokenizer or the shards, so each one changes the cache directory; a new
    field fails here until it is given a value below (and is either keyed or shown not to change the tokens)."""
    corpus = write_docs(tmp_path / "c", 3)
    other = write_docs(tmp_path / "d", 4)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    base = cfg_for(corpus)
    changes = {
        "source": str(other),
        "text_field": "body",
        "split": "test",
        "max_documents": 2,
        "strip_gutenberg": not base.strip_gutenberg,
        "corpus_key": "content",  # the same files, known by their bytes rather than their paths and times
        "tokenizer": str(vocab_file),
        "tokenizer_type": "byte_bpe",
        "split_digits": not base.split_digits,
        "vocab_size": base.vocab_size + 1,
        "lowercase": not base.lowercase,
        "max_seq_length": 64,
        "short_seq_prob": 0.5,
        "packing": "bert",
        "validation_fraction": 0.3,
        "seed": base.seed + 1,
    }
    assert set(changes) == {f.name for f in dataclasses.fields(DataConfig)}
    for field, value in changes.items():
        assert prep.output_dir(dataclasses.replace(base, **{field: value}), L) != prep.output_dir(base, L), field


def test_interrupted_run_resumes_without_repeating_or_losing_a_document(tmp_path, vocab, monkeypatch):
    corpus = write_docs(tmp_path / "c", 40)
    cfg = cfg_for(corpus, vocab, validation_fraction=0.1)
    whole = prep.preprocess(cfg, L, tmp_path / "whole", True, chunk_chars=CHUNK)

    def stop_after_3(index):
        if index == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(prep, "_after_shard", stop_after_3)
    with pytest.raises(Interrupted, match="run the same command again to resume"):
        prep.preprocess(cfg, L, tmp_path / "part", True, chunk_chars=CHUNK)
    out = prep.output_dir(cfg, L, tmp_path / "part", chunk_chars=CHUNK)[0]
    assert not (out / "metadata.json").exists()  # unfinished: never taken for a dataset
    with pytest.raises(Exception, match="no metadata.json"):
        TokenRows(out, "train")
    done = sorted((out / "shards").glob("0*.json"))
    assert len(done) == 3
    stamps = {p: p.stat().st_mtime_ns for p in (out / "train").iterdir()}

    encoded = []  # the resumed run tokenises only the remaining chunks
    monkeypatch.setattr(prep, "_after_shard", encoded.append)
    resumed = prep.preprocess(cfg, L, tmp_path / "part", True, chunk_chars=CHUNK)
    assert resumed == out and encoded and min(encoded) == 3
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # finished shards untouched
    a, b = (json.loads((d / "metadata.json").read_text()) for d in (whole, out))
    assert a["documents"] == b["documents"] == 40 and a["tokens"] == b["tokens"]
    assert [s["documents"] for s in a["shards"]] == [s["documents"] for s in b["shards"]]
    for split in prep.SPLITS:
        np.testing.assert_array_equal(all_rows(whole, split), all_rows(out, split))


def test_a_killed_run_leaves_no_partial_shard_in_use(tmp_path, vocab, monkeypatch):
    """A shard file without its marker (killed between the two) is rewritten, not trusted."""
    corpus = write_docs(tmp_path / "c", 20)
    cfg = cfg_for(corpus, vocab)
    out = prep.preprocess(cfg, L, tmp_path / "d", True, chunk_chars=CHUNK)
    rows = all_rows(out)
    (out / "metadata.json").unlink()
    (out / "shards" / "00001.json").unlink()
    np.save(out / "train" / "00001.npy", np.zeros((1, L), np.uint16))  # what a crash could leave
    (out / "train" / "00002.npy.123-abc.tmp").write_bytes(b"partial")
    again = prep.preprocess(cfg, L, tmp_path / "d", True, chunk_chars=CHUNK)
    np.testing.assert_array_equal(all_rows(again), rows)


def test_memory_is_bounded_by_the_chunk_not_the_corpus(tmp_path, vocab):
    """Structural: the corpus is read as a stream; shards grow in number with the corpus, not in size."""
    from ssmlm.data.sources import open_corpus

    stream = open_corpus(str(write_docs(tmp_path / "c", 2)))
    assert not isinstance(stream.documents, list)
    counts, sizes = [], []
    for n in (10, 40):
        corpus = write_docs(tmp_path / f"c{n}", n)
        out = prep.preprocess(
            cfg_for(corpus, vocab, validation_fraction=0.0), L, tmp_path / "d", True, chunk_chars=CHUNK
        )
        meta = json.loads((out / "metadata.json").read_text())
        counts.append(len(meta["shards"]))
        sizes.append(max(s["documents"] for s in meta["shards"]))
    assert counts[1] >= 3 * counts[0] and sizes[0] == sizes[1]
    docs = [["x" * 100] for _ in range(10)]
    assert [len(c) for c in prep.chunks(iter(docs), 250, 100)] == [3, 3, 3, 1]
    assert [len(c) for c in prep.chunks(iter(docs), 10**9, 4)] == [4, 4, 2]


def test_token_rows_indexing_and_loader(tmp_path, vocab):
    corpus = write_docs(tmp_path / "c", 30)
    out = prep.preprocess(cfg_for(corpus, vocab), L, tmp_path / "d", True, chunk_chars=CHUNK)
    rows = TokenRows(out, "train")
    full = rows[:]["tokens"]
    assert len(rows) == len(full) and rows.seq_len == L and rows.with_format("numpy") is rows
    idx = np.array([0, 1, len(rows) // 2, len(rows) - 1])
    got = rows[idx]
    np.testing.assert_array_equal(got["tokens"], full[idx])
    assert got["row"].dtype == np.int64 and got["row"].tolist() == idx.tolist()
    np.testing.assert_array_equal(rows[5:17]["tokens"], full[5:17])
    assert rows[5:17]["row"].tolist() == list(range(5, 17)) and rows[3:3]["tokens"].shape == (0, L)
    with pytest.raises(IndexError):
        rows[np.array([len(rows)])]
    # the loader's batches: same permutation as over an in-memory table
    b = Batches(rows, 8, seed=0, shard=(1, 2))
    batch = b(3)
    np.testing.assert_array_equal(batch["tokens"], full[batch["row"]])
    assert set(batch["row"]) == set(np.array_split(b.indices(3), 2)[1])
    chunks = list(eval_batches(rows, 8, pad_row={"tokens": np.zeros(L, np.int32), "row": -1}))
    assert sum((c["row"] >= 0).sum() for c in chunks) == len(rows) and all(len(c["row"]) == 8 for c in chunks)


def test_documents_layout_round_trip(tmp_path, vocab):
    corpus = write_docs(tmp_path / "c", 25)
    cfg = cfg_for(corpus, vocab, validation_fraction=0.2)
    out = prep.preprocess(cfg, L, tmp_path / "d", True, layout="documents", chunk_chars=CHUNK)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["layout"] == "documents" and len(meta["shards"]) > 2
    tok = load_tokenizer(out / "tokenizer.json")
    expected = {s: [] for s in prep.SPLITS}
    for d in load_corpus(str(corpus)).documents:
        ids = [t for e in tok.encode_batch(d, add_special_tokens=False) for t in e.ids]
        expected["validation" if prep._is_validation(d, 0.2) else "train"].append(ids)
    # shards hold a chunk's training documents, then its validation ones: compare as multisets per split
    for split in prep.SPLITS:
        docs = TokenDocuments(out, split)
        assert len(docs) == len(expected[split]) == meta["splits"][split]["documents"]
        got = sorted(docs[i].tolist() for i in range(len(docs)))
        assert got == sorted(expected[split]) and docs[0].dtype == np.int32
        assert docs.lengths.tolist() == [len(docs[i]) for i in range(len(docs))]
    with pytest.raises(Exception, match="layout"):
        TokenRows(out, "train")


def test_multi_host_split(tmp_path, vocab):
    corpus = write_docs(tmp_path / "c", 30)
    cfg = cfg_for(corpus, vocab, validation_fraction=0.1)
    single = prep.preprocess(cfg, L, tmp_path / "one", True, chunk_chars=CHUNK)
    host1 = prep.preprocess(cfg, L, tmp_path / "two", True, hosts=(1, 2), chunk_chars=CHUNK)
    assert not (host1 / "metadata.json").exists()  # host 1 writes its shards, not the metadata
    written = sorted(int(p.stem) for p in (host1 / "shards").glob("0*.json"))
    assert written and all(i % 2 == 1 for i in written)
    host0 = prep.preprocess(cfg, L, tmp_path / "two", True, hosts=(0, 2), chunk_chars=CHUNK)
    assert host0 == host1 and (host0 / "metadata.json").is_file()
    for split in prep.SPLITS:
        np.testing.assert_array_equal(all_rows(single, split), all_rows(host0, split))


def test_host_0_does_not_wait_forever_for_a_host_that_never_writes_its_shards(tmp_path, vocab, monkeypatch):
    corpus = write_docs(tmp_path / "c", 30)
    cfg = cfg_for(corpus, vocab, validation_fraction=0.1)
    monkeypatch.setenv("SSMLM_DATA_TIMEOUT", "1")  # host 1 never runs: its shards never come
    with pytest.raises(UserError, match=r"waited 1 s \(SSMLM_DATA_TIMEOUT\) for the shards of .* another host"):
        prep.preprocess(cfg, L, tmp_path / "two", True, hosts=(0, 2), chunk_chars=CHUNK)
    monkeypatch.setenv("SSMLM_DATA_TIMEOUT", "soon")
    with pytest.raises(UserError, match="SSMLM_DATA_TIMEOUT = 'soon': expected a number of seconds > 0"):
        prep.preprocess(cfg, L, tmp_path / "two", True, hosts=(0, 2), chunk_chars=CHUNK)
