"""Birdie's pre-training objectives as pure functions (v1/paper semantics; docs/faithfulness.md#birdie-objectives).

Every objective is ``f(src, space, rng, ids, **params) -> Sample | None``:
  src    int32 tokens of one document from some offset (what is left of it)
  space  slots left in the packed row; a sample occupies len(prefix) + len(target) slots (the packer puts
         START between them and drops the target's last token from the inputs: [prefix…, START, y_1…y_{M−1}])
  rng    a numpy Generator (the only source of randomness)
  ids    the reserved token ids (``Ids``)
and returns ``Sample(prefix, target, used)`` with len(prefix) + len(target) <= space, ``used`` = source
tokens consumed (src[used:] is the leftover the pipeline feeds to the next sample), or None when nothing
valid fits. Objectives never add the paradigm token; ``sample`` does (one slot reserved for it).

Length buckets: ``max_len`` truncates the source; ``min_len`` (infilling/autoencoding: m* = ⌊μ/(2c)⌋, v1's rule)
rejects shorter sources (``None``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ssmlm.data import reserved as R
from ssmlm.schema import named


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
    """v1: empty prefix, target = the text (the whole sample is causal)."""
    n = min(len(src), space, max_len or space)
    if n < min_len:
        return None
    return Sample(_EMPTY, _i32(src[:n]), n)


def prefix_lm(src, space, rng, ids, *, max_len=None, min_side=4) -> Sample | None:
    """v1: L = tokens taken; split uniformly in [0.5·L, L], clamped so both sides have >= 4 tokens."""
    n = min(len(src), space, max_len or space)
    if n < 2 * min_side:
        return None
    split = int(math.floor(rng.uniform(0.5 * n, n)))
    split = min(max(split, min_side), n - min_side)
    return Sample(_i32(src[:split]), _i32(src[split:n]), n)


# ----------------------------------------------------------------------------- span corruption


def _span_walk(src, n, space, rng, ids, rate, mean, autoencode):
    """One pass of v1's span-corruption walk (span.cpp), vectorised. Returns (starts, used, sents, t) — the
    spans placed (int64 arrays: where each starts, how much text it removes from the input: ℓ, plus for
    autoencoding the dropped token after it unless the span reaches the end; ``sents`` their sentinel ids) and
    t = tokens consumed — or None when no span was placed.

    The walk it reproduces, draw for draw: position t and draw index i start at 0; at each step span length
    ℓ_i = max(1, ⌊N(μ, 1)⌋) and u_i ~ U[0, 1) are read (all n of each drawn up front, then n sentinel
    indices); if t is past the gap (t > last_end + ⌊ℓ_last/3⌋ + 1, v1's rule) and u_i·ℓ_i < c, a span
    [t, t + ℓ) is masked (ℓ capped at the text's end; autoencoding also drops the token after it), else token
    t is kept; i += 1 either way. It stops at the end of the text or before the cost would exceed ``space``:
    infilling costs 1 per kept token and ℓ+2 per span (sentinel, span, sentinel); autoencoding 2 per kept
    token and ℓ+2 per span (sentinel, then span and the dropped token in the target, the whole taken text).

    Without a per-token loop: between spans t − i is constant, so a span can only start at a draw i with
    u_i·ℓ_i < c (a "hit"), and after a span at draw j the next one is the first hit at a draw
    >= j + ⌊ℓ_j/3⌋ + 2 − drop, whatever the position: the spans are a chain through the hits, followed
    in Python once per span; positions, costs and the stopping point are then cumulative sums."""
    x = rng.normal(mean, 1.0, n)
    draws = rng.random(n)
    sent = rng.integers(0, len(ids.sentinels), n)
    np.maximum(np.floor(x, out=x), 1.0, out=x)  # span lengths ℓ_i (whole numbers, as floats)
    hits = np.flatnonzero(draws * x < rate)
    if not len(hits):
        return None
    drop = 1 if autoencode else 0
    hl = x[hits].astype(np.int64)
    nxt = np.searchsorted(hits, hits + hl // 3 + (2 - drop)).tolist()
    chain, c, h = [], 0, len(hits)
    while c < h:
        chain.append(c)
        c = nxt[c]
    chain = np.array(chain)
    j = hits[chain]  # each span's draw index, before the stopping rules
    used = hl[chain] + drop if drop else hl[chain]  # text each span removes from the input: ℓ (+ the dropped)
    cum = np.cumsum(used)
    k = np.arange(len(j))
    end = j + cum - k  # where each span's removed text ends, t_k + used_k (t_k = j_k + Σ earlier (used − 1))
    # cost after span k: infilling, 1 per consumed token + 2 sentinels per span; autoencoding, 2 per kept
    # token + 1 per removed token + 1 sentinel per span
    cost = end + 2 * (k + 1) if not drop else 2 * end - cum + k + 1
    m = int(np.searchsorted(end, n + drop))  # the first span with t + ℓ >= n (none after it)
    step = 2 if drop else 1
    fit = int(np.searchsorted(cost[:m], space, side="right"))  # spans before it within the budget
    limit = int(end[fit] - used[fit]) if fit < len(j) else n  # where the next span would start
    if fit == m and limit < n:  # that span starts inside the text: it is cut at the end, and drops nothing
        ell = n - limit
        last = n + 2 * (m + 1) if not drop else 2 * n - (int(cum[m - 1]) if m else 0) - ell + m + 1
        if last <= space:
            used = used[: m + 1].copy()
            used[m] = ell
            end = end[: m + 1].copy()
            end[m] = n
            fit, limit = m + 1, n
            cost_prev = last
    if fit == 0:
        return None
    if fit <= m:
        cost_prev = int(cost[fit - 1])
        limit = min(limit, n)
    t_end = min(limit, int(end[fit - 1]) + (space - cost_prev) // step)
    used = used[:fit]
    return end[:fit] - used, used, ids.sentinels[sent[j[:fit]]], t_end


def _corrupt(src, space, rng, ids, rate, mean, min_len, max_len, autoencode, retries=100):
    n = min(len(src), max_len or len(src), space)
    if n < max(min_len, 1) or space < 3:
        return None
    for _ in range(retries):
        out = _span_walk(src, n, space, rng, ids, rate, mean, autoencode)
        if out is not None:
            return out
    return None


def _masked_input(seg, starts, used, sents):
    """The corrupted input: ``seg`` with each span (and the dropped token after it) replaced by its sentinel.
    Returns (input, mask over ``seg`` of the removed tokens, each sentinel's position in the input)."""
    delta = np.zeros(len(seg) + 1, np.int32)
    delta[starts] = 1
    delta[starts + used] -= 1  # ends are distinct; an end may equal the next start (autoencoding)
    removed = np.cumsum(delta[:-1]) > 0
    k = len(starts)
    pos = starts - (np.cumsum(used) - used) + np.arange(k)
    out = np.empty(len(seg) - int(used.sum()) + k, np.int32)
    is_sent = np.zeros(len(out), bool)
    is_sent[pos] = True
    out[pos] = sents
    out[~is_sent] = seg[~removed]
    return out, removed, pos


def infilling(src, space, rng, ids, *, rate=0.15, mean=3.0, min_len=0, max_len=None) -> Sample | None:
    """v1 (span.cpp): span length max(1, ⌊N(μ, 1)⌋), corrupt with probability c/ℓ, gap rule, one random
    sentinel per span in the prefix; target = span_1 sent_1 span_2 sent_2 …; retried <= 100 times."""
    out = _corrupt(src, space, rng, ids, rate, mean, min_len, max_len, autoencode=False)
    if out is None:
        return None
    starts, ell, sents, t = out  # infilling removes just the span: used = ℓ
    seg = _i32(src[:t])
    prefix, removed, _ = _masked_input(seg, starts, ell, sents)
    target = np.empty(int(ell.sum()) + len(ell), np.int32)
    tpos = np.cumsum(ell + 1) - 1
    is_sent = np.zeros(len(target), bool)
    is_sent[tpos] = True
    target[tpos] = sents
    target[~is_sent] = seg[removed]
    return Sample(prefix, target, t)


def autoencoding(src, space, rng, ids, *, rate=0.5, mean=3.0, min_len=0, max_len=None, shuffle=False):
    """v1: the infilling walk, plus one extra token dropped after each span; target = the whole taken
    text. ``shuffle`` (intended semantics): the corrupted input's runs ("unmasked text + its following
    sentinel", and the tail run without one) are permuted uniformly; the target is unchanged."""
    out = _corrupt(src, space, rng, ids, rate, mean, min_len, max_len, autoencode=True)
    if out is None:
        return None
    starts, used, sents, t = out
    seg = _i32(src[:t])
    prefix, _, pos = _masked_input(seg, starts, used, sents)
    if shuffle:
        ends = pos + 1
        if ends[-1] < len(prefix):  # a non-empty tail run
            ends = np.append(ends, len(prefix))
        begins = np.concatenate(([0], ends[:-1]))
        perm = rng.permutation(len(ends))
        lens = (ends - begins)[perm]
        prefix = prefix[np.repeat(begins[perm] - (np.cumsum(lens) - lens), lens) + np.arange(len(prefix))]
    return Sample(prefix, seg, t)


# ----------------------------------------------------------------------------- deshuffling / copying


def deshuffling(src, space, rng, ids, *, p=1.0, max_len=None, min_len=2) -> Sample | None:
    """Token level: ⌊p·n⌋ random positions permuted among themselves; target = the original."""
    n = min(len(src), space // 2, max_len or space)
    if n < min_len:
        return None
    x = _i32(src[:n])
    shuffled = x.copy()
    pos = rng.choice(n, int(math.floor(p * n)), replace=False)
    shuffled[pos] = x[pos[rng.permutation(len(pos))]]
    return Sample(shuffled, x.copy(), n)


def copying(src, space, rng, ids, *, max_len=None, min_len=2) -> Sample | None:
    """v1: prefix = tokens, target = tokens (at most half the space)."""
    n = min(len(src), space // 2, max_len or space)
    if n < min_len:
        return None
    x = _i32(src[:n])
    return Sample(x, x.copy(), n)


def selective_copying(
    src,
    space,
    rng,
    ids,
    *,
    k=1,
    form="query_context",
    max_len=None,
    span=(8, 16),
    start_delim=(1, 8),
    end_delim=(1, 4),
    tries=None,
    retries=10,
) -> Sample | None:
    """v1/paper format (A.5). query_context: [COPY] ([START] sd_i [END] ed_i)… [CONTEXT] context;
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


# kind -> the objective function, or "module:function" for one kept in a module of its own (imported on first use,
# so that module may import this one)
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


@functools.cache
def objective(kind: str):
    """The objective function registered under ``kind`` in OBJECTIVES."""
    found = OBJECTIVES[kind]
    return named(found) if isinstance(found, str) else found


def sample(kind: str, cls: str, src, space: int, rng, ids: Ids, paradigm: str = "start", **params) -> Sample | None:
    """Run objective ``kind`` and add the paradigm token of class ``cls`` (one slot reserved for it):
    "start" = first prefix token (where the official v2 code prepends its paradigm string), "end_half" = last
    prefix token half the time (paper A.6), "none" = no paradigm token."""
    if paradigm not in PARADIGM_PLACEMENTS:
        raise ValueError(f"paradigm {paradigm!r}: expected one of {PARADIGM_PLACEMENTS}")
    if paradigm == "none":
        return objective(kind)(src, space, rng, ids, **params)
    s = objective(kind)(src, space - 1, rng, ids, **params)
    if s is None:
        return None
    tok = np.array([ids.paradigms[cls]], np.int32)
    at_end = paradigm == "end_half" and rng.random() < 0.5
    prefix = np.concatenate([s.prefix, tok] if at_end else [tok, s.prefix])
    return Sample(prefix, s.target, s.used)
