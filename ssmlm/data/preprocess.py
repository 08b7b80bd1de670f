"""Text -> tokenizer -> fixed-length, statically masked MLM sequences on disk.

Output directory (reused when the same inputs come again, written atomically):
  train/, validation/     `datasets.save_to_disk` with input_ids (L), masked_lm_positions (P), masked_lm_ids (P)
  tokenizer.json          the tokenizer the ids refer to
  metadata.json           fingerprint, tokenizer ids, lengths and counts
Validation documents are chosen by a hash of their text, so the split is stable across runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from ssmlm.data.masking import mask_batch, pack_document
from ssmlm.data.sources import corpus_fingerprint, load_corpus
from ssmlm.data.tokenizer import load_tokenizer, special_ids, train_wordpiece
from ssmlm.errors import DataError
from ssmlm.progress import progress_bar
from ssmlm.recipe import DataConfig

FORMAT_VERSION = 1


def ssmlm_home() -> Path:
    return Path(os.environ.get("SSMLM_HOME", Path.home() / ".cache" / "ssmlm")).expanduser()


def max_predictions(cfg: DataConfig, seq_len: int) -> int:
    return cfg.max_predictions if cfg.max_predictions is not None else max(1, round(cfg.masked_lm_prob * seq_len))


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

    # --- tokenize and pack, per split
    rng = np.random.default_rng(cfg.seed)
    splits: dict[str, list[list[int]]] = {"train": [], "validation": []}
    n_tokens = 0
    with progress_bar(quiet) as bar:
        task = bar.add_task("tokenizing", total=len(corpus.documents))
        for doc in corpus.documents:
            encoded = [e.ids for e in tok.encode_batch(doc, add_special_tokens=False)]
            n_tokens += sum(map(len, encoded))
            split = "validation" if _is_validation(doc, cfg.validation_fraction) else "train"
            splits[split].extend(pack_document(encoded, seq_len - 2, cfg.short_seq_prob, rng))
            bar.advance(task)
    if not splits["train"]:
        raise DataError(f"data.source '{cfg.source}': no training text left after the validation split")

    # --- mask (duplicate_factor differently-masked copies) and save
    p = max_predictions(cfg, seq_len)
    counts = {}
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=_mkdir(out_root)))
    try:
        import datasets

        datasets.disable_progress_bars()
        parts = {}
        for split, chunks in splits.items():
            base = np.zeros((len(chunks), seq_len), dtype=np.int32)
            for i, c in enumerate(chunks):
                base[i, : len(c) + 2] = [ids["cls"], *c, ids["sep"]]
            dup = cfg.duplicate_factor if split == "train" else 1
            cols: dict[str, list[np.ndarray]] = {}
            for d in range(dup):
                m = mask_batch(
                    base,
                    {ids["pad"], ids["cls"], ids["sep"]},
                    vocab_size,
                    ids["mask"],
                    cfg.masked_lm_prob,
                    p,
                    np.random.default_rng([cfg.seed, d, split == "train"]),
                )
                for k, v in m.items():
                    cols.setdefault(k, []).append(v)
            arrays = {k: np.concatenate(v) for k, v in cols.items()}
            counts[split] = {"sequences": int(len(arrays["input_ids"])), "unique_sequences": len(chunks)}
            if not chunks:  # e.g. a one-document corpus has no held-out documents
                continue
            parts[split] = datasets.Dataset(pa.table({k: _fixed_list(v) for k, v in arrays.items()}))
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
            "max_predictions": p,
            "masked_lm_prob": cfg.masked_lm_prob,
            "duplicate_factor": cfg.duplicate_factor,
            "vocab_size": vocab_size,
            "special_ids": ids,
            "tokenizer": cfg.tokenizer,
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
