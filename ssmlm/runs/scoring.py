"""Log-likelihoods of continuations, batched: what multiple-choice evaluations (story infilling, the
lm-eval-harness adapter) ask of a language model.

A request is laid out as a training sample is (docs/faithfulness.md#birdie-layout): ``prefix`` ids (bidirectional),
``causal`` ids starting with START, then the ``continuation`` y_1 … y_K to score. One forward pass over

    [prefix…, causal…, y_1 … y_{K−1}]        token types 1 on the prefix, 3 after

gives, at the position before each y_k, log p(y_k | everything before it) = log_softmax(logits)[y_k]; the
request's score is their sum, with the count K and whether every y_k is the argmax (greedy).

Rows of a batch are padded on the right to a bucketed length (so that few shapes compile) with segment id 0
and type 0, which no real token attends to or carries state from (ssmlm.models.lm_context): padding does
not change a row's values.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ssmlm.progress import progress_bar

Request = tuple[Sequence[int], Sequence[int], Sequence[int]]  # (prefix, causal with START first, continuation)


def bucket(n: int) -> int:
    """Padded row length: a power of two up to 64 (at least 16), then a multiple of 64."""
    if n <= 64:
        return max(16, 1 << (n - 1).bit_length())
    return -(-n // 64) * 64


def truncate(prefix: Sequence[int], causal: Sequence[int], continuation: Sequence[int], max_len: int):
    """The last ``max_len`` input tokens of a request: what is dropped is taken from the left of the prefix
    first, then from the left of the causal part (its START included: the request is longer than the model
    was trained on, and the continuation's own context is what matters). The continuation is never cut."""
    if len(continuation) > max_len:
        raise ValueError(f"a continuation of {len(continuation)} tokens does not fit in max_len {max_len}")
    excess = len(prefix) + len(causal) + len(continuation) - 1 - max_len
    if excess > 0:
        cut = min(excess, len(prefix))
        prefix, causal = prefix[cut:], causal[excess - cut :]
    return list(prefix), list(causal)


@partial(jax.jit, static_argnums=0)
def _target_logprobs(graphdef, state, tokens, segment_ids, token_types, targets):
    """(B, L) log p(targets[b, t] | row b up to t) and whether targets[b, t] is the argmax there."""
    logits = nnx.merge(graphdef, state)(tokens, segment_ids=segment_ids, token_types=token_types)
    # log_softmax at the target only: no second (B, L, V) array
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - jax.nn.logsumexp(logits, axis=-1)
    return picked, jnp.argmax(logits, axis=-1) == targets


def continuation_logprobs(
    model,
    requests: Sequence[Request],
    batch_size: int = 8,
    max_len: int | None = None,
    desc: str | None = None,
) -> list[tuple[float, int, bool]]:
    """(Σ log p(continuation tokens | everything before them), number of continuation tokens, whether every
    continuation token is the argmax) for each request, in the order given.

    ``max_len`` (default: the model's ``max_seq_length``) caps a row's input length; a longer request keeps
    its last ``max_len`` tokens, dropped from the left of the prefix first (``truncate``). Requests are
    batched longest first, ``batch_size`` rows per forward pass (the last batch is filled with copies of a
    row, so every batch has the same width). ``desc`` shows a progress bar under that name."""
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size}: expected at least 1")
    cfg = getattr(model, "cfg", None)
    max_len = max_len or getattr(cfg, "max_seq_length", None) or 1 << 30
    rows = []
    for prefix, causal, cont in requests:
        if not causal:
            raise ValueError("the causal part of a request starts with the START token; got none")
        prefix, causal = truncate(prefix, causal, cont, max_len)
        rows.append((prefix, causal, list(cont)))
    graphdef, state = nnx.split(model)  # once: nnx.jit would traverse the graph at every call
    results: list[tuple[float, int, bool]] = [(0.0, 0, True)] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: -sum(map(len, rows[i])))
    with progress_bar(desc is None) as bar:
        task = bar.add_task(desc or "scoring", total=len(rows))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            scored = [i for i in chunk if rows[i][2]]  # an empty continuation scores 0 (log 1)
            if scored:
                scores = _score_batch(graphdef, state, [rows[i] for i in scored], batch_size)
                for i, r in zip(scored, scores, strict=True):
                    results[i] = r
            bar.advance(task, len(chunk))
    return results


def _score_batch(graphdef, state, rows, batch_size: int) -> list[tuple[float, int, bool]]:
    width = bucket(max(len(p) + len(c) + len(y) - 1 for p, c, y in rows))
    tokens = np.zeros((batch_size, width), np.int32)
    segments = np.zeros_like(tokens)
    types = np.zeros_like(tokens)
    targets = np.zeros_like(tokens)
    where = np.zeros((batch_size, width), bool)  # positions whose next token is a continuation token
    for b in range(batch_size):
        prefix, causal, cont = rows[min(b, len(rows) - 1)]  # spare rows repeat the last one
        ids = [*prefix, *causal, *cont[:-1]]
        n, first = len(ids), len(prefix) + len(causal) - 1  # logits at `first` predict y_1
        tokens[b, :n], segments[b, :n] = ids, 1
        types[b, :n] = [1] * len(prefix) + [3] * (n - len(prefix))
        targets[b, first : first + len(cont)] = cont
        where[b, first : first + len(cont)] = True
    picked, greedy = _target_logprobs(graphdef, state, tokens, segments, types, targets)
    picked, greedy = np.asarray(picked, np.float64), np.asarray(greedy)
    return [
        (float(picked[b][where[b]].sum()), int(where[b].sum()), bool(greedy[b][where[b]].all()))
        for b in range(len(rows))
    ]


def split_trailing_spaces(context: str, continuation: str) -> tuple[str, str]:
    """A context's trailing spaces belong to the continuation (a byte-level BPE spells " word" as one token,
    as the lm-eval harness also assumes). Newlines stay: they are tokens of their own."""
    n = len(context) - len(context.rstrip(" "))
    return (context[:-n], context[-n:] + continuation) if n else (context, continuation)


def prompt_requests(generator, contexts_and_continuations: Sequence[tuple[str, str]]) -> list[Request]:
    """Requests for (context, continuation) texts: the context laid out as ``generator.layout`` lays out a
    prompt (in the prefix for a Birdie run, after START for a causal one), the continuation encoded on its
    own (no special tokens) after the context's trailing spaces moved onto it."""
    out = []
    for context, continuation in contexts_and_continuations:
        context, continuation = split_trailing_spaces(context, continuation)
        prefix, causal = generator.layout(context)
        cont = generator.tokenizer.encode(continuation, add_special_tokens=False).ids
        out.append((prefix, causal, cont))
    return out
