"""Token shards on disk: how preprocessing writes them and how training reads them.

Two layouts, one directory per split (``train/``, ``validation/``), one file set per shard:
  rows       ``NNNNN.npy``: (n, L) packed rows, [CLS] tokens… [SEP] then 0-padding. Stored as uint16 when
             the vocabulary fits (half the disk and page cache of int32); read back as int32.
  documents  ``NNNNN.tokens.npy`` (every document's tokens back to back, no special tokens) and
             ``NNNNN.offsets.npy`` (int64, documents + 1 entries): for causal LMs, packed at training time.
A shard's files are written to a temporary name and renamed, so a file under its final name is complete.
Each file's SHA-256 is written at preprocessing (metadata.json) and checked when a reader opens the split: bytes
changed since (a damaged disk, a stray write) stop the run with one line. A file whose hash matched is recorded in
verified.json with its size and modification time and not hashed again while both stay the same (a write to
the file changes its modification time; a fault below the file system that changes neither is not caught).
Readers memory-map the shards: only the rows asked for are read from disk, so a corpus far larger than
memory trains from a small machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np

from ssmlm.errors import DataError
from ssmlm.progress import console

VERIFIED = "verified.json"
_unchecked_noted: set[Path] = set()


def row_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def _tmp_name(path: Path) -> Path:
    # unique per writer: hosts sharing a directory may write the same small file at once
    return path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def save_atomic(path: Path, array: np.ndarray) -> str:
    """np.save under a temporary name, then rename: a crash leaves a stray .tmp, never a short file. Returns the
    file's checksum."""
    tmp = _tmp_name(path)
    with open(tmp, "wb") as f:
        np.save(f, array)
    digest = file_checksum(tmp)
    os.replace(tmp, path)
    return digest


def file_checksum(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_json_atomic(path: Path, obj) -> None:
    tmp = _tmp_name(path)
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def shard_name(index: int) -> str:
    return f"{index:05d}"


def _split_shards(data_dir: Path, split: str, layout: str) -> list[dict]:
    meta_path = Path(data_dir) / "metadata.json"
    if not meta_path.is_file():
        raise DataError(f"{data_dir}: not a preprocessed dataset (no metadata.json); run `ssmlm preprocess` first")
    meta = json.loads(meta_path.read_text())
    if meta.get("layout", "rows") != layout:
        raise DataError(f"{data_dir}: holds the '{meta.get('layout', 'rows')}' layout, not '{layout}'")
    if split not in meta.get("splits", {}):
        raise DataError(f"{data_dir}: has no '{split}' split (has {list(meta.get('splits', {}))})")
    shards = [dict(s, file=s["files"][split]) for s in meta["shards"] if s[split]]
    _verify(Path(data_dir), shards, meta.get("layout", "rows"))
    return shards


def shard_files(file: str, layout: str) -> list[str]:
    """The files (relative to the dataset) of one shard's split, as named in metadata.json's ``files``."""
    return [file] if layout == "rows" else [f"{file}.tokens.npy", f"{file}.offsets.npy"]


def _verify(data_dir: Path, shards: list[dict], layout: str) -> None:
    """Every file of ``shards`` has the checksum preprocessing wrote, or a DataError names it. A dataset written
    before checksums existed is read unchecked, saying so once."""
    expected = {}
    for s in shards:
        for rel in shard_files(s["file"], layout):
            expected[rel] = s.get("checksums", {}).get(rel)
    if None in expected.values():
        if data_dir not in _unchecked_noted:
            _unchecked_noted.add(data_dir)
            console.print(
                f"note: {data_dir} was preprocessed before shards had checksums: read unchecked (remove it to "
                "rebuild it with them)",
                soft_wrap=True,
                markup=False,
            )
        return
    bad = unverified(data_dir, expected)
    if bad:
        path = data_dir / bad[0]
        if not path.is_file():
            raise DataError(f"{path}: shard missing; remove {data_dir} to rebuild the dataset")
        raise DataError(
            f"{path}: shard checksum mismatch (its bytes changed after preprocessing); remove {data_dir} "
            "to rebuild the dataset (the next run or `ssmlm preprocess` does)"
        )


def unverified(data_dir: Path, expected: dict[str, str]) -> list[str]:
    """The files of ``expected`` (path relative to ``data_dir`` -> SHA-256) missing or whose bytes differ; those
    that match are remembered in verified.json (not hashed again while their size and modification time stay)."""
    try:
        verified = json.loads((data_dir / VERIFIED).read_text())
    except (OSError, ValueError):
        verified = {}
    fresh, bad = {}, []
    for rel, digest in expected.items():
        path = data_dir / rel
        try:
            st = path.stat()
        except OSError:
            bad.append(rel)
            continue
        seen = [st.st_size, st.st_mtime_ns, digest]
        if verified.get(rel) == seen:
            continue
        if file_checksum(path) != digest:
            bad.append(rel)
        else:
            fresh[rel] = seen
    remember(data_dir, fresh, verified)
    return bad


def remember(data_dir: Path, fresh: dict[str, list], verified: dict | None = None) -> None:
    """Record files (relative path -> [size, mtime_ns, SHA-256]) as checked in ``data_dir``'s verified.json."""
    if not fresh:
        return
    if verified is None:
        try:
            verified = json.loads((data_dir / VERIFIED).read_text())
        except (OSError, ValueError):
            verified = {}
    try:  # a read-only dataset is still checked, only not remembered
        write_json_atomic(data_dir / VERIFIED, {**verified, **fresh})
    except OSError:
        pass


class TokenRows:
    """A split's packed rows across its shards, as one table: ``len`` rows of ``seq_len`` tokens.

    ``rows[idx]`` with a slice or an int array (sorted, as ``Batches`` asks) returns
    ``{"tokens": (k, L) int32, "row": (k,) int64 global row indices}``; only those rows are read.
    """

    def __init__(self, data_dir: str | Path, split: str):
        self.data_dir = Path(data_dir)
        shards = _split_shards(self.data_dir, split, "rows")
        self._files = [self.data_dir / s["file"] for s in shards]
        counts = np.array([s[split] for s in shards], np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._maps: list[np.ndarray | None] = [None] * len(self._files)
        meta = json.loads((self.data_dir / "metadata.json").read_text())
        self.seq_len = int(meta["max_seq_length"])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _shard(self, i: int) -> np.ndarray:
        if self._maps[i] is None:
            self._maps[i] = np.load(self._files[i], mmap_mode="r")  # opened on first use: many shards, few files
        return self._maps[i]

    def __getitem__(self, idx) -> dict[str, np.ndarray]:
        if isinstance(idx, slice):
            rows = np.arange(len(self))[idx]
        else:
            rows = np.asarray(idx, np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} rows")
        out = np.empty((len(rows), self.seq_len), np.int32)
        shard = np.searchsorted(self._starts, rows, side="right") - 1
        for s in np.unique(shard):
            sel = shard == s
            out[sel] = self._shard(int(s))[rows[sel] - self._starts[s]]
        return {"tokens": out, "row": rows}

    def with_format(self, _):
        return self


class TokenDocuments:
    """A split's documents (layout ``documents``): ``docs[i]`` is document i's tokens as int32."""

    def __init__(self, data_dir: str | Path, split: str):
        self.data_dir = Path(data_dir)
        shards = _split_shards(self.data_dir, split, "documents")
        self._files = [self.data_dir / s["file"] for s in shards]
        counts = np.array([s[split] for s in shards], np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._maps: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _shard(self, i: int):
        if i not in self._maps:
            base = str(self._files[i])
            self._maps[i] = (np.load(base + ".tokens.npy", mmap_mode="r"), np.load(base + ".offsets.npy"))
        return self._maps[i]

    @property
    def lengths(self) -> np.ndarray:
        """Every document's token count, from the offsets alone (no token is read)."""
        if not hasattr(self, "_lengths"):
            parts = [np.diff(self._shard(i)[1]) for i in range(len(self._files))]
            self._lengths = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return self._lengths

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"document {i} out of range for {len(self)} documents")
        s = int(np.searchsorted(self._starts, i, side="right") - 1)
        tokens, offsets = self._shard(s)
        j = i - self._starts[s]
        return np.asarray(tokens[offsets[j] : offsets[j + 1]], np.int32)
