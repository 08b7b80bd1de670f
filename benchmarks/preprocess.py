"""Preprocessing at corpus scale: tokens/s against the tokenizer's own rate, and peak memory vs corpus size.

    .venv/bin/python benchmarks/preprocess.py [--sizes 0.5,2] [--dir DIR] [--seq-len 128]

Generates English-like corpora (Zipfian words from a generated vocabulary, in sentences, paragraphs and
documents; jsonl files of ~128 MB) of each size in GB, unless DIR already holds them; trains one WordPiece
on a small sample first (not measured); then measures
  (a) ``encode_batch`` (and ``encode_batch_fast``, what preprocess calls) on a sample of the same text,
      in the batches preprocess uses: the tokenizer's raw tokens/s on this machine;
  (b) ``preprocess`` of each corpus in a fresh subprocess: tokens/s (of the call, imports excluded) and
      the child's peak RSS (``os.wait4``'s rusage: that child's own maximum).
and prints preprocess rate / raw rate (goal >= 0.70) and peak RSS(largest) / RSS(smallest) (goal 1 +- 0.2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FILE_BYTES = 128 << 20


def make_vocab(rng: np.random.Generator, n: int = 40000) -> np.ndarray:
    """Pronounceable made-up words, shortest most frequent (rank order), as in natural languages."""
    cons, vows = list("bcdfghjklmnprstvwz"), list("aeiou")
    words, seen = [], set()
    while len(words) < n:
        syllables = 1 + min(rng.geometric(0.45), 5)
        w = "".join(rng.choice(cons) + rng.choice(vows) + (rng.choice(cons) if rng.random() < 0.3 else "")
                    for _ in range(syllables))  # fmt: skip
        if w not in seen:
            seen.add(w)
            words.append(w)
    return np.array(sorted(words, key=len), dtype=object)


def write_corpus(path: Path, gb: float, seed: int = 0) -> None:
    """~gb GB of jsonl documents: 3-12 paragraphs of 2-8 sentences of 5-25 Zipfian (s=1.1) words."""
    rng = np.random.default_rng(seed)
    vocab = make_vocab(np.random.default_rng(1234))  # the same vocabulary for every corpus
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    p /= p.sum()
    cap = vocab.copy()
    cap[:] = [w.capitalize() for w in vocab]
    path.mkdir(parents=True, exist_ok=True)
    target, written, part = int(gb * 1e9), 0, 0
    f = None
    while written < target:
        if f is None or f.tell() >= FILE_BYTES:
            if f:
                f.close()
            f = (path / f"part-{part:04d}.jsonl").open("w")
            part += 1
        ids = rng.choice(len(vocab), 2_000_000, p=p)
        lengths = rng.integers(5, 26, len(ids) // 5)
        ends = np.cumsum(lengths)
        ends = ends[ends <= len(ids)]
        words = vocab[ids]
        starts = np.concatenate([[0], ends[:-1]])
        words[starts] = cap[ids[starts]]
        sentences = [" ".join(words[a:b]) + "." for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        k = 0
        lines = []
        while k < len(sentences):
            paras = []
            for _ in range(rng.integers(3, 13)):
                n = int(rng.integers(2, 9))
                paras.append(" ".join(sentences[k : k + n]))
                k += n
            lines.append(json.dumps({"text": "\n".join(p for p in paras if p)}) + "\n")
        chunk = "".join(lines)
        f.write(chunk)
        written += len(chunk)
    f.close()


def corpus_dir(root: Path, gb: float) -> Path:
    d = root / f"corpus-{gb:g}GB"
    if not (d / "done").is_file():
        shutil.rmtree(d, ignore_errors=True)
        t = time.perf_counter()
        write_corpus(d, gb, seed=int(gb * 1000))
        (d / "done").write_text("")
        print(f"generated {d} ({du(d) / 1e9:.2f} GB) in {time.perf_counter() - t:.0f} s", flush=True)
    return d


def du(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("*.jsonl"))


def sample_lines(d: Path, chars: int) -> list[str]:
    lines, n = [], 0
    with next(iter(sorted(d.glob("*.jsonl")))).open() as f:
        for row in f:
            for line in json.loads(row)["text"].splitlines():
                lines.append(line)
                n += len(line)
            if n >= chars:
                return lines
    return lines


def raw_rate(tok, lines: list[str], fast: bool) -> float:
    from ssmlm.data.preprocess import ENCODE_CHARS

    encode = tok.encode_batch_fast if fast else tok.encode_batch
    batches, cur, size = [], [], 0
    for line in lines:
        cur.append(line)
        size += len(line)
        if size >= ENCODE_CHARS:
            batches.append(cur)
            cur, size = [], 0
    batches.append(cur)
    encode(batches[0][:1000], add_special_tokens=False)  # warm-up
    t, n = time.perf_counter(), 0
    for b in batches:
        n += sum(len(e.ids) for e in encode(b, add_special_tokens=False))
    return n / (time.perf_counter() - t)


CHILD = """
import json, sys, time, resource
from pathlib import Path
from ssmlm.data.preprocess import preprocess, read_metadata
from ssmlm.recipe import DataConfig
cfg = DataConfig(source=sys.argv[1], tokenizer=sys.argv[2], validation_fraction=0.01)
t = time.perf_counter()
out = preprocess(cfg, int(sys.argv[3]), out_root=Path(sys.argv[4]), quiet=True)
seconds = time.perf_counter() - t
meta = read_metadata(out)
print(json.dumps({"seconds": seconds, "tokens": meta["tokens"], "shards": len(meta["shards"]),
                  "rows": meta["splits"]["train"]["sequences"], "fill_rate": meta["fill_rate"]}))
"""


def run_preprocess(corpus: Path, tokenizer: Path, seq_len: int, work: Path) -> dict:
    out_root = Path(tempfile.mkdtemp(prefix="out-", dir=work))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TOKENIZERS_PARALLELISM", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(corpus), str(tokenizer), str(seq_len), str(out_root)],
        stdout=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    shutil.rmtree(out_root, ignore_errors=True)
    if proc.returncode:
        raise SystemExit(f"preprocess of {corpus} failed (exit {proc.returncode})")
    res = json.loads(stdout.strip().splitlines()[-1])
    res["peak_rss_mb"] = usage.ru_maxrss / 1024  # kB on Linux
    res["tokens_per_s"] = res["tokens"] / res["seconds"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="0.5,2", help="corpus sizes in GB, comma-separated (default 0.5,2)")
    ap.add_argument("--dir", default=None, help="where to keep the generated corpora (default: a temp dir)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--sample-mb", type=float, default=16, help="text for the raw encode_batch rate")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    sizes = sorted(float(s) for s in args.sizes.split(","))
    work = Path(args.dir or tempfile.mkdtemp(prefix="ssmlm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpora = {gb: corpus_dir(work, gb) for gb in sizes}

    from ssmlm.data.tokenizer import train_wordpiece

    tok_path = work / "tokenizer.json"
    if not tok_path.is_file():  # fixed, trained once on a small sample: not part of what is measured
        train_wordpiece(sample_lines(corpora[sizes[0]], 8 << 20), 30522).save(str(tok_path))
    from ssmlm.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_path)
    lines = sample_lines(corpora[sizes[0]], int(args.sample_mb * (1 << 20)))
    print(f"machine: {os.cpu_count()} CPUs; seq_len {args.seq_len}; tokenizer vocab {tok.get_vocab_size()}")
    results = {}
    for gb, d in corpora.items():
        # the raw rate is taken right before each run: on a shared machine the load changes over minutes
        raw, raw_fast = raw_rate(tok, lines, fast=False), raw_rate(tok, lines, fast=True)
        load = os.getloadavg()[0]
        r = results[gb] = run_preprocess(d, tok_path, args.seq_len, work)
        r.update(raw=raw, raw_fast=raw_fast)
        print(
            f"{gb:g} GB: raw encode_batch {raw:,.0f} tokens/s, encode_batch_fast {raw_fast:,.0f} "
            f"({args.sample_mb:g} MB sample, load avg {load:.1f} before, {os.getloadavg()[0]:.1f} after)\n"
            f"  preprocess ({du(d) / 1e9:.2f} GB, {r['tokens'] / 1e6:.0f}M tokens, {r['shards']} shards, "
            f"fill {r['fill_rate']:.3f}): {r['seconds']:.0f} s, {r['tokens_per_s']:,.0f} tokens/s, "
            f"peak RSS {r['peak_rss_mb']:.0f} MB; rate / encode_batch {r['tokens_per_s'] / raw:.2f}, "
            f"/ encode_batch_fast {r['tokens_per_s'] / raw_fast:.2f}",
            flush=True,
        )
    big, small = results[sizes[-1]], results[sizes[0]]
    print(f"rate ratio ({sizes[-1]:g} GB) vs encode_batch      {big['tokens_per_s'] / big['raw']:.2f}  (goal >= 0.70)")
    print(f"rate ratio ({sizes[-1]:g} GB) vs encode_batch_fast {big['tokens_per_s'] / big['raw_fast']:.2f}")
    rss = big["peak_rss_mb"] / small["peak_rss_mb"]
    print(f"peak RSS {sizes[-1]:g} GB / {sizes[0]:g} GB: {rss:.2f}  (goal 0.8-1.2)")


if __name__ == "__main__":
    main()
