"""Birdie's pre-training objectives as pure functions (birdie_official.md §1; v1/paper semantics).

Every objective is ``f(src, space, rng, ids, **params) -> Sample | None``:
  src    int32 tokens of one document from some offset (what is left of it)
  space  slots left in the packed row; a sample occupies len(prefix) + len(target) slots (the packer puts
         START between them and drops the target's last token from the inputs: [prefix…, START, y_1…y_{M−1}])
  rng    a numpy Generator (the only source of randomness)
  ids    the reserved token ids (``Ids``)
and returns ``Sample(prefix, target, used)`` with len(prefix) + len(target) <= space, ``used`` = source
tokens consumed (src[used:] is the leftover the pipeline feeds to the next sample), or None when nothing
valid fits. Objectives never add the paradigm token; ``sample`` does (one slot reserved for it).

Length buckets: ``max_len`` truncates the source; ``min_len`` (infilling/autoencoding: m* = ⌊μ/(2c)⌋, §1.9)
rejects shorter sources (``None``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ssmlm.data import reserved as R


@dataclasses.dataclass(frozen=True)
class Sample:
    prefix: np.ndarray  # bidirectional context (may be empty)
    target: np.ndarray  # predicted causally after START (non-empty)
    used: int  # source tokens consumed

    @property
    def size(self) -> int:
        return len(self.prefix) + len(self.target)


@dataclasses.dataclass(frozen=True)
class Ids:
    start: int
    sentinels: np.ndarray  # (100,) int32
    paradigms: dict  # class -> id
    copy: dict  # COPY_MARKERS key ("copy", "span_start", "span_end", "context", "sep", "done") -> id

    @classmethod
    def from_reserved(cls, reserved: dict[str, int]) -> Ids:
        return cls(
            start=int(reserved[R.START]),
            sentinels=np.array([reserved[s] for s in R.SENTINELS], np.int32),
            paradigms={c: int(reserved[t]) for c, t in R.PARADIGMS.items()},
            copy={k: int(reserved[t]) for k, t in R.COPY_MARKERS.items()},
        )

    @classmethod
    def for_tests(cls, base: int = 1000) -> Ids:
        """Reserved ids base, base+1, … in ``reserved.RESERVED`` order (tests and benchmarks)."""
        return cls.from_reserved({t: base + i for i, t in enumerate(R.RESERVED)})


_EMPTY = np.zeros(0, np.int32)


def _i32(a) -> np.ndarray:
    return np.asarray(a, np.int32)


# ----------------------------------------------------------------------------- causal / prefix LM


def next_token(src, space, rng, ids, *, max_len=None, min_len=2) -> Sample | None:
    """§1.1: empty prefix, target = the text (the whole sample is causal)."""
    n = min(len(src), space, max_len or space)
    if n < min_len:
        return None
    return Sample(_EMPTY, _i32(src[:n]), n)


def prefix_lm(src, space, rng, ids, *, max_len=None, min_side=4) -> Sample | None:
    """§1.2 (v1): L = tokens taken; split uniformly in [0.5·L, L], clamped so both sides have >= 4 tokens."""
    n = min(len(src), space, max_len or space)
    if n < 2 * min_side:
        return None
    split = int(math.floor(rng.uniform(0.5 * n, n)))
    split = min(max(split, min_side), n - min_side)
    return Sample(_i32(src[:split]), _i32(src[split:n]), n)


# ----------------------------------------------------------------------------- span corruption


def _span_walk(src, n, space, rng, ids, rate, mean, autoencode):
    """One pass of v1's span-corruption walk (span.cpp). Returns (runs, spans, t): ``runs`` = corrupted input
    as a list of chunks, each "unmasked text + its following sentinel" (the last may lack a sentinel),
    ``spans`` = [(start, end, sentinel)], t = tokens consumed. Stops before the cost would exceed ``space``:
    infilling costs 1 per kept token and ℓ+2 per span (sentinel, span, sentinel); autoencoding 2 per kept
    token and ℓ+2 per span (sentinel, then span and the dropped token in the target, the whole taken text)."""
    lengths = np.maximum(1, np.floor(rng.normal(mean, 1.0, n))).astype(np.int64)
    draws = rng.random(n)
    sent = rng.integers(0, len(ids.sentinels), n)
    runs, spans, cur = [], [], []
    cost, t, gap_end, i = 0, 0, -1, 0
    while t < n:
        ell = int(lengths[i])
        corrupt = t > gap_end and draws[i] * ell < rate
        i += 1
        if corrupt:
            ell = min(ell, n - t)
            drop = 1 if autoencode and t + ell < n else 0
            extra = 1 + ell + drop if autoencode else ell + 2  # sentinel + target tokens
            if cost + extra > space:
                break
            s = int(ids.sentinels[sent[i - 1]])
            cur.append(s)
            runs.append(cur)
            cur = []
            spans.append((t, t + ell, s))
            cost += extra
            gap_end = (t + ell - 1) + ell // 3 + 1  # v1: next start must be > last_end + ⌊w/3⌋ + 1
            t += ell + drop
        else:
            step = 2 if autoencode else 1
            if cost + step > space:
                break
            cur.append(int(src[t]))
            cost += step
            t += 1
    runs.append(cur)
    return runs, spans, t


def _corrupt(src, space, rng, ids, rate, mean, min_len, max_len, autoencode, retries=100):
    n = min(len(src), max_len or len(src), space)
    if n < max(min_len, 1) or space < 3:
        return None
    for _ in range(retries):
        runs, spans, t = _span_walk(src, n, space, rng, ids, rate, mean, autoencode)
        if spans:
            return runs, spans, t
    return None


def infilling(src, space, rng, ids, *, rate=0.15, mean=3.0, min_len=0, max_len=None) -> Sample | None:
    """§1.3 (v1 span.cpp): span length max(1, ⌊N(μ, 1)⌋), corrupt with probability c/ℓ, gap rule, one random
    sentinel per span in the prefix; target = span_1 sent_1 span_2 sent_2 …; retried <= 100 times."""
    out = _corrupt(src, space, rng, ids, rate, mean, min_len, max_len, autoencode=False)
    if out is None:
        return None
    runs, spans, t = out
    prefix = np.concatenate([_i32(r) for r in runs])
    target = np.concatenate([np.append(_i32(src[a:b]), s) for a, b, s in spans]).astype(np.int32)
    return Sample(prefix, target, t)


def autoencoding(src, space, rng, ids, *, rate=0.5, mean=3.0, min_len=0, max_len=None, shuffle=False):
    """§1.4 (v1): the infilling walk, plus one extra token dropped after each span; target = the whole taken
    text. ``shuffle`` (§1.5, intended semantics): the corrupted input's runs ("unmasked text + its following
    sentinel", and the tail run without one) are permuted uniformly; the target is unchanged."""
    out = _corrupt(src, space, rng, ids, rate, mean, min_len, max_len, autoencode=True)
    if out is None:
        return None
    runs, spans, t = out
    runs = [r for r in runs if r]
    if shuffle:
        runs = [runs[j] for j in rng.permutation(len(runs))]
    return Sample(np.concatenate([_i32(r) for r in runs]), _i32(src[:t]), t)


# ----------------------------------------------------------------------------- deshuffling / copying


def deshuffling(src, space, rng, ids, *, p=1.0, max_len=None, min_len=2) -> Sample | None:
    """§1.6 (token level): ⌊p·n⌋ random positions permuted among themselves; target = the original."""
    n = min(len(src), space // 2, max_len or space)
    if n < min_len:
        return None
    x = _i32(src[:n])
    shuffled = x.copy()
    pos = rng.choice(n, int(math.floor(p * n)), replace=False)
    shuffled[pos] = x[pos[rng.permutation(len(pos))]]
    return Sample(shuffled, x.copy(), n)


def copying(src, space, rng, ids, *, max_len=None, min_len=2) -> Sample | None:
    """§1.7: prefix = tokens, target = tokens (at most half the space)."""
    n = min(len(src), space // 2, max_len or space)
    if n < min_len:
        return None
    x = _i32(src[:n])
    return Sample(x, x.copy(), n)


def selective_copying(src, space, rng, ids, *, k=1, form="query_context", max_len=None, span=(8, 16),
                      start_delim=(1, 8), end_delim=(1, 4), tries=None, retries=10) -> Sample | None:  # fmt: skip
    """§1.8 (v1/paper format). query_context: [COPY] ([START] sd_i [END] ed_i)… [CONTEXT] context;
    context_query: [CONTEXT] context [COPY] ([START] sd_i [END] ed_i)…. Target: span_1 [SEP] … span_K [DONE].
    Span ~ U{8..16}; its start delimiter (U{1..8}) is the context's tokens just before it, its end delimiter
    (U{1..4}) those just after; the K super-spans (delim + span + delim) do not overlap."""
    c = ids.copy
    worst = k * (2 + start_delim[1] + end_delim[1] + span[1] + 1) + 2  # markers + delims + span + SEP/DONE
    n = min(len(src), max_len or len(src), space - worst)
    need = k * (start_delim[1] + span[1] + end_delim[1])
    if n < need:
        return None
    tries = tries or max(32, 2 * k)
    for _ in range(retries):
        chosen = []
        for _ in range(tries):
            sd = int(rng.integers(start_delim[0], start_delim[1] + 1))
            ln = int(rng.integers(span[0], span[1] + 1))
            ed = int(rng.integers(end_delim[0], end_delim[1] + 1))
            w = sd + ln + ed
            a = int(rng.integers(0, n - w + 1))
            if all(a + w <= b or a >= b + bw for b, bw, *_ in chosen):
                chosen.append((a, w, sd, ln, ed))
                if len(chosen) == k:
                    break
        if len(chosen) == k:
            break
    else:
        return None
    ctx = _i32(src[:n])
    query = [c["copy"]]
    target = []
    for i, (a, _w, sd, ln, ed) in enumerate(chosen):
        query += [c["span_start"], *ctx[a : a + sd], c["span_end"], *ctx[a + sd + ln : a + sd + ln + ed]]
        target += [*ctx[a + sd : a + sd + ln], c["sep"] if i < k - 1 else c["done"]]
    context = [c["context"], *ctx]
    prefix = query + context if form == "query_context" else context + query
    return Sample(_i32(prefix), _i32(target), n)


OBJECTIVES = {
    "next_token": next_token,
    "prefix_lm": prefix_lm,
    "infilling": infilling,
    "autoencoding": autoencoding,
    "deshuffling": deshuffling,
    "copying": copying,
    "selective_copying": selective_copying,
}

PARADIGM_PLACEMENTS = ("start", "end_half", "none")


def sample(kind: str, cls: str, src, space: int, rng, ids: Ids, paradigm: str = "start", **params) -> Sample | None:
    """Run objective ``kind`` and add the paradigm token of class ``cls`` (one slot reserved for it):
    "start" = first prefix token (the notes' recommendation), "end_half" = last prefix token half the time
    (paper A.6), "none" = no paradigm token."""
    if paradigm not in PARADIGM_PLACEMENTS:
        raise ValueError(f"paradigm {paradigm!r}: expected one of {PARADIGM_PLACEMENTS}")
    if paradigm == "none":
        return OBJECTIVES[kind](src, space, rng, ids, **params)
    s = OBJECTIVES[kind](src, space - 1, rng, ids, **params)
    if s is None:
        return None
    tok = np.array([ids.paradigms[cls]], np.int32)
    at_end = paradigm == "end_half" and rng.random() < 0.5
    prefix = np.concatenate([s.prefix, tok] if at_end else [tok, s.prefix])
    return Sample(prefix, s.target, s.used)
