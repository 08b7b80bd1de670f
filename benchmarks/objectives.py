"""Birdie objectives side by side with the official pipeline's objective functions: samples/s and tokens/s.

    /tmp/peervenv/bin/python benchmarks/objectives.py         # where birdie_rl (0.2.0) is importable: paired
    ... objectives.py --birdie-repo DIR                       # or from a checkout of github samblouir/birdie
    PYTHONPATH=. .venv/bin/python benchmarks/objectives.py    # without it: ssmlm's own rates, and a line saying so

Text: the built-in corpus (Python's own documentation, ``ssmlm.data.sources.builtin_corpus``), tokenised with a
byte-level BPE trained on it (``ssmlm.data.tokenizer.train_byte_bpe``, ssmlm's LM tokenizer; not timed) into one
token stream. The official side gets the same vocabulary as a tiktoken ``Encoding`` (the official examples use
tiktoken; built from the BPE's ranks and checked to give the same ids): its encode/decode are what birdie_rl
calls inside its objectives (paradigm strings, placeholders, leftovers).

A step is N samples (``--samples``, 50) from N fixed random offsets of the stream, each source 2·L tokens and the
whole row (L slots) as its space; the faster side repeats its N sources until its step takes >= ``--step-ms`` (the
ratio is per sample: ``paired.compare(units=…)``). Both sides' steps are interleaved (``benchmarks/paired.py``, two
passes) on the same sources:
  ssmlm     ``functions.sample(kind, kind, ids[a : a + 2L], L, rng, ids, "start", **params)``: numpy int32 ids in,
            a Sample out, its paradigm token included.
  official  the objective built once per row as the worker builds it, ``birdie_rl.load_objective(name,
            overrides)`` (same corruption rate / mean span / shuffle fraction, space L, other fields their
            defaults; see CASES), then per sample ``obj.config.rng_seed = <fresh seed>; obj(source)``. With
            ``--official-input ids`` (default) the source is the same 2·L ids as a Python list, which the
            objective's ``tokenizer.encode(source)`` returns unchanged: neither side tokenises the source (the
            official still encodes its own strings and decodes the leftover text its API returns). With
            ``--official-input text`` the source is the decoded text, as the official pipeline feeds it: its step
            then includes tokenising that text, twice (``run_checks`` measures the length by encoding it).
Tokens per sample, counted the same way on both sides: the produced input (prefix, paradigm included) plus the
target; the START token the packer adds between them is not counted on either side. "no sample": attempts that
gave none (ssmlm None; official status other than "ok"), included in samples/s on both sides.

Official-pipeline bugs that change what its side does (docs/faithfulness.md#birdie-official-bugs):
next-token prediction at HEAD is a copy task (input = paradigm + ⌊(L − |p|)/2⌋ tokens, label = the same tokens);
autoencoding-with-deshuffling never shuffles; deshuffling shuffles characters and re-encodes them, which takes ~3×
the tokens, so every sample is rejected as too large (status "error": its row times failed attempts, and the
worker would hard-fail); ``__call__`` re-seeds its rng from ``config.rng_seed`` on every call, so the worker puts a
fresh seed in the overrides, which makes its objective cache miss and rebuilds the objective for every sample
(here it is built once and only the seed is set: cheaper than the worker). Differences by design: v2 infilling
stops after ``max_mask_spans`` = 20 spans (its samples are short: compare tokens/s) and its placeholders are
multi-token strings; selective copying makes as many spans as fit (ssmlm: k = 4). "x tokens/s" is the samples/s
ratio (median of the two passes) times the ratio of tokens per sample.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paired import compare, machine_line, ratio_cell  # noqa: E402

from ssmlm.data import reserved as R  # noqa: E402
from ssmlm.data.sources import builtin_corpus  # noqa: E402
from ssmlm.data.tokenizer import train_byte_bpe  # noqa: E402
from ssmlm.objectives.birdie import functions as F  # noqa: E402
from ssmlm.objectives.birdie.mixtures import mixture  # noqa: E402
from ssmlm.objectives.birdie.pipeline import make_row  # noqa: E402

# (ssmlm kind, ssmlm params, official objective name, official config overrides, anchor)
CASES = [
    ("next_token", {}, "next_token_prediction", {}, False),
    ("prefix_lm", {}, "prefix_language_modeling", {"prefix_fraction": 0.75}, False),
    ("infilling", {"rate": 0.15, "mean": 3.0}, "infilling", {"corruption_rate": 0.15, "mean_tokens_per_span": 3.0},
     True),
    ("infilling", {"rate": 0.5, "mean": 32.0}, "infilling", {"corruption_rate": 0.5, "mean_tokens_per_span": 32.0},
     True),
    ("autoencoding", {"rate": 0.15, "mean": 3.0}, "autoencoding", {"corruption_rate": 0.15, "tokens_per_mask": 3},
     True),
    ("autoencoding", {"rate": 0.5, "mean": 8.0, "shuffle": True}, "autoencoding_with_deshuffling",
     {"corruption_rate": 0.5, "tokens_per_mask": 8}, True),
    ("deshuffling", {"p": 1.0}, "deshuffling", {"percentage_to_shuffle": 1.0}, True),
    ("deshuffling", {"p": 0.5}, "deshuffling", {"percentage_to_shuffle": 0.5}, True),
    ("copying", {}, "copying", {}, False),
    ("selective_copying", {"k": 4, "form": "query_context"}, "selective_copying",
     {"tokens_per_mask": 12, "min_delimiter_prefix_length": 1, "max_delimiter_prefix_length": 8,
      "min_delimiter_suffix_length": 1, "max_delimiter_suffix_length": 4, "format_style": "query_context"}, True),
]  # fmt: skip


def corpus_tokens(vocab_size: int):
    texts = ["\n".join(doc) for doc in builtin_corpus().documents]
    tok = train_byte_bpe(texts, vocab_size)
    docs = [np.array(e.ids, np.int32) for e in tok.encode_batch(texts, add_special_tokens=False)]
    return tok, docs


def _bytes_of_byte_level():
    """GPT-2's byte-level alphabet (the character that stands for each byte in a byte-level BPE's vocabulary)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, extra = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def official_tokenizer(tok, sample_text: str):
    """The official side's tokenizer: a tiktoken Encoding with the BPE's ranks (same ids, tiktoken's speed), or
    the `tokenizers` one if tiktoken is missing or disagrees. encode(list) returns the list (ids input)."""
    enc, how = None, "tokenizers (tiktoken unavailable)"
    try:
        import tiktoken

        u2b = _bytes_of_byte_level()
        vocab = tok.get_vocab()
        special = {t: i for t, i in vocab.items() if t.startswith("<|")}
        ranks = {bytes(u2b[ch] for ch in t): i for t, i in vocab.items() if t not in special}
        pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
        enc = tiktoken.Encoding("ssmlm_builtin_bpe", pat_str=pat, mergeable_ranks=ranks, special_tokens=special)
        if enc.encode_ordinary(sample_text) != tok.encode(sample_text, add_special_tokens=False).ids:
            enc, how = None, "tokenizers (the tiktoken copy disagreed)"
        else:
            how = "tiktoken (the same BPE ranks)"
    except ImportError:
        pass

    class Tokenizer:
        def encode(self, x):
            if not isinstance(x, str):
                return x
            return enc.encode_ordinary(x) if enc is not None else tok.encode(x, add_special_tokens=False).ids

        def decode(self, ids):
            ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
            return enc.decode(ids) if enc is not None else tok.decode(ids, skip_special_tokens=False)

    return Tokenizer(), how


DEFAULT_BIRDIE_REPO = "/tmp/peers/birdie"


def load_official(repo: str | None):
    """(birdie_rl.load_objective, version) from the installed package or, failing that, a checkout of the official
    repository (github samblouir/birdie); (None, why) when neither imports."""
    try:
        from birdie_rl.load_objective import load_objective
    except Exception as e:  # noqa: BLE001 (any import failure means: no installed peer)
        repo = repo or (DEFAULT_BIRDIE_REPO if os.path.isdir(DEFAULT_BIRDIE_REPO) else None)
        if repo is None:
            return None, f"{type(e).__name__}: {e}; no --birdie-repo given and {DEFAULT_BIRDIE_REPO} does not exist"
        # The package's __init__ imports its reward model (torch, accelerate), which the objective functions never
        # use: register the package without running that __init__, so only the objectives are imported.
        import types

        for name in [m for m in sys.modules if m == "birdie_rl" or m.startswith("birdie_rl.")]:
            del sys.modules[name]
        pkg = types.ModuleType("birdie_rl")
        pkg.__path__ = [os.path.join(repo, "birdie_rl")]
        sys.modules["birdie_rl"] = pkg
        try:
            from birdie_rl.load_objective import load_objective
        except Exception as e2:  # noqa: BLE001
            return None, f"{type(e2).__name__}: {e2} (from {repo})"
        return load_objective, f"{_repo_version(repo)} from {repo} (objectives only)"
    import birdie_rl

    return load_objective, getattr(birdie_rl, "__version__", None) or _dist_version("birdie_rl")


def _repo_version(repo: str) -> str:
    import subprocess

    version = re.search(r'^version = "([^"]+)"', open(os.path.join(repo, "pyproject.toml")).read(), re.M)
    head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return f"{version.group(1) if version else '?'} (git {head.stdout.strip() or '?'})"


def _dist_version(name):
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "?"


class Counter:
    def __init__(self):
        self.samples = self.tokens = self.fails = 0

    def per_sample(self):
        return self.tokens / max(1, self.samples - self.fails)


def ssmlm_step(kind, params, srcs, L, rng, ids, reps, count):
    def step():
        tok = fails = 0
        for _ in range(reps):
            for src in srcs:
                s = F.sample(kind, kind, src, L, rng, ids, "start", **params)
                if s is None:
                    fails += 1
                else:
                    tok += s.size
        count.samples += reps * len(srcs)
        count.tokens += tok
        count.fails += fails

    return step


def official_step(obj, inputs, reps, seeds, count):
    def step():
        tok = fails = 0
        for _ in range(reps):
            for x in inputs:
                obj.config.rng_seed = next(seeds)
                r = obj(x)
                if r.get("status") == "ok":
                    tok += len(r["input_ids"]) + len(r["label_ids"])
                else:
                    fails += 1
        count.samples += reps * len(inputs)
        count.tokens += tok
        count.fails += fails

    return step


def reps_for(step_once, target_s):
    t0 = time.perf_counter()
    step_once()
    dt = time.perf_counter() - t0
    return max(1, math.ceil(target_s / max(dt, 1e-6)))


def label(kind, params):
    bits = []
    if "rate" in params:
        bits.append(f"c = {params['rate']:g}, μ = {params['mean']:g}")
    if "p" in params:
        bits.append(f"p = {params['p']:g}")
    if "k" in params:
        bits.append(f"k = {params['k']}")
    name = kind.replace("_", " ") + (" + deshuffling" if params.get("shuffle") else "")
    return name + (f" ({'; '.join(bits)})" if bits else "")


def pct(c: Counter) -> str:
    return f"{100 * c.fails / max(1, c.samples):.0f} %"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2048, help="L: the row's slots, each sample's space (2048)")
    ap.add_argument("--samples", type=int, default=50, help="N: sources (fixed random offsets) per step (50)")
    ap.add_argument("--step-ms", type=float, default=50.0, help="a side repeats its N sources to reach this (50)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds per pass (2 passes)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--official-input", choices=["ids", "text"], default="ids",
                    help="what the official objective gets: the same ids (default) or their decoded text")  # fmt: skip
    ap.add_argument("--only", default="", help="comma-separated ssmlm kinds to run (default: all)")
    ap.add_argument("--vocab", type=int, default=32000, help="BPE vocabulary to train on the corpus (32000)")
    ap.add_argument("--rows", type=int, default=200, help="make_row rows of the 'birdie' mixture to time (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--birdie-repo", default=None, help=f"official Birdie checkout (default {DEFAULT_BIRDIE_REPO})")
    args = ap.parse_args()

    load_start = os.getloadavg()
    L, N = args.length, args.samples
    tok, docs = corpus_tokens(args.vocab)
    stream = np.concatenate(docs)
    ids = F.Ids.from_reserved(R.reserved_ids(tok.token_to_id))
    rng = np.random.default_rng(args.seed)
    starts = rng.integers(0, len(stream) - 2 * L, N)
    srcs = [stream[a : a + 2 * L] for a in starts]
    load_objective, peer = load_official(args.birdie_repo)
    cases = [c for c in CASES if not args.only or c[0] in args.only.split(",")]

    print(f"corpus: {len(docs)} documents, {len(stream):,} tokens (byte-level BPE, vocabulary "
          f"{tok.get_vocab_size():,}); L = {L}; a step = {N} sources of 2·L tokens from fixed random offsets, "
          f"repeated to >= {args.step_ms:.0f} ms; {args.rounds} rounds x 2 passes, interleaved\n")  # fmt: skip

    if load_objective is None:
        print(f"official pipeline (birdie_rl) not importable ({peer}): ssmlm's own rates only, no side-by-side\n")
        print("| objective | samples/s | tokens/sample | tokens/s | no sample |")
        print("|---|---:|---:|---:|---:|")
        for kind, params, *_ in cases:
            count = Counter()
            reps = reps_for(ssmlm_step(kind, params, srcs, L, rng, ids, 1, Counter()), args.step_ms / 1e3)
            step = ssmlm_step(kind, params, srcs, L, rng, ids, reps, count)
            for _ in range(args.warmup):
                step()
            times = []
            for _ in range(2 * args.rounds):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            rate = reps * N / statistics.median(times)
            print(f"| {label(kind, params)} | {rate:,.0f} | {count.per_sample():,.0f} | "
                  f"{rate * count.per_sample():,.0f} | {pct(count)} |")  # fmt: skip
    else:
        otok, how = official_tokenizer(tok, tok.decode(srcs[0].tolist()))
        if args.official_input == "ids":
            inputs = [s.tolist() for s in srcs]
            what = "the same ids (a list; its encode passes it through)"
        else:
            inputs = [otok.decode(s) for s in srcs]
            what = "the decoded text of the same ids (tokenised inside the objective)"
        print(f"official: birdie_rl {peer}, objectives from birdie_rl.load_objective; tokenizer {how}; "
              f"input {what}\n")  # fmt: skip
        seeds = iter(range(1, 1 << 62))
        head = ("| objective (ssmlm) | official objective | ssmlm samples/s | official samples/s | "
                "x samples/s, pass 1 · pass 2 (range) | tokens/sample ssmlm / official | ssmlm tokens/s | "
                "official tokens/s | x tokens/s | no sample: ssmlm / official |")  # fmt: skip
        print(head)
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        below = []
        for kind, params, oname, over, anchor in cases:
            obj = load_objective(oname, {**over, "remaining_space": L, "tokenizer": otok})
            cs, co = Counter(), Counter()
            rs = reps_for(ssmlm_step(kind, params, srcs, L, rng, ids, 1, Counter()), args.step_ms / 1e3)
            ro = reps_for(official_step(obj, inputs, 1, seeds, Counter()), args.step_ms / 1e3)
            steps = {
                "ssmlm": ssmlm_step(kind, params, srcs, L, rng, ids, rs, cs),
                "official": official_step(obj, inputs, ro, seeds, co),
            }
            res = compare(steps, reference="official", rounds=args.rounds, warmup=args.warmup,
                          units={"ssmlm": rs * N, "official": ro * N})  # fmt: skip
            rate = {n: u * N / statistics.median([t for p in res[n]["times"] for t in p])
                    for n, u in (("ssmlm", rs), ("official", ro))}  # fmt: skip
            x = statistics.median(res["ssmlm"]["ratio"])
            tps = (cs.per_sample(), co.per_sample())
            xt = f"{x * tps[0] / tps[1]:,.1f}" if tps[1] else "—"
            print(f"| {label(kind, params)} | {oname} | {rate['ssmlm']:,.0f} | {rate['official']:,.0f} | "
                  f"{ratio_cell(res['ssmlm'])} | {tps[0]:,.0f} / {tps[1]:,.0f} | "
                  f"{rate['ssmlm'] * tps[0]:,.0f} | {rate['official'] * tps[1]:,.0f} | {xt} | "
                  f"{pct(cs)} / {pct(co)} |")  # fmt: skip
            if anchor and min(res["ssmlm"]["ratio"]) < 8:
                below.append(label(kind, params))
        if below:
            print(f"\nunder 8x the official in samples/s (median of a pass): {', '.join(below)}")

    if args.rows:
        configs, probs = mixture("birdie")
        t0 = time.perf_counter()
        filled = samples = 0
        for key in range(args.rows):
            row = make_row(docs, configs, probs, L, key, ids)
            filled += int((row["segment_ids"] > 0).sum())
            samples += len(row["sample_configs"])
        dt = time.perf_counter() - t0
        print(f"\nssmlm make_row, 'birdie' mixture on the corpus's documents: {args.rows / dt:,.0f} rows/s, "
              f"{samples / dt:,.0f} samples/s ({samples / args.rows:.1f} samples/row), fill "
              f"{filled / args.rows / L:.3f}")  # fmt: skip
    print(f"\nload at start {' / '.join(f'{v:.1f}' for v in load_start)}; {machine_line()}")


if __name__ == "__main__":
    main()
