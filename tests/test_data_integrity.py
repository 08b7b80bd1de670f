"""Data that is verified: a shard's bytes changed after preprocessing stop a run with one line naming the shard."""

import json

from conftest import corpus_dir, invoke, tiny_recipe


def _cache(tmp_path, **data):
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_dir(tmp_path / "corpus", 12, 20), data=data or None)
    out = invoke("preprocess", recipe, "-q").output
    return recipe, json.loads(out[out.index("{") :])["path"]


def _flip(path, offset=-5):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(data)


def test_a_flipped_byte_in_a_shard_stops_the_run(tmp_path):
    from pathlib import Path

    recipe, cache = _cache(tmp_path)
    shard = Path(cache) / "train" / "00000.npy"
    meta = json.loads((Path(cache) / "metadata.json").read_text())
    assert len(meta["shards"][0]["checksums"]["train/00000.npy"]) == 64
    invoke("pretrain", recipe, "-q", "--set", "train.steps=1")  # verified once, remembered in verified.json
    assert "train/00000.npy" in json.loads((Path(cache) / "verified.json").read_text())
    _flip(shard)  # a token id in the last row: the file still loads, only the data is wrong
    out = invoke("pretrain", recipe, "-q", "--name", "again", code=2).output
    assert out.strip().splitlines() == [
        f"error: {shard}: shard checksum mismatch (its bytes changed after preprocessing); remove {cache} to "
        "rebuild the dataset (the next run or `ssmlm preprocess` does)"
    ]
    assert not (tmp_path / "runs" / "again" / "metrics.jsonl").exists()


def test_a_flipped_byte_in_a_documents_shard_is_found(tmp_path):
    import pytest

    from ssmlm.data.config import DataConfig
    from ssmlm.data.preprocess import preprocess
    from ssmlm.data.shards import TokenDocuments
    from ssmlm.errors import DataError

    corpus = corpus_dir(tmp_path / "corpus", 12, 20)
    cfg = DataConfig(source=str(corpus), tokenizer_type="byte_bpe", vocab_size=300, validation_fraction=0.2)
    cache = preprocess(cfg, 32, tmp_path / "data", quiet=True, layout="documents")
    assert len(TokenDocuments(cache, "validation"))
    offsets = cache / "validation" / "00000.offsets.npy"
    _flip(offsets, -1)  # the last offset's high byte: a document would end far past the tokens
    with pytest.raises(DataError, match=f"^{offsets}: shard checksum mismatch"):
        TokenDocuments(cache, "validation")
    assert len(TokenDocuments(cache, "train"))  # the other split's files are intact


def test_a_dataset_without_checksums_is_read_with_a_note(tmp_path, capsys):
    from pathlib import Path

    from ssmlm.data.shards import TokenRows

    _, cache = _cache(tmp_path)
    meta_path = Path(cache) / "metadata.json"
    meta = json.loads(meta_path.read_text())
    for s in meta["shards"]:
        del s["checksums"]
    meta_path.write_text(json.dumps(meta))
    assert len(TokenRows(cache, "train")) and len(TokenRows(cache, "validation")) >= 0
    out = capsys.readouterr().err  # the shared console writes to stderr
    assert out.count("preprocessed before shards had checksums: read unchecked") == 1
