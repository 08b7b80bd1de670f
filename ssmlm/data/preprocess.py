"""Text -> tokenizer -> fixed-length, statically masked MLM sequences on disk.

Output directory (reused when the same inputs come again, written atomically):
  train/, validation/     `datasets.save_to_disk` with input_ids (L), masked_lm_positions (P), masked_lm_ids (P)
  tokenizer.json          the tokenizer the ids refer to
  metadata.json           fingerprint, tokenizer ids, lengths, counts and fill rates (real tokens / positions)
Validation documents are chosen by a hash of their text, so the split is stable across runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from ssmlm.data.masking import pack, rows_to_array
from ssmlm.data.sources import corpus_fingerprint, load_corpus
from ssmlm.data.tokenizer import load_tokenizer, special_ids, train_wordpiece
from ssmlm.errors import DataError
from ssmlm.progress import progress_bar
from ssmlm.recipe import DataConfig

FORMAT_VERSION = 2  # 2: packing modes (rows filled across lines), fill_rate
SPLITS = ("train", "validation")


def ssmlm_home() -> Path:
    return Path(os.environ.get("SSMLM_HOME", Path.home() / ".cache" / "ssmlm")).expanduser()


def _file_hash(path: str) -> str:
    p = Path(path).expanduser()
    if p.is_dir():
        p = next((p / n for n in ("tokenizer.json", "vocab.txt") if (p / n).is_file()), p)
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.is_file() else "missing"


def _is_validation(doc: list[str], fraction: float) -> bool:
    digest = hashlib.sha1("\n".join(doc).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < fraction


def preprocess(cfg: DataConfig, seq_len: int, out_root: Path | None = None, quiet: bool = False) -> Path:
    """Run (or reuse) preprocessing for ``cfg`` at sequence length ``seq_len``; returns the output dir."""
    if seq_len < 8:
        raise DataError(f"data.max_seq_length = {seq_len}: expected at least 8")
    out_root = Path(out_root or ssmlm_home() / "data")
    tok_id = "train" if cfg.tokenizer == "train" else _file_hash(cfg.tokenizer)
    key = json.dumps(
        {
            "v": FORMAT_VERSION,
            "cfg": asdict(cfg),
            "len": seq_len,
            "corpus": corpus_fingerprint(cfg.source, cfg.text_field, cfg.split, cfg.max_documents),
            "tok": tok_id,
        },
        sort_keys=True,
    )
    fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
    tag = cfg.source if cfg.source == "builtin" else Path(cfg.source.replace(":", "_")).stem or "corpus"
    out = out_root / f"{tag}-L{seq_len}-{fingerprint}"
    meta_path = out / "metadata.json"
    if meta_path.is_file() and json.loads(meta_path.read_text()).get("fingerprint") == fingerprint:
        return out
    corpus = load_corpus(cfg.source, cfg.text_field, cfg.split, cfg.max_documents)

    # --- tokenizer
    if cfg.tokenizer == "train":
        tok = train_wordpiece((line for doc in corpus.documents for line in doc), cfg.vocab_size, cfg.lowercase)
    else:
        tok = load_tokenizer(cfg.tokenizer, cfg.lowercase)
    ids = special_ids(tok)
    vocab_size = tok.get_vocab_size()
    if ids["pad"] != 0:
        raise DataError(f"tokenizer '{cfg.tokenizer}': [PAD] must have id 0 (has {ids['pad']})")

    # --- tokenize, per split, into flat arrays (token lists per line would cost ~10x the memory)
    flat: dict[str, dict[str, list]] = {s: {"tokens": [], "line_lengths": [], "doc_lines": []} for s in SPLITS}
    n_tokens = 0
    with progress_bar(quiet) as bar:
        task = bar.add_task("tokenizing", total=len(corpus.documents))
        for doc in corpus.documents:
            encoded = [e.ids for e in tok.encode_batch(doc, add_special_tokens=False)]
            lengths = [len(e) for e in encoded]
            n_tokens += sum(lengths)
            f = flat["validation" if _is_validation(doc, cfg.validation_fraction) else "train"]
            f["tokens"].append(np.fromiter(itertools.chain.from_iterable(encoded), np.int32, sum(lengths)))
            f["line_lengths"].extend(lengths)
            f["doc_lines"].append(len(lengths))
            bar.advance(task)

    # --- pack into [CLS] ... [SEP] rows
    rng = np.random.default_rng(cfg.seed)
    splits = {split: _pack_split(flat.pop(split), cfg, seq_len, ids, rng) for split in SPLITS}
    if not len(splits["train"]):
        raise DataError(f"data.source '{cfg.source}': no training text left after the validation split")

    # --- save the unmasked rows (masking is the objective's, on the fly)
    counts = {}
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=_mkdir(out_root)))
    try:
        import datasets

        datasets.disable_progress_bars()
        parts = {}
        for split, base in splits.items():
            counts[split] = {
                "sequences": int(len(base)),
                "fill_rate": float((base != ids["pad"]).mean()) if len(base) else None,
            }
            if not len(base):  # e.g. a one-document corpus has no held-out documents
                continue
            parts[split] = datasets.Dataset(pa.table({"tokens": _fixed_list(base)}))
        datasets.DatasetDict(parts).save_to_disk(str(tmp))
        tok.save(str(tmp / "tokenizer.json"))
        meta = {
            "fingerprint": fingerprint,
            "format_version": FORMAT_VERSION,
            "source": cfg.source,
            "corpus": corpus.description,
            "documents": len(corpus.documents),
            "tokens": n_tokens,
            "max_seq_length": seq_len,
            "vocab_size": vocab_size,
            "special_ids": ids,
            "tokenizer": cfg.tokenizer,
            "packing": cfg.packing,
            "fill_rate": counts["train"]["fill_rate"],  # of the training rows: what training steps see
            "splits": counts,
            "config": asdict(cfg),
        }
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2))
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _pack_split(f: dict[str, list], cfg: DataConfig, seq_len: int, ids: dict[str, int], rng) -> np.ndarray:
    tokens = np.concatenate(f["tokens"]) if f["tokens"] else np.zeros(0, np.int32)
    row_tokens, row_lengths = pack(
        tokens, f["line_lengths"], f["doc_lines"], seq_len - 2, cfg.short_seq_prob, rng, cfg.packing, ids["sep"]
    )
    return rows_to_array(row_tokens, row_lengths, seq_len, ids["cls"], ids["sep"])


def _fixed_list(a: np.ndarray):
    """A (n, w) array as an Arrow fixed-size-list column, without going through Python lists."""
    return pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), a.shape[1])


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def read_metadata(path: Path) -> dict:
    meta = Path(path) / "metadata.json"
    if not meta.is_file():
        raise DataError(f"{path}: not a preprocessed dataset (no metadata.json); run `ssmlm preprocess` first")
    return json.loads(meta.read_text())
