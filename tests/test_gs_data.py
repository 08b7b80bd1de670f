"""A corpus and the preprocessed cache in a bucket (data.source=gs://…, SSMLM_HOME=gs://…), against the local GCS
server of conftest: the cache is written to the bucket (never a local 'gs:' folder), reused from it, each host's
local copy checked against metadata.json's checksums, and the bucket's own damage caught in one line."""

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import english_lines, invoke, tiny_recipe

import ssmlm.data.preprocess as prep
from ssmlm import paths
from ssmlm.data.sources import corpus_fingerprint, load_corpus
from ssmlm.recipe import DataConfig

L = 32


def upload_corpus(bucket, prefix: str, n: int = 30, lines: int = 12) -> str:
    for i in range(n):
        text = "\n".join(english_lines(lines, seed=i)) + "\n"
        paths.write_bytes(f"{bucket.url}/{prefix}/doc{i:03d}.txt", text.encode())
    return f"{bucket.url}/{prefix}"


def generations(bucket, prefix: str) -> dict[str, str]:
    return {k: paths.info(f"{bucket.url}/{k}")["generation"] for k in bucket.keys(prefix)}


@pytest.fixture
def bucket_home(bucket, tmp_path, monkeypatch):
    """SSMLM_HOME in the bucket, this test's own local cache, run from a folder a stray 'gs:' would appear in."""
    monkeypatch.setenv("SSMLM_HOME", f"{bucket.url}/home")
    monkeypatch.setenv("SSMLM_LOCAL_CACHE", str(tmp_path / "local-cache"))
    monkeypatch.chdir(tmp_path)
    return bucket


def test_a_changed_shard_is_caught_in_the_bucket_and_a_torn_copy_fetched_again(bucket_home, tmp_path):
    bucket = bucket_home
    corpus = upload_corpus(bucket, "corpus", n=12)
    cfg = DataConfig(source=corpus, vocab_size=150, validation_fraction=0.1)
    out = prep.preprocess(cfg, L, quiet=True)
    local = out / "train" / "00000.npy"
    good = local.read_bytes()
    local.write_bytes(good[: len(good) // 2])  # a torn local copy: fetched again, silently
    assert prep.preprocess(cfg, L, quiet=True) == out and local.read_bytes() == good
    url = next(u for u in paths.listing(f"{bucket.url}/home/data") if u.endswith("train/00000.npy"))
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF
    paths.write_bytes(url, bytes(flipped))  # the bucket's object rewritten with one byte changed
    shutil.rmtree(tmp_path / "local-cache")
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus, data={"validation_fraction": 0.1})
    result = invoke("preprocess", recipe, "--quiet", code=2)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines == [lines[0]] and lines[0].startswith(f"error: {url}: shard checksum mismatch"), result.output


def test_the_cache_key_of_a_bucket_corpus_follows_its_objects_generations(bucket):
    corpus = upload_corpus(bucket, "c", n=3)
    first = corpus_fingerprint(f"{corpus}/*.txt")
    assert corpus_fingerprint(f"{corpus}/*.txt") == first  # listed again: the same key
    assert corpus_fingerprint(corpus) != first.replace("bucket-", "local-")  # a folder URL: its objects too
    same = paths.read_bytes(f"{corpus}/doc001.txt")
    paths.write_bytes(f"{corpus}/doc001.txt", same)  # rewritten: a new generation, whatever its bytes
    assert corpus_fingerprint(f"{corpus}/*.txt") != first


def test_bucket_objects_read_as_local_files(bucket, tmp_path):
    rows = [{"text": line} for line in english_lines(20)]
    jsonl = "".join(json.dumps(r) + "\n" for r in rows).encode()
    paths.write_bytes(f"{bucket.url}/j/a.jsonl", jsonl)
    (tmp_path / "a.jsonl").write_bytes(jsonl)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [r["text"] for r in rows]}), tmp_path / "b.parquet")
    paths.upload(tmp_path / "b.parquet", f"{bucket.url}/p/b.parquet")
    assert load_corpus(f"{bucket.url}/j/a.jsonl").documents == load_corpus(str(tmp_path / "a.jsonl")).documents
    assert load_corpus(f"{bucket.url}/p").documents == load_corpus(str(tmp_path / "b.parquet")).documents


def test_an_empty_bucket_glob_is_one_line(bucket_home, tmp_path):
    recipe = tiny_recipe(tmp_path / "r.yaml", f"{bucket_home.url}/none/*.txt")
    result = invoke("preprocess", recipe, code=2)
    assert result.output.strip().splitlines() == [
        f"error: data.source '{bucket_home.url}/none/*.txt': matched no .txt/.jsonl/.csv/.parquet files"
    ]


def test_a_local_corpus_keyed_by_content_is_the_same_in_two_copies(tmp_path):
    a, b = tmp_path / "a" / "corpus", tmp_path / "b" / "corpus"
    a.mkdir(parents=True)
    (a / "x.txt").write_bytes(os.urandom(3 << 20).hex().encode())  # over 2 MiB: its ends are hashed
    (a / "y.txt").write_text("short\n")
    shutil.copytree(a, b)
    os.utime(b / "y.txt", ns=(1, 1))
    assert corpus_fingerprint(str(a)) != corpus_fingerprint(str(b))  # stat: their paths and times
    assert corpus_fingerprint(str(a), key="content") == corpus_fingerprint(str(b), key="content")
    (b / "y.txt").write_text("shorT\n")
    assert corpus_fingerprint(str(a), key="content") != corpus_fingerprint(str(b), key="content")


# slow: a gcsfs call made after it in the same process was seen to hang against fake-gcs-server (under study)
@pytest.mark.slow
def test_preprocess_and_pretrain_keep_the_cache_in_the_bucket(bucket_home, tmp_path):
    bucket = bucket_home
    corpus = upload_corpus(bucket, "corpus")
    recipe = tiny_recipe(tmp_path / "r.yaml", f"{corpus}/*.txt", data={"validation_fraction": 0.1})
    out = json.loads(invoke("preprocess", recipe, "--quiet").output)
    name = Path(out["path"]).name
    keys = bucket.keys(f"home/data/{name}")
    for key in ("metadata.json", "tokenizer.json", "train/00000.npy", "shards/00000.json", "shards/count.json"):
        assert f"home/data/{name}/{key}" in keys, keys
    assert Path(out["path"]).is_relative_to(tmp_path / "local-cache")  # this host's copies
    before = generations(bucket, "home")
    # a second command reuses the bucket's dataset: nothing is uploaded again; a lost local copy is fetched again
    shutil.rmtree(tmp_path / "local-cache")
    invoke("pretrain", recipe, "--stop-after", "2", "--quiet")
    assert generations(bucket, "home") == before
    assert not list(tmp_path.rglob("gs:")), "a bucket URL was made a local folder"
