"""Birdie objective throughput: samples/s per objective on one core at L = 2048, on real text.

    PYTHONPATH=. .venv/bin/python benchmarks/objectives.py [--samples 100000] [--length 2048] [--rows 200]

The built-in corpus (Python's own documentation, ``ssmlm.data.sources.builtin_corpus``) is tokenised once
with a word-level id mapping (words and punctuation, ids by first appearance; not timed) and concatenated
into one token stream. Each objective then makes N samples (``functions.sample`` with the paradigm token),
each from a random offset of the stream with the whole row (L slots) as its space; we count errors
(exceptions, oversize samples), Nones (no valid sample) and stalls (a single sample slower than 1 s);
slots/s = filled row slots (prefix + target) per second.
Finally whole rows of the "birdie" mixture (``pipeline.make_row``, real documents, length-weighted) are
timed. The official pipeline's figure to beat is 60-125 samples/s.
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np

from ssmlm.data.sources import builtin_corpus
from ssmlm.objectives.birdie import functions as F
from ssmlm.objectives.birdie.mixtures import mixture
from ssmlm.objectives.birdie.pipeline import make_row

OFFICIAL = (60.0, 125.0)
CASES = [
    ("next_token", "next_token", {}),
    ("prefix_lm", "prefix_lm", {}),
    ("infilling", "infilling", {"rate": 0.15, "mean": 3.0}),
    ("infilling", "infilling", {"rate": 0.5, "mean": 32.0}),
    ("autoencoding", "autoencoding", {"rate": 0.15, "mean": 3.0}),
    ("autoencoding", "autoencoding", {"rate": 0.5, "mean": 8.0, "shuffle": True}),
    ("deshuffling", "deshuffling", {"p": 1.0}),
    ("deshuffling", "deshuffling", {"p": 0.5}),
    ("copying", "copying", {}),
    ("selective_copying", "selective_copying", {"k": 4, "form": "query_context"}),
]


def tokenise():
    vocab: dict[str, int] = {}
    docs = []
    for doc in builtin_corpus().documents:
        words = re.findall(r"\w+|[^\w\s]", " ".join(doc))
        docs.append(np.array([vocab.setdefault(w, 1 + len(vocab)) for w in words], np.int32))
    return docs, len(vocab) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=10**5)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    docs, vocab = tokenise()
    stream = np.concatenate(docs)
    ids = F.Ids.for_tests(vocab)
    L = args.length
    print(f"corpus: {len(docs)} documents, {len(stream):,} tokens, word vocabulary {vocab:,}; L = {L}, "
          f"{args.samples:,} samples per objective, 1 core\n")  # fmt: skip
    header = f"{'objective':<18} {'params':<34} {'samples/s':>10} {'slots/s':>11} {'fill':>5} {'none':>6} " \
             f"{'err':>4} {'stall':>5} {'x60':>6} {'x125':>6}"  # fmt: skip
    print(header)
    print("-" * len(header))
    rng = np.random.default_rng(args.seed)
    for cls, kind, params in CASES:
        starts = rng.integers(0, len(stream) - 2 * L, args.samples)
        none = err = stall = slots = 0
        t0 = time.perf_counter()
        for a in starts:
            t = time.perf_counter()
            try:
                s = F.sample(kind, cls, stream[a : a + 2 * L], L, rng, ids, "start", **params)
                if s is None:
                    none += 1
                elif s.size > L or len(s.target) == 0:
                    err += 1
                else:
                    slots += s.size
            except Exception:  # noqa: BLE001 (counted, not fatal)
                err += 1
            stall += time.perf_counter() - t > 1.0
        dt = time.perf_counter() - t0
        rate = args.samples / dt
        label = ",".join(f"{k}={v}" for k, v in params.items())
        print(f"{kind:<18} {label:<34} {rate:>10,.0f} {slots / dt:>11,.0f} {slots / args.samples / L:>5.2f} "
              f"{none:>6} {err:>4} {stall:>5} {rate / OFFICIAL[0]:>6.0f} {rate / OFFICIAL[1]:>6.0f}")  # fmt: skip

    configs, probs = mixture("birdie")
    t0 = time.perf_counter()
    filled = samples = 0
    for key in range(args.rows):
        row = make_row(docs, configs, probs, L, key, ids)
        filled += int((row["segment_ids"] > 0).sum())
        samples += len(row["sample_configs"])
    dt = time.perf_counter() - t0
    print(
        f"\nmake_row, 'birdie' mixture on real documents: {args.rows / dt:,.1f} rows/s, "
        f"{samples / dt:,.0f} samples/s ({samples / args.rows:.1f} samples/row), "
        f"{filled / dt:,.0f} filled slots/s, fill {filled / args.rows / L:.3f}; "
        f"x{samples / dt / OFFICIAL[0]:.0f} / x{samples / dt / OFFICIAL[1]:.0f} the official 60 / 125 samples/s"
    )


if __name__ == "__main__":
    main()
