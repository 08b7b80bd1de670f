"""The path layer: bucket URLs told apart from local paths, and refused in one line where they cannot be used."""

import pytest

from ssmlm.errors import UserError
from ssmlm.paths import check_url, is_remote, join, local, scheme


def test_urls_and_local_paths_are_told_apart():
    assert scheme("gs://b/runs") == "gs" and scheme("S3://b") == "s3"
    assert not is_remote("runs/gs:/x") and not is_remote("C:/data") and not is_remote("/tmp/a")
    assert join("gs://b/runs", "x", "checkpoints") == "gs://b/runs/x/checkpoints"


def test_a_url_is_never_made_a_local_folder(tmp_path):
    with pytest.raises(UserError, match=r"^--ckpt 'gs://b/r': a local path is expected here"):
        local("gs://b/r", "--ckpt")
    assert local("~/x", "--ckpt").is_absolute()


def test_a_scheme_ssmlm_cannot_open_is_one_line():
    with pytest.raises(UserError, match=r"^train.out_dir 's3://b/runs': ssmlm opens local paths and gs://"):
        check_url("s3://b/runs", "train.out_dir")


def test_a_missing_bucket_and_an_unreachable_server_are_one_line(bucket, monkeypatch):
    check_url(f"{bucket.url}/runs", "train.out_dir")  # exists: no error
    with pytest.raises(UserError, match=r"bucket gs://no-such-bucket does not exist"):
        check_url("gs://no-such-bucket/runs", "train.out_dir")


def test_an_unreachable_server_is_one_line(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # the discard port: refused at once
    with pytest.raises(UserError, match=r"^--out 'gs://b/x': bucket gs://b cannot be reached \("):
        check_url("gs://b/x", "--out")


def test_objects_in_a_bucket(bucket, tmp_path):
    from ssmlm import paths

    url = paths.join(bucket.url, "runs", "a", "run.json")
    assert not paths.exists(url)
    paths.write_bytes(url, b'{"kind": "pretrain"}')
    assert paths.exists(url) and paths.read_bytes(url) == b'{"kind": "pretrain"}'
    first = paths.info(url)["generation"]
    paths.write_bytes(url, b"{}")
    assert paths.info(url)["generation"] != first and paths.info(url)["size"] == 2
    (tmp_path / "t.json").write_text("x")
    paths.upload(tmp_path / "t.json", paths.join(bucket.url, "runs", "a", "t.json"))
    assert paths.listing(paths.join(bucket.url, "runs")) == [
        f"{bucket.url}/runs/a/run.json",
        f"{bucket.url}/runs/a/t.json",
    ]
    assert paths.glob(f"{bucket.url}/runs/a/*.json")[0].endswith("run.json")
    paths.download(url, tmp_path / "d" / "r.json")
    assert (tmp_path / "d" / "r.json").read_bytes() == b"{}"
    paths.remove(paths.join(bucket.url, "runs"), recursive=True)
    assert paths.listing(paths.join(bucket.url, "runs")) == [] and bucket.keys() == []
