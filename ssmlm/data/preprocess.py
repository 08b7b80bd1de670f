"""Text -> tokenizer -> token shards on disk, streamed: memory stays bounded whatever the corpus size.

Preprocessing only tokenises (and, in the default ``rows`` layout, packs); masking and other training
objectives are applied on the fly at training time, so they are not part of the cache key.

Output directory (reused when the same inputs come again):
  train/, validation/     the shards (ssmlm.data.shards): packed rows, or documents' tokens + offsets
  shards/NNNNN.json       one per finished chunk: its counts; written after the chunk's shard files
  tokenizer.json          the tokenizer the ids refer to
  metadata.json           fingerprint, tokenizer ids, lengths, counts, fill rates and the shard list;
                          written last (atomically): a directory without it is unfinished, never used
The corpus is read as a stream and cut into chunks at deterministic points (``chunk_chars`` characters of
text or ``chunk_documents`` documents, whichever comes first); each chunk is tokenised (``encode_batch``,
all cores), packed with a generator seeded by (seed, chunk index) and written as one shard per split.
A shard is thus a pure function of its documents and its index: an interrupted run resumes at the first
unfinished chunk, skipping the finished chunks' documents without tokenising them, and writes exactly
the shards an uninterrupted run would. Packing does not cross chunk boundaries: mode ``full`` starts a
fresh stream (one short row) per chunk. Validation documents are chosen by a hash of their text, so
the split is stable across runs, chunkings and hosts.

Several hosts (``hosts=(index, count)``) each read the whole stream but tokenise only the chunks with
``chunk % count == index``; host 0 writes metadata.json once every shard exists (``finalize``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from rich.text import Text

from ssmlm import paths
from ssmlm.data.books import SPLIT_ABOVE
from ssmlm.data.config import DataConfig
from ssmlm.data.packing import pack, rows_to_array
from ssmlm.data.shards import (
    file_checksum,
    remember,
    row_dtype,
    save_atomic,
    shard_files,
    shard_name,
    unverified,
    write_json_atomic,
)
from ssmlm.data.sources import Document, corpus_fingerprint, corpus_name, local_cache, open_corpus
from ssmlm.data.tokenizer import (
    is_lm_tokenizer,
    lm_special_ids,
    load_lm_tokenizer,
    load_tokenizer,
    special_ids,
    train_byte_bpe,
    train_wordpiece,
)
from ssmlm.errors import DataError, Interrupted, UserError
from ssmlm.hosts import wait_for
from ssmlm.lockfile import locked
from ssmlm.progress import console, progress_bar

FORMAT_VERSION = 3  # 3: unmasked token shards, streamed (2: packing modes, fill_rate)
SPLITS = ("train", "validation")
LAYOUTS = ("rows", "documents")
# the DataConfig fields that change the tokens written (masking settings are training-time, not here)
TOKEN_FIELDS = (
    "source",
    "text_field",
    "split",
    "max_documents",
    "tokenizer",
    "vocab_size",
    "lowercase",
    "max_seq_length",
    "short_seq_prob",
    "packing",
    "validation_fraction",
    "seed",
)
CHUNK_CHARS = 32 << 20  # ~32 MB of text per shard: ~8M tokens, a few hundred MB of working memory
CHUNK_DOCUMENTS = 1 << 18  # bounds a chunk of many tiny documents (per-document Python overhead)
# documents layout: a longer document (a book in one row of a .jsonl: long .txt files are already cut into documents
# as they are read, ssmlm.data.books) is cut into pieces of about this many characters, so that a corpus of a few
# long documents still holds validation documents out
PIECE_CHARS = 50_000
FILL_WARN = 0.85  # rows less filled than this waste that much compute on padding: the run says so
ENCODE_CHARS = 4 << 20  # text per encode_batch call: enough lines to keep every core busy, few MB of Encodings


def ssmlm_home() -> Path | str:
    """SSMLM_HOME: a local folder, or a gs:// URL (the preprocessed data then lives in the bucket)."""
    home = os.environ.get("SSMLM_HOME")
    if paths.is_remote(home):
        return home.rstrip("/")
    return Path(home or Path.home() / ".cache" / "ssmlm").expanduser()


@dataclass
class Store:
    """Where a dataset's finished files count as written: its local folder ``out``, or with a cache in a bucket
    (``url``) the bucket, ``out`` then holding this host's copies (written here and uploaded, or downloaded). In a
    bucket a shard's files are uploaded before its marker and metadata.json last, so what the markers and
    metadata.json name is there whole; every host finds the others' work there, never on a shared disk."""

    out: Path
    url: str | None = None

    def done(self, rel: str) -> bool:
        """Whether ``rel`` is written; a bucket's copy is fetched into ``out`` (replacing a local one)."""
        if self.url is None:
            return (self.out / rel).is_file()
        try:
            paths.info(paths.join(self.url, rel))  # not a cached listing: another host may have written it since
        except FileNotFoundError:
            return False
        self.fetch(rel)
        return True

    def fetch(self, rel: str) -> Path:
        dest = self.out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{dest.name}.{os.getpid()}.download")
        paths.download(paths.join(self.url, rel), tmp)
        os.replace(tmp, dest)
        return dest

    def publish(self, *rels: str) -> None:
        """Upload ``rels`` from ``out`` to the bucket, in order (nothing to do for a local dataset)."""
        for rel in rels if self.url else ():
            paths.upload(self.out / rel, paths.join(self.url, rel))

    def pull(self, meta: dict) -> None:
        """This host's copies of the tokenizer and of every shard file, each checked against metadata.json's
        checksum: a missing, torn or changed local copy is downloaded again; a bucket copy whose bytes differ
        from what preprocessing wrote stops the run in one line."""
        if self.url is None:
            return
        if not (self.out / "tokenizer.json").is_file():
            self.fetch("tokenizer.json")
        expected = {rel: d for s in meta["shards"] for rel, d in s.get("checksums", {}).items()}
        for rel in unverified(self.out, expected):
            path = self.fetch(rel)
            if file_checksum(path) != expected[rel]:
                path.unlink()
                raise DataError(
                    f"{paths.join(self.url, rel)}: shard checksum mismatch (the bucket's copy changed after "
                    f"preprocessing); remove {self.url} to rebuild the dataset (the next run or `ssmlm preprocess` "
                    "does)"
                )
            st = path.stat()
            remember(self.out, {rel: [st.st_size, st.st_mtime_ns, expected[rel]]})


def dataset_store(
    cfg: DataConfig,
    seq_len: int,
    out_root: Path | str | None = None,
    layout: str = "rows",
    chunk_chars: int = CHUNK_CHARS,
    chunk_documents: int = CHUNK_DOCUMENTS,
) -> tuple[Store, str]:
    """(store, fingerprint) of the preprocessed data for these inputs: in a bucket when SSMLM_HOME (or
    ``out_root``) is a gs:// URL, its local copies then under the local cache (SSMLM_LOCAL_CACHE)."""
    name, fingerprint = _dataset_name(cfg, seq_len, layout, chunk_chars, chunk_documents)
    home = ssmlm_home()
    root = out_root or (paths.join(home, "data") if paths.is_remote(home) else home / "data")
    if paths.is_remote(root):
        url = paths.join(str(root), name)
        return Store(local_cache() / "datasets" / url.split("://", 1)[1], url), fingerprint
    return Store(Path(root) / name), fingerprint


def _file_hash(path: str) -> str:
    p = Path(path).expanduser()
    if p.is_dir():
        p = next((p / n for n in ("tokenizer.json", "vocab.txt") if (p / n).is_file()), p)
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.is_file() else "missing"


def _is_validation(doc: list[str], fraction: float) -> bool:
    digest = hashlib.sha1("\n".join(doc).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def shard_rng(seed: int, index: int, split: str) -> np.random.Generator:
    """The packing generator of shard ``index``'s ``split``: shards do not depend on one another."""
    return np.random.default_rng([seed, index, split == "train"])


def output_dir(
    cfg: DataConfig,
    seq_len: int,
    out_root: Path | str | None = None,
    layout: str = "rows",
    chunk_chars: int = CHUNK_CHARS,
    chunk_documents: int = CHUNK_DOCUMENTS,
) -> tuple[Path, str]:
    """(local directory, fingerprint) of the preprocessed data for these inputs, computed without reading the
    text (with a cache in a bucket: the directory of this host's copies)."""
    store, fingerprint = dataset_store(cfg, seq_len, out_root, layout, chunk_chars, chunk_documents)
    return store.out, fingerprint


def _dataset_name(cfg: DataConfig, seq_len: int, layout: str, chunk_chars: int, chunk_documents: int):
    if layout not in LAYOUTS:
        raise DataError(f"preprocess layout '{layout}': expected one of {LAYOUTS}")
    key = json.dumps(
        {
            "v": FORMAT_VERSION,
            "cfg": {f: getattr(cfg, f) for f in TOKEN_FIELDS},
            # only when not the default, so that WordPiece datasets keep the directories they had
            **({"tokenizer_type": cfg.tokenizer_type} if cfg.tokenizer_type != "wordpiece" else {}),
            **({"split_digits": True} if cfg.split_digits else {}),
            "len": seq_len,
            "corpus": corpus_fingerprint(
                cfg.source,
                cfg.text_field,
                cfg.split,
                cfg.max_documents,
                strip_gutenberg=cfg.strip_gutenberg,
                key=cfg.corpus_key,
            ),
            "tok": "train" if cfg.tokenizer == "train" else _file_hash(cfg.tokenizer),
            "layout": layout,
            "chunk": [chunk_chars, chunk_documents],  # where shards begin: part of what the rows are
            **({"pieces": PIECE_CHARS} if layout == "documents" else {}),
        },
        sort_keys=True,
    )
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    name = f"{corpus_name(cfg.source)}-L{seq_len}{'' if layout == 'rows' else '-docs'}-{fingerprint}"  # no glob's '*'
    return name, fingerprint


def _after_shard(index: int) -> None:
    """Called after each shard is complete; tests replace it to interrupt a run at a known point."""


def pieces(documents: Iterable[Document], max_chars: int = PIECE_CHARS) -> Iterator[Document]:
    """Documents longer than ``max_chars`` cut into consecutive pieces: each piece ends at the first blank line
    (a paragraph break) after ``max_chars`` characters, or at any line once it reaches twice that."""
    for doc in documents:
        piece, size = [], 0
        for line in doc:
            piece.append(line)
            size += len(line)
            if size >= max_chars and (not line.strip() or size >= 2 * max_chars):
                yield piece
                piece, size = [], 0
        if piece:
            yield piece


def chunks(documents: Iterable[Document], chunk_chars: int, chunk_documents: int) -> Iterator[list[Document]]:
    """Consecutive documents, cut after ``chunk_chars`` characters or ``chunk_documents`` documents: the
    cut points depend only on the text, so every run (and every host) sees the same chunks."""
    chunk, size = [], 0
    for doc in documents:
        chunk.append(doc)
        size += sum(map(len, doc))
        if size >= chunk_chars or len(chunk) >= chunk_documents:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def preprocess(
    cfg: DataConfig,
    seq_len: int,
    out_root: Path | None = None,
    quiet: bool = False,
    *,
    layout: str = "rows",
    hosts: tuple[int, int] = (0, 1),
    chunk_chars: int = CHUNK_CHARS,
    chunk_documents: int = CHUNK_DOCUMENTS,
) -> Path:
    """Run (or reuse, or resume) preprocessing for ``cfg`` at sequence length ``seq_len``; returns the output
    dir. With ``hosts=(i, n)``, tokenise chunks i, i+n, …; host 0 then waits for the others' shards and
    writes metadata.json, the other hosts return once their own shards are written."""
    if seq_len < 8:
        raise DataError(f"data.max_seq_length = {seq_len}: expected at least 8")
    host, n_hosts = hosts
    if not 0 <= host < n_hosts:
        raise DataError(f"preprocess hosts = {hosts}: expected (index, count) with 0 <= index < count")
    store, fingerprint = dataset_store(cfg, seq_len, out_root, layout, chunk_chars, chunk_documents)
    out, meta_path = store.out, store.out / "metadata.json"

    def finished() -> bool:  # a finished dataset is only read: no lock. In a bucket, its metadata.json decides
        if store.url and not store.done("metadata.json"):
            return False
        return meta_path.is_file() and json.loads(meta_path.read_text()).get("fingerprint") == fingerprint

    if not finished():
        # one writer per dataset: a second one waits (two runs of one corpus started together both go on, the
        # second reusing what the first wrote) rather than stopping. Host 0 holds it for all hosts of one job. The
        # lock is local: writers of one bucket cache on several machines write the same objects (the tokenizer is
        # created only if absent and every writer then uses the bucket's; shards are a function of it), so they
        # need none.
        lock = locked(out, "dataset", wait=True, say=None if quiet else _say) if host == 0 else contextlib.nullcontext()
        with _removed_if_refused(store), lock:
            if not finished():
                _tokenize(cfg, seq_len, store, quiet, layout, hosts, chunk_chars, chunk_documents)
                if host != 0:
                    return out
                finalize(
                    cfg, seq_len, out_root, layout=layout, chunk_chars=chunk_chars, chunk_documents=chunk_documents
                )
    meta = read_metadata(out)
    store.pull(meta)
    for note in (packing_note(meta), validation_note(meta) if layout == "rows" else None):  # LM runs say their own
        if note and not quiet:
            console.print(note, soft_wrap=True)
    return out


def validation_note(meta: dict) -> str | None:
    """One line on what data.validation_fraction held out for the validation loss: its rows, or (a warning) none
    from a few long documents."""
    fraction = meta.get("config", {}).get("validation_fraction", 0)
    rows = meta["splits"].get("validation", {}).get("sequences")
    if not fraction:
        return "validation: none held out (data.validation_fraction = 0)"
    if rows:
        documents = f"{meta['documents']:,} documents"
        return f"validation: {rows:,} rows held out (data.validation_fraction = {fraction} of {documents})"
    return (
        f"[yellow]no validation:[/] data.validation_fraction = {fraction} of {meta['documents']:,} documents held "
        "none out; raise it or give more text for a validation loss"
    )


@contextlib.contextmanager
def _removed_if_refused(store: Store):
    """The output directory (and its bucket folder), if this call creates it, is removed again when the data is
    refused (a UserError: nothing worth resuming, and a failed attempt should leave no cache behind); an interrupted
    or crashed run keeps it, to resume at its first unfinished shard."""
    created = not store.out.exists()
    created_remote = store.url is not None and not paths.listing(store.url)
    try:
        yield
    except Interrupted:
        raise
    except UserError:
        if created:
            shutil.rmtree(store.out, ignore_errors=True)
        if created_remote:
            paths.remove(store.url, recursive=True)
        raise


def packing_note(meta: dict) -> str | None:
    """One line when a row layout's training rows are less than FILL_WARN filled with text: how much of every row
    is padding, and the packing that would fill them (None when they are full enough)."""
    fill = meta.get("fill_rate")
    if fill is None or fill >= FILL_WARN:
        return None
    packing, short = meta.get("packing", "fill"), meta.get("config", {}).get("short_seq_prob", 0.0)
    head = f"[yellow]packing:[/] the training rows are {fill:.0%} text, {1 - fill:.0%} padding"
    if packing == "full":
        return (
            f"{head} (data.packing: full already: data.short_seq_prob = {short} draws that share of the rows "
            "short, and the last row of every ~32 MB chunk is short)"
        )
    return (
        f"{head} (data.packing: {packing} starts a row per document, and these documents are short); "
        f"data.packing: full would fill them to about {full_fill(meta['max_seq_length'], short):.0%}, "
        "running rows on across documents with a [SEP] between them"
    )


def full_fill(seq_len: int, short_seq_prob: float) -> float:
    """The fill rate ``full`` packing reaches on a long corpus: a row holds its target length (``seq_len`` - 2,
    or with probability ``short_seq_prob`` uniform in [2, seq_len - 2]) plus [CLS] and [SEP]."""
    most = seq_len - 2
    mean_target = (1 - short_seq_prob) * most + short_seq_prob * (2 + most) / 2
    return (mean_target + 2) / seq_len


def _tokenize(cfg, seq_len, store, quiet, layout, hosts, chunk_chars, chunk_documents) -> None:
    """Tokenise (and pack) this host's unfinished chunks into ``store``; the chunk count goes to shards/count.json."""
    host, n_hosts = hosts
    out = store.out
    for d in (out / "shards", *(out / s for s in SPLITS)):
        d.mkdir(parents=True, exist_ok=True)
    # training the tokenizer reads the corpus first: that pass says what reading did to the files (split, stripped)
    said = not quiet and cfg.tokenizer == "train" and host == 0 and not (out / "tokenizer.json").is_file()
    tok = _tokenizer(cfg, store, host, quiet, layout)
    ids = _special_ids(tok)
    if layout == "rows" and is_lm_tokenizer(tok):
        raise DataError(f"tokenizer '{cfg.tokenizer}': a language-model tokenizer needs the 'documents' layout")
    if ids["pad"] != 0:
        raise DataError(f"tokenizer '{cfg.tokenizer}': [PAD] must have id 0 (has {ids['pad']})")
    dtype = row_dtype(tok.get_vocab_size()) if layout == "rows" else np.dtype(np.int32)

    stream = _corpus(cfg, say=None if quiet or said else _say)
    by_bytes = stream.total_bytes is not None
    written = n_chunks = 0
    t0, n_tokens = time.perf_counter(), 0
    with progress_bar(quiet, "tokens/s", rate=False) as bar:  # "294,129 tokens/s" says more than MB/s
        total = stream.total_bytes / 1e6 if by_bytes else stream.total_documents
        unit = "MB" if by_bytes else "documents"
        task = bar.add_task(f"tokenizing ({unit})", total=total, **{"tokens/s": "-"})
        try:
            documents = pieces(stream.documents) if layout == "documents" else stream.documents
            for index, chunk in enumerate(chunks(documents, chunk_chars, chunk_documents)):
                n_chunks = index + 1
                marker = f"shards/{shard_name(index)}.json"
                if index % n_hosts == host and not store.done(marker):
                    stats = _write_shard(out, index, chunk, tok, ids, cfg, seq_len, layout, dtype)
                    write_json_atomic(out / marker, stats)  # last: the shard counts as done from here on
                    store.publish(*stats["checksums"], marker)
                    written += 1
                    n_tokens += stats["tokens"]
                    _after_shard(index)
                rate = n_tokens / max(time.perf_counter() - t0, 1e-9)
                done = sum(map(len, itertools.chain.from_iterable(chunk))) / 1e6 if by_bytes else len(chunk)
                bar.update(task, advance=done, **{"tokens/s": f"{rate:,.0f}"})
        except KeyboardInterrupt:
            raise Interrupted(
                f"preprocessing interrupted ({written} shard(s) written to {out}); run the same command again to resume"
            ) from None
        if by_bytes:
            bar.update(task, completed=total)  # file sizes include markup the text count does not
    if not n_chunks:
        raise DataError(f"data.source '{cfg.source}': holds no text")
    write_json_atomic(out / "shards" / "count.json", {"chunks": n_chunks})
    store.publish("shards/count.json")


def _corpus(cfg: DataConfig, say=None):
    """A pass over the recipe's corpus; ``say``: this pass says what reading did to the files."""
    return open_corpus(
        cfg.source, cfg.text_field, cfg.split, cfg.max_documents, strip_gutenberg=cfg.strip_gutenberg, say=say
    )


def _say(line: str) -> None:
    console.print(Text(line), soft_wrap=True)  # as Text: brackets in a file's name are not markup


def _trained_tokenizer(cfg: DataConfig, quiet: bool, rows: bool):
    """A tokenizer trained on the corpus, first saying so and on how many documents. Local files are counted in a
    pass of their own (cheap next to training), which also says which files were split or stripped and, for the
    ``rows`` layout (whose documents are not cut further), refuses a split that would leave no training text."""
    stream = _corpus(cfg, say=None if quiet else _say)
    n = stream.total_documents
    if local := stream.total_bytes is not None:
        n = train = 0
        for doc in stream.documents:
            n += 1
            train += not _is_validation(doc, cfg.validation_fraction)
        if rows and not train:
            raise DataError(_no_training_text(cfg, n))
        stream = _corpus(cfg)
    docs = iter(stream.documents)
    first = next(docs, None)  # a hub source is opened here, so that an unreachable one fails before the line below
    docs = itertools.chain([] if first is None else [first], docs)
    lm = cfg.tokenizer_type == "byte_bpe"
    if not quiet:
        count = "streamed" if n is None else f"{n:,} document{'s' if n != 1 else ''}"
        where = {"builtin": f"the built-in corpus ({stream.description}, {count})"}.get(
            cfg.source, f"your corpus ({count})" if local else f"{stream.description} ({count})"
        )
        _say(
            f"tokenizer: training a {'byte-level BPE' if lm else 'WordPiece'} of up to {cfg.vocab_size:,} tokens "
            f"on {where}…"
        )
    lines = (line for doc in docs for line in doc)
    if lm:
        return train_byte_bpe((line + "\n" for line in lines), cfg.vocab_size, cfg.split_digits)
    opened = [lines]

    def read():  # train_wordpiece reads the text twice (what makes it deterministic): the stream open, then again
        return opened.pop() if opened else (line for doc in _corpus(cfg).documents for line in doc)

    return train_wordpiece(read, cfg.vocab_size, cfg.lowercase)


def _no_training_text(cfg: DataConfig, documents: int) -> str:
    held = "its only document" if documents == 1 else f"all {documents:,} documents"
    return (
        f"data.source '{cfg.source}': no training text left after the validation split (data.validation_fraction "
        f"= {cfg.validation_fraction} held out {held}); lower data.validation_fraction (0 holds none out) or give "
        f"more text (a .txt file under {SPLIT_ABOVE:,} characters is one document)"
    )


def _tokenizer(cfg: DataConfig, store: Store, host: int, quiet: bool = True, layout: str = "rows"):
    """The run's tokenizer, saved in the store first thing: a resumed run (and every host) uses that copy."""
    saved = store.out / "tokenizer.json"
    if not store.done("tokenizer.json"):
        lm = cfg.tokenizer_type == "byte_bpe"
        if cfg.tokenizer != "train":
            tok = load_lm_tokenizer(cfg.tokenizer) if lm else load_tokenizer(cfg.tokenizer, cfg.lowercase)
        elif host == 0:
            tok = _trained_tokenizer(cfg, quiet, rows=layout == "rows")
        else:  # the other hosts use host 0's tokenizer: training is not guaranteed to be bit-identical
            wait_for(lambda: store.done("tokenizer.json"), f"the tokenizer {saved}")
            return _load_saved(saved)
        tmp = saved.with_name(f"tokenizer.json.{host}.tmp")
        tok.save(str(tmp))
        os.replace(tmp, saved)
        if store.url and not paths.create(paths.join(store.url, "tokenizer.json"), saved.read_bytes()):
            store.fetch("tokenizer.json")  # another machine's writer was first: its tokenizer is the dataset's
    return _load_saved(saved)


def _load_saved(path: Path):
    """A dataset's own tokenizer.json (WordPiece for encoders, with the reserved tokens for LMs)."""
    from tokenizers import Tokenizer

    return load_tokenizer(path) if not is_lm_tokenizer(Tokenizer.from_file(str(path))) else load_lm_tokenizer(path)


def _special_ids(tok) -> dict[str, int]:
    return lm_special_ids(tok) if is_lm_tokenizer(tok) else special_ids(tok)


def _encode(tok, lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens back to back, tokens per line) of ``lines``, in batches of ~ENCODE_CHARS characters."""
    parts, lengths = [], []
    start = 0
    while start < len(lines):
        end, size = start, 0
        while end < len(lines) and size < ENCODE_CHARS:
            size += len(lines[end])
            end += 1
        encoded = [e.ids for e in tok.encode_batch_fast(lines[start:end], add_special_tokens=False)]
        n = [len(e) for e in encoded]
        parts.append(np.fromiter(itertools.chain.from_iterable(encoded), np.int32, sum(n)))
        lengths.extend(n)
        start = end
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    return tokens, np.array(lengths, np.int64)


def _write_shard(out, index, docs, tok, ids, cfg, seq_len, layout, dtype) -> dict:
    val = [_is_validation(d, cfg.validation_fraction) for d in docs]
    ordered = [d for d, v in zip(docs, val, strict=True) if not v] + [d for d, v in zip(docs, val, strict=True) if v]
    n_train = len(docs) - sum(val)
    # documents (language models): every line ends in a newline, so decoded text keeps its line breaks
    end = "\n" if layout == "documents" else ""
    tokens, line_lengths = _encode(tok, [line + end for d in ordered for line in d])
    doc_lines = np.array([len(d) for d in ordered], np.int64)
    split_line = int(doc_lines[:n_train].sum())
    split_token = int(line_lengths[:split_line].sum())
    parts = {
        "train": (tokens[:split_token], line_lengths[:split_line], doc_lines[:n_train]),
        "validation": (tokens[split_token:], line_lengths[split_line:], doc_lines[n_train:]),
    }
    name = shard_name(index)
    stats = {
        "index": index,
        "documents": len(docs),
        "tokens": len(tokens),
        "files": {},
        "real_tokens": {},
        "checksums": {},
    }
    for split, (t, ll, dl) in parts.items():
        if layout == "documents":
            line_end = np.concatenate([[0], np.cumsum(ll)])
            offsets = line_end[np.concatenate([[0], np.cumsum(dl)])].astype(np.int64)
            base = f"{split}/{name}"
            stats["checksums"][f"{base}.tokens.npy"] = save_atomic(out / f"{base}.tokens.npy", t.astype(np.int32))
            stats["checksums"][f"{base}.offsets.npy"] = save_atomic(out / f"{base}.offsets.npy", offsets)
            stats["files"][split], stats[split], stats["real_tokens"][split] = f"{split}/{name}", len(dl), len(t)
            continue
        row_tokens, row_lengths = pack(
            t, ll, dl, seq_len - 2, cfg.short_seq_prob, shard_rng(cfg.seed, index, split), cfg.packing, ids["sep"]
        )
        rows = rows_to_array(row_tokens, row_lengths, seq_len, ids["cls"], ids["sep"])
        stats["checksums"][f"{split}/{name}.npy"] = save_atomic(out / split / f"{name}.npy", rows.astype(dtype))
        stats["files"][split], stats[split] = f"{split}/{name}.npy", len(rows)
        stats["real_tokens"][split] = int((rows != ids["pad"]).sum())  # [CLS]/[SEP] included
    return stats


def finalize(
    cfg: DataConfig,
    seq_len: int,
    out_root: Path | None = None,
    *,
    layout: str = "rows",
    chunk_chars: int = CHUNK_CHARS,
    chunk_documents: int = CHUNK_DOCUMENTS,
    poll_s: float = 1.0,
) -> Path:
    """Write metadata.json once every chunk's shard exists (waiting for other hosts' shards, polling every
    ``poll_s`` seconds; after a barrier nothing is waited for). Returns the output dir."""
    store, fingerprint = dataset_store(cfg, seq_len, out_root, layout, chunk_chars, chunk_documents)
    out = store.out
    wait_for(lambda: store.done("shards/count.json"), f"the shard count of {out}", poll_s=poll_s)
    n = json.loads((out / "shards" / "count.json").read_text())["chunks"]
    waiting = [f"shards/{shard_name(i)}.json" for i in range(n)]

    def all_written() -> bool:  # each host's markers, as they arrive (a marker seen once is not asked again)
        waiting[:] = [m for m in waiting if not store.done(m)]
        return not waiting

    # a host still tokenising is not a dead one: the deadline counts from the newest shard
    what = f"the shards of {out} ({n} chunks)"
    wait_for(all_written, what, progress=lambda: len(waiting), poll_s=poll_s)
    shards = [json.loads((out / "shards" / f"{shard_name(i)}.json").read_text()) for i in range(n)]
    for s in shards:  # a shard written before checksums existed (a resumed older run): its files as they are now
        if "checksums" not in s:
            files = [f for split in SPLITS for f in shard_files(s["files"][split], layout)]
            s["checksums"] = {f: file_checksum(out / f) for f in files}
    tok = _load_saved(out / "tokenizer.json")
    ids = _special_ids(tok)
    splits = {}
    for split in SPLITS:
        n = sum(s[split] for s in shards)
        real = sum(s["real_tokens"][split] for s in shards)
        if layout == "rows":
            splits[split] = {"sequences": n, "fill_rate": real / (n * seq_len) if n else None}
        else:
            splits[split] = {"documents": n, "tokens": real}
    if not (splits["train"].get("sequences") or splits["train"].get("tokens")):
        raise DataError(_no_training_text(cfg, sum(s["documents"] for s in shards)))
    meta = {
        "fingerprint": fingerprint,
        "format_version": FORMAT_VERSION,
        "layout": layout,
        "source": cfg.source,
        "corpus": _corpus(cfg).description,
        "documents": sum(s["documents"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),  # text tokens, before packing ([CLS]/[SEP] not counted)
        "max_seq_length": seq_len,
        "vocab_size": tok.get_vocab_size(),
        "special_ids": ids,
        "tokenizer": cfg.tokenizer,
        "packing": cfg.packing,
        "fill_rate": splits["train"].get("fill_rate"),  # of the training rows: what training steps see
        "splits": splits,
        "dtype": str(row_dtype(tok.get_vocab_size())) if layout == "rows" else "int32",
        "shards": [{k: s[k] for k in ("index", "documents", "tokens", "files", "checksums", *SPLITS)} for s in shards],
        "config": asdict(cfg),
    }
    write_json_atomic(out / "metadata.json", meta)
    store.publish("metadata.json")  # last: the dataset is finished from here on
    return out


def read_metadata(path: Path) -> dict:
    meta = Path(path) / "metadata.json"
    if not meta.is_file():
        raise DataError(f"{path}: not a preprocessed dataset (no metadata.json); run `ssmlm preprocess` first")
    return json.loads(meta.read_text())
