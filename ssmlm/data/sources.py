"""Where text comes from: the built-in corpus, local files, or the Hugging Face hub.

Every source yields documents, each a list of non-empty lines, and a fingerprint that changes when
the text would (so preprocessing can be reused safely).
"""

from __future__ import annotations

import ast
import contextlib
import glob
import hashlib
import itertools
import json
import logging
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ssmlm import paths
from ssmlm.data.books import SPLIT_ABOVE, paragraphs, split_book, strip_gutenberg
from ssmlm.errors import DataError, UserError

Document = list[str]
Say = Callable[[str], None]
TXT_FORMAT = 2  # how a .txt file becomes documents (in the fingerprint): 2 = long files split, Gutenberg cut
LOCAL_SUFFIXES = {".txt": "text", ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
CONTENT_SAMPLE = 1 << 20  # data.corpus_key: content hashes a file's first and last MiB (all of a smaller one)


@dataclass
class Corpus:
    documents: list[Document]
    fingerprint: str
    description: str


# ----------------------------------------------------------------------------- built-in corpus


def _prose_lines(text: str) -> Document:
    """Lines of a docstring, without interactive examples (code is not the prose we want)."""
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith((">>>", "...")):
            continue
        lines.append(line)
    return lines


def builtin_corpus() -> Corpus:
    """English prose harvested from this Python's own documentation: the pydoc topics and the
    docstrings of the standard library's modules, classes and functions. Needs no network and is the
    same on every machine with the same Python version. One document per module and per topic."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo"}
    docs: list[Document] = []
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        lines: Document = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    lines.extend(_prose_lines(doc))
        if lines:
            docs.append(lines)
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip pydoc_data
        topics = {}
    for key in sorted(topics):
        lines = _prose_lines(topics[key])
        if lines:
            docs.append(lines)
    if not docs:
        raise DataError(f"built-in corpus: found no documentation under {root}")
    version = ".".join(map(str, sys.version_info[:3]))
    return Corpus(docs, f"builtin-v1-python{version}", f"Python {version} standard-library docs")


# ----------------------------------------------------------------------------- local files


@dataclass(frozen=True)
class BucketFile:
    """One object of a corpus in a bucket, read like a local file (streamed: fsspec reads it in blocks). Its size
    and generation (GCS's version number: any rewrite changes it) identify its text for the cache key."""

    url: str
    size: int
    generation: str

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.url).suffix

    @property
    def stem(self) -> str:
        return PurePosixPath(self.url).stem

    def open(self, mode: str = "r", encoding: str | None = None):
        return paths.open_url(self.url, mode, encoding=encoding)

    def read_text(self, encoding: str = "utf-8") -> str:
        with self.open("r", encoding=encoding) as f:
            return f.read()

    def __str__(self) -> str:
        return self.url


def _suffix_checked(files: list, source: str) -> list:
    bad = [f for f in files if f.suffix not in LOCAL_SUFFIXES]
    if bad:
        raise DataError(f"{bad[0]}: unsupported file type '{bad[0].suffix}'; expected one of {sorted(LOCAL_SUFFIXES)}")
    if not files:
        raise DataError(f"data.source '{source}': matched no .txt/.jsonl/.csv/.parquet files")
    return files


def _expand_bucket(source: str) -> list[BucketFile]:
    """A glob, a folder (every object under it of a known suffix) or one object in a bucket, from one listing."""
    paths.check_url(source, "data.source")
    found = paths.objects(source)
    if not any(ch in source for ch in "*?[") and not found.get(source.rstrip("/")):
        found = {u: i for u, i in found.items() if PurePosixPath(u).suffix in LOCAL_SUFFIXES}  # a folder
    files = [BucketFile(u, int(i["size"]), str(i.get("generation", ""))) for u, i in sorted(found.items())]
    return _suffix_checked(files, source)


def _expand(source: str) -> list:
    """The corpus's files, sorted: local Paths, or BucketFiles for a gs:// source."""
    if paths.is_remote(source):
        return _expand_bucket(source)
    p = Path(source).expanduser()
    if p.is_dir():
        files = [f for f in sorted(p.rglob("*")) if f.suffix in LOCAL_SUFFIXES and f.is_file()]
    elif any(ch in source for ch in "*?["):
        files = [Path(f) for f in sorted(glob.glob(os.path.expanduser(source), recursive=True))]
    elif p.is_file():
        files = [p]
    else:
        raise DataError(
            f"data.source '{source}': no such file or directory (expected 'builtin', 'hub:NAME', "
            f"or a .txt/.jsonl/.csv/.parquet file, directory or glob)"
        )
    return _suffix_checked(files, source)


def check_source(source: str) -> None:
    """That ``data.source`` names something that can exist, without reading it (fast, before any import)."""
    if source == "builtin":
        return
    if source.startswith("hub:"):
        if not source.split(":")[1]:
            raise DataError(f"data.source '{source}': expected hub:NAME[:CONFIG], e.g. hub:wikitext:wikitext-2-raw-v1")
        return
    _expand(source)


def check_inputs(recipe, data: bool = True, tokenizer: bool = True) -> None:
    """Local files the recipe names exist (the rest of data checking needs the data itself). ``data`` /
    ``tokenizer``: whether this command reads the recipe's corpus / tokenizer (finetuning uses the source run's)."""
    if data:
        check_source(recipe.data.source)
        if paths.is_remote(home := os.environ.get("SSMLM_HOME")):  # the preprocessed data's cache in a bucket
            paths.check_url(home, "SSMLM_HOME")
    tok = recipe.data.tokenizer
    if data and tokenizer and tok != "train" and not Path(tok).expanduser().exists():
        raise UserError(f"data.tokenizer '{tok}': no such file (expected 'train', a vocab.txt or tokenizer.json)")
    for key in ("train_file", "validation_file", "test_file", "data_dir"):
        path = getattr(recipe.task, key)
        if path and not Path(path).expanduser().exists():
            raise UserError(f"task.{key} '{path}': no such {'directory' if key == 'data_dir' else 'file'}")


def json_rows(path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of a .jsonl file, or of a .json file holding JSON lines or one list of objects.
    Read here rather than by `datasets`, whose errors name neither the file nor the line."""
    try:
        with path.open("r", encoding="utf-8-sig") as f:
            first = f.read(4096).lstrip()
            f.seek(0)
            if path.suffix == ".json" and first.startswith("["):
                try:
                    items = json.load(f)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
                for i, item in enumerate(items):
                    if not isinstance(item, dict):
                        raise DataError(f"{path}: item {i}: expected a JSON object, got {type(item).__name__}")
                    yield 0, item
                return
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {n}: not valid JSON ({e.msg}, column {e.colno})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}: line {n}: expected a JSON object, got {type(row).__name__}")
                yield n, row
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


@contextlib.contextmanager
def quiet_datasets():
    """Silence `datasets`' log lines and progress bars: a failure is reported once, by us, in one line."""
    import datasets

    datasets.disable_progress_bars()
    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield datasets
    finally:
        log.setLevel(level)


def root_cause(e: BaseException) -> str:
    """The first line of the innermost exception (`datasets` wraps the useful one in a generic one)."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)[:200]


def load_table(path: Path, kind: str, **kwargs):
    """A csv/parquet file through `datasets`; a bad file is a DataError naming it and the underlying reason."""
    with quiet_datasets() as datasets:
        try:
            return datasets.load_dataset(kind, data_files=str(path), split="train", **kwargs)
        except Exception as e:  # datasets raises many types for malformed files
            raise DataError(f"{path}: could not be read as {path.suffix[1:]}: {root_cause(e)}") from None


def _text(value, where: str, field: str) -> Document | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DataError(f"{where}: column '{field}' holds {type(value).__name__}, expected text")
    return [ln.strip() for ln in value.splitlines() if ln.strip()] or None


def _rows_to_documents(texts: Iterable, where: str, field: str) -> Iterator[Document]:
    for t in texts:
        if doc := _text(t, where, field):
            yield doc


def _json_documents(f: Path, field: str) -> Iterator[Document]:
    seen = None
    for n, row in json_rows(f):
        if field in row:
            seen = True
            if doc := _text(row[field], f"{f}: line {n}" if n else str(f), field):
                yield doc
        elif seen is None:
            seen = list(row)
    if seen is not True:
        raise DataError(f"{f}: no field '{field}' (data.text_field); fields: {seen or []}")


@dataclass
class TextNotes:
    """What reading did to .txt files that the user did not write into them, said once per pass that is given a
    ``say``: each of the first few files gets its line as it is read, the rest one line at the end."""

    say: Say | None = None
    split: list[int] = field(default_factory=list)  # documents of each file cut into several
    stripped: int = 0  # files whose Project Gutenberg header/footer were cut away
    SHOWN = 3

    def file_split(self, f: Path, chars: int, docs: int, paras: int) -> None:
        """``f``, of ``chars`` characters in ``paras`` paragraphs, was cut into ``docs`` documents."""
        self.split.append(docs)
        if self.say and len(self.split) <= self.SHOWN:
            at = f"~{paras // docs} paragraphs" if paras > docs else "cut at line ends: the file has no blank lines"
            self.say(f"{f}: one file, split into {docs:,} documents of ~{chars // docs:,} characters ({at})")

    def file_stripped(self, f: Path) -> None:
        self.stripped += 1
        if self.say and self.stripped <= self.SHOWN:
            self.say(f"{f}: Project Gutenberg header and licence removed (data.strip_gutenberg: false keeps them)")

    def end(self) -> None:
        if self.say and len(self.split) > self.SHOWN:
            more = self.split[self.SHOWN :]
            self.say(f"… and {len(more):,} more long files, split into {sum(more):,} documents")
        if self.say and self.stripped > self.SHOWN:
            self.say(f"… and {self.stripped - self.SHOWN:,} more files without their Project Gutenberg boilerplate")


def _txt_documents(f: Path, strip: bool, notes: TextNotes) -> Iterator[Document]:
    """A .txt file: one document, or (over SPLIT_ABOVE characters: a book) documents of a few pages each."""
    try:
        text = f.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{f}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if strip and (body := strip_gutenberg(text)) is not None:
        text = body
        notes.file_stripped(f)
    if len(text) > SPLIT_ABOVE:
        docs = split_book(text)
        if len(docs) > 1:
            notes.file_split(f, len(text), len(docs), len(paragraphs(text)))
        yield from docs
        return
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines:
        yield lines


def _table_documents(f, field: str) -> Iterator[Document]:
    # a bucket's csv/parquet: `datasets` converts a table to a local Arrow file anyway, so the object is fetched first
    local = _fetched(f) if isinstance(f, BucketFile) else f
    ds = load_table(local, LOCAL_SUFFIXES[f.suffix])  # memory-mapped Arrow: read a batch at a time below
    if field not in ds.column_names:
        raise DataError(f"{f}: no column '{field}' (data.text_field); columns: {ds.column_names}")
    for batch in ds.select_columns([field]).iter(batch_size=1024):
        yield from _rows_to_documents(batch[field], str(f), field)


def _fetched(f: BucketFile) -> Path:
    """A local copy of a bucket's table, under the local cache and named by its generation (a rewrite fetches anew)."""
    dest = local_cache() / "sources" / paths.bucket_of(f.url) / f"{f.generation}-{PurePosixPath(f.url).name}"
    if not dest.is_file() or dest.stat().st_size != f.size:
        tmp = dest.with_name(dest.name + f".{os.getpid()}.tmp")
        paths.download(f.url, tmp)
        os.replace(tmp, dest)
    return dest


def local_cache() -> Path:
    """Where bucket data is copied to be read locally (shards are memory-mapped, tables converted): the folder
    SSMLM_LOCAL_CACHE names, by default ~/.cache/ssmlm/bucket. Never a URL: it holds this host's copies."""
    return paths.local(os.environ.get("SSMLM_LOCAL_CACHE") or Path.home() / ".cache/ssmlm/bucket", "SSMLM_LOCAL_CACHE")


def local_documents(
    source: str, text_field: str, strip_gutenberg: bool = True, say: Say | None = None
) -> Iterator[Document]:
    """txt: each file is one document (read whole), a long one (a book) several, without Project Gutenberg's
    boilerplate (``strip_gutenberg``). jsonl/csv/parquet: each row's ``text_field`` is one document, read a row
    or a batch at a time. ``say``: where to say which files were split or stripped."""
    notes = TextNotes(say)
    for f in _expand(source):
        if f.suffix == ".txt":
            yield from _txt_documents(f, strip_gutenberg, notes)
        elif LOCAL_SUFFIXES[f.suffix] == "json":
            yield from _json_documents(f, text_field)
        else:
            yield from _table_documents(f, text_field)
    notes.end()


# ----------------------------------------------------------------------------- hub


def hub_documents(spec: str, text_field: str, split: str) -> Iterator[Document]:
    """``hub:NAME[:CONFIG]``, e.g. hub:wikitext:wikitext-103-raw-v1. Streamed when online (nothing is
    downloaded whole); offline, read from the HF cache if it is there."""
    parts = spec.split(":")
    name, config = parts[1], (parts[2] if len(parts) > 2 else None)
    from ssmlm.data.hub import offline_reason

    offline = offline_reason()  # before datasets is imported: offline, it only looks in its cache (no retries)
    with quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(name, config, split=split, streaming=not offline)
        except Exception as e:
            why = offline or str(e).splitlines()[0]
            raise DataError(
                f"data.source '{spec}': could not load hub dataset '{name}' ({why}); "
                "download it when online or point data.source at local files"
            ) from None
        columns = ds.column_names  # None for a stream whose features are not declared: checked on row 1
        if columns is not None and text_field not in columns:
            raise DataError(f"hub dataset '{name}': no column '{text_field}' (data.text_field); columns: {columns}")
        rows = iter(ds)
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except Exception as e:  # a stream can fail midway (network): one line, naming the dataset
                raise DataError(f"data.source '{spec}': reading the stream failed: {root_cause(e)}") from None
            if text_field not in row:
                raise DataError(
                    f"hub dataset '{name}': no column '{text_field}' (data.text_field); columns: {list(row)}"
                )
            if doc := _text(row[text_field], name, text_field):
                yield doc


# ----------------------------------------------------------------------------- streams


@dataclass
class DocumentStream:
    """The documents of a source, read lazily, with what is known about its size beforehand (for progress)."""

    documents: Iterator[Document]
    fingerprint: str
    description: str
    total_bytes: int | None  # local files: their size on disk (text bytes run a little below it)
    total_documents: int | None


def _nonempty(docs: Iterator[Document], source: str) -> Iterator[Document]:
    n = 0
    for n, doc in enumerate(docs, 1):  # noqa: B007 (n counts)
        yield doc
    if not n:
        raise DataError(f"data.source '{source}': the files hold no text")


def open_corpus(
    source: str,
    text_field: str = "text",
    split: str = "train",
    max_documents: int | None = None,
    *,
    strip_gutenberg: bool = True,
    say: Say | None = None,
    corpus_key: str = "stat",
) -> DocumentStream:
    """The corpus as a stream of documents: nothing is read until it is iterated, and memory stays
    bounded by one document (or one csv/parquet batch) however large the corpus is. ``say``: where this pass
    says what it did to .txt files (split, boilerplate cut); give it to one pass only. ``corpus_key``: how the
    fingerprint knows local files (corpus_fingerprint's ``key``)."""
    total_bytes = total_docs = None
    if source == "builtin":
        builtin = builtin_corpus()  # ~2 MB: generated whole
        docs: Iterator[Document] = iter(builtin.documents)
        description, total_docs = builtin.description, len(builtin.documents)
    elif source.startswith("hub:"):
        docs, description = hub_documents(source, text_field, split), f"hub dataset {source.split(':')[1]}"
    else:
        files = _expand(source)
        docs = _nonempty(local_documents(source, text_field, strip_gutenberg, say), source)
        where = "bucket object(s)" if paths.is_remote(source) else "local file(s)"
        description, total_bytes = f"{len(files)} {where} from {source}", sum(_size(f) for f in files)
    if max_documents:
        docs = itertools.islice(docs, max_documents)
        total_docs = min(total_docs or max_documents, max_documents)
    fingerprint = corpus_fingerprint(
        source, text_field, split, max_documents, strip_gutenberg=strip_gutenberg, key=corpus_key
    )
    return DocumentStream(docs, fingerprint, description, total_bytes, total_docs)


def corpus_fingerprint(
    source: str,
    text_field: str = "text",
    split: str = "train",
    max_documents=None,
    *,
    strip_gutenberg: bool = True,
    key: str = "stat",
) -> str:
    """What identifies the text, computed without reading it (so cached preprocessing is found fast). Objects in a
    bucket: each one's URL, size and generation. Local files: with ``key`` 'stat' each one's path, size and
    modification time; with 'content' each one's name, size and a hash of its first and last MiB (two hosts with
    their own copies of a corpus agree, whatever the copies' times)."""
    if source == "builtin":
        fp = "builtin-v1-python" + ".".join(map(str, sys.version_info[:3]))
    elif source.startswith("hub:"):
        fp = f"{source}-{split}-{text_field}"
    else:
        h = hashlib.sha256(text_field.encode())
        files = _expand(source)
        if any(f.suffix == ".txt" for f in files):  # only then: other local corpora keep their fingerprints
            h.update(f"txt{TXT_FORMAT}:gutenberg={strip_gutenberg}".encode())
        for f in files:
            if isinstance(f, BucketFile):
                h.update(f"{f.url}:{f.size}:{f.generation}".encode())
            elif key == "content":
                h.update(f"{f.name}:{_content_key(f)}".encode())
            else:
                st = f.stat()
                h.update(f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode())
        fp = ("bucket-" if paths.is_remote(source) else "local-") + h.hexdigest()[:16]
    return fp + (f"-max{max_documents}" if max_documents else "")


def _content_key(f: Path) -> str:
    """A file's size and the SHA-256 of its first and last CONTENT_SAMPLE bytes (all of it when smaller): a cheap
    key that two copies of a file share and an edit almost always changes (one inside a large file's middle that
    keeps its size is not seen)."""
    size = f.stat().st_size
    with f.open("rb") as fh:
        h = hashlib.sha256(fh.read(CONTENT_SAMPLE))
        if size > CONTENT_SAMPLE:
            fh.seek(max(CONTENT_SAMPLE, size - CONTENT_SAMPLE))
            h.update(fh.read())
    return f"{size}:{h.hexdigest()}"


def _size(f) -> int:
    return f.size if isinstance(f, BucketFile) else f.stat().st_size


def corpus_name(source: str) -> str:
    """A short name for the corpus in a directory name: a local file's stem, or the name of the directory its
    files share (never the glob that matched them); ``builtin``; a hub dataset's name."""
    if source == "builtin":
        return source
    if source.startswith("hub:"):
        name = Path(source.replace(":", "_")).stem
    elif paths.is_remote(source):
        files = _expand(source)
        keys = [PurePosixPath(f.url.split("://", 1)[1]) for f in files]
        name = files[0].stem if len(files) == 1 else PurePosixPath(os.path.commonpath([k.parent for k in keys])).name
    else:
        files, given = _expand(source), Path(source).expanduser()
        if given.is_dir():
            name = given.resolve().name
        elif len(files) == 1:
            name = files[0].stem
        else:
            name = Path(os.path.commonpath([f.resolve().parent for f in files])).name
    return re.sub(r"[^\w.-]+", "_", name).strip("._") or "corpus"


def load_corpus(
    source: str,
    text_field: str = "text",
    split: str = "train",
    max_documents: int | None = None,
    *,
    strip_gutenberg: bool = True,
    say: Say | None = None,
) -> Corpus:
    """The whole corpus in memory: for small corpora and tests; preprocessing streams (open_corpus)."""
    stream = open_corpus(source, text_field, split, max_documents, strip_gutenberg=strip_gutenberg, say=say)
    return Corpus(list(stream.documents), stream.fingerprint, stream.description)
