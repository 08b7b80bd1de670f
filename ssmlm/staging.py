"""A run whose home is a bucket (``train.out_dir=gs://…``, ``--ckpt gs://…``) is worked on in a local staging
folder: its small records (recipe.yaml, run.json, tokenizer.json, metrics.jsonl, launches.json, summary.json,
loss.png, eval/, analysis/) are downloaded into a fresh temporary folder at the start, the code reads and writes
them there as in any run directory, and the lead process uploads what changed: metrics.jsonl at most every
``LOG_SYNC_S`` seconds while it grows (GCS has no append: each upload is the whole file), everything at every
checkpoint and at the end, a failed end included. The folder is removed at the end, so nothing but logs stays on
local disk. Checkpoints are never staged: Orbax reads and writes them in the bucket (``checkpoints_url``).

A staging folder carries its URL in a marker file, so that code handed the local folder (the checkpoint reader,
the lock, the records naming a source run) finds the bucket without a second argument threaded through. A folder
inside a staging folder stands for the same place under its URL: an experiment in a bucket (``experiment --out
gs://…``) is one staging folder, and each of its runs is a run in the bucket, its checkpoints written there.

Outputs that are not runs (``evaluate --out``, ``results --out``, ``analyze --out``) are written into a temporary
file or folder and uploaded when the command succeeds (``output``).
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from ssmlm import paths

MARK = ".ssmlm-url"  # in a staging folder: the gs:// URL it stages
NOT_STAGED = ("checkpoints", "broken-checkpoints", "LOCK")  # Orbax's, in the bucket; the bucket's own lock
LOG_SYNC_S = 10.0

_synced: dict[str, dict[str, tuple[int, int]]] = {}  # staging folder -> file -> (size, mtime) as last uploaded
_last_sync: dict[str, float] = {}


def url_of(run_dir: str | Path | None) -> str | None:
    """The bucket URL a run directory stands for: itself when a URL; for a staging folder, or a folder inside one,
    the marker's URL (and the path below it)."""
    if run_dir is None:
        return None
    if paths.is_remote(run_dir):
        return str(run_dir)
    d = Path(run_dir).absolute()
    for up in (d, *d.parents):
        mark = up / MARK
        if mark.is_file():
            below = d.relative_to(up).as_posix()
            url = mark.read_text().strip()
            return url if below == "." else paths.join(url, below)
    return None


def location(run_dir: str | Path) -> str:
    """How to name a run directory to a person or in a record: its URL when it is staged."""
    return url_of(run_dir) or str(run_dir)


def checkpoints_url(run_dir: str | Path) -> str | None:
    url = url_of(run_dir)
    return paths.join(url, "checkpoints") if url else None


def _staged(rel: str) -> bool:
    """A record of a staged folder (not a checkpoint or the bucket's lock, of its own run or of a run inside it)."""
    return not any(part in NOT_STAGED or part == MARK for part in rel.split("/"))


def _records(local: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in local.rglob("*"):
        rel = p.relative_to(local).as_posix()
        if p.is_file() and not rel.endswith(".tmp") and _staged(rel):
            st = p.stat()
            out[rel] = (st.st_size, st.st_mtime_ns)
    return out


def _download(url: str, local: Path) -> bool:
    """The run's records into ``local``; True when the bucket holds anything under ``url``."""
    found = paths.listing(url)
    base = url.rstrip("/") + "/"
    for obj in found:
        rel = obj[len(base) :]
        if rel and _staged(rel):
            paths.download(obj, local / rel)
    return bool(found)


def _new_folder(url: str) -> Path:
    """A fresh temporary folder named as the run (code that names a run by its folder's name sees the same)."""
    local = Path(tempfile.mkdtemp(prefix="ssmlm-staged-")) / PurePosixPath(url.rstrip("/")).name
    local.mkdir()
    return local


def sync(run_dir: str | Path, at_most_every_s: float = 0.0) -> None:
    """Upload the staged records that changed since the last upload (a no-op for a local run directory)."""
    url = url_of(run_dir) if not paths.is_remote(run_dir) else None
    if url is None:
        return
    if _host() != 0:  # one writer of a run's records: process 0
        return
    key = str(run_dir)
    now = time.monotonic()
    if at_most_every_s and now - _last_sync.get(key, float("-inf")) < at_most_every_s:
        return
    local = Path(run_dir)
    state, old = _records(local), _synced.get(key, {})
    for rel, sig in state.items():
        if old.get(rel) != sig:
            paths.upload(local / rel, paths.join(url, rel))
    for rel in old.keys() - state.keys():  # removed here (a record rewritten under another name): there too
        paths.remove(paths.join(url, rel))
    _synced[key], _last_sync[key] = state, now


def refresh(run_dir: str | Path, *names: str) -> None:
    """Download ``names`` of a staged run's records again (another host, process 0, wrote them since)."""
    url = url_of(run_dir) if not paths.is_remote(run_dir) else None
    for name in names if url else ():
        paths.download(paths.join(url, name), Path(run_dir) / name)


def _host() -> int:
    import jax  # only once a run is staged, by then loaded

    return jax.process_index()


@contextlib.contextmanager
def staged(url: str, lead: Callable[[], bool] = lambda: True, runs_inside: bool = False) -> Iterator[Path]:
    """A local staging folder for the run at ``url``, its records downloaded; at the end the lead process
    (``lead()``, asked then: a distributed start may make it known only inside) uploads what changed, and the
    folder is removed. A run new to the bucket that fails before training anything leaves nothing there (as a
    local run directory is removed then): a half-made run would refuse the corrected command. ``runs_inside``: a
    folder of runs (an experiment), whose records are uploaded whatever happened."""
    local = _new_folder(url)
    key = str(local)
    try:
        existed = _download(url, local)
        (local / MARK).write_text(url)
        _synced[key] = _records(local)
        ok = False
        try:
            yield local
            ok = True
        finally:
            if lead():
                trained = (local / "metrics.jsonl").exists() or paths.glob(paths.join(url, "checkpoints", "*"))
                if ok or existed or trained or runs_inside:
                    sync(local)
                else:
                    paths.remove(url, recursive=True)
    finally:
        _synced.pop(key, None)
        _last_sync.pop(key, None)
        shutil.rmtree(local.parent, ignore_errors=True)


_fetched: dict[str, Path] = {}


def fetched(url: str) -> Path:
    """A read-only local copy of the records of the run at ``url`` (its checkpoints stay in the bucket), made once
    per process and removed when the process exits."""
    if url not in _fetched:
        local = _new_folder(url)
        atexit.register(shutil.rmtree, local.parent, True)
        _download(url, local)
        (local / MARK).write_text(url)
        _fetched[url] = local
    return _fetched[url]


def records(run_dir: str | Path) -> Path:
    """Where to read a run directory's records: itself, or for a URL its local copy (``fetched``)."""
    return fetched(str(run_dir)) if paths.is_remote(run_dir) else Path(run_dir).expanduser()


@contextlib.contextmanager
def output(path: str | Path, folder: bool = False) -> Iterator[Path]:
    """Where to write a command's output file (``folder``: folder) named ``path``: itself when local; for a gs://
    URL a temporary one, uploaded there when the block ends without an error, then removed."""
    if not paths.is_remote(path):
        yield Path(path).expanduser()
        return
    url = str(path).rstrip("/")
    tmp = Path(tempfile.mkdtemp(prefix="ssmlm-out-"))
    local = tmp / PurePosixPath(url).name
    try:
        if folder:
            local.mkdir()
        yield local
        if folder:
            for p in sorted(local.rglob("*")):
                if p.is_file():
                    paths.upload(p, paths.join(url, p.relative_to(local).as_posix()))
        elif local.exists():
            paths.upload(local, url)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
