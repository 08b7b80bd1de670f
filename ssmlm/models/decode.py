"""Decoding a language model token by token: prefill the prompt once, then one recurrent step (O(1) state per
layer for the SSMs, a KV cache for the Transformer) per generated token.

A prompt is laid out as a training sample is (docs/faithfulness.md#birdie-layout): ``prefix`` tokens (processed
bidirectionally by the layers that can), then ``causal`` tokens — START and whatever follows it — and the
generated tokens continue the causal part. Sampling: greedy at temperature 0, else softmax(logits / T)
restricted to the top-k tokens and to the smallest set whose probability reaches top-p.

Shapes are bucketed so that prompts of many lengths (an evaluation's books or questions) share a few compiled
functions instead of compiling the prefill (and the Transformer's step, whose KV cache grows with the text) once
per length: the prompt is padded after its end to ``bucket(length)`` tokens, the next power of two (segment 0,
which no block lets reach a real token: see LanguageModel.prefill), and a KV cache is sized in steps of
CACHE_STEP tokens. The padding costs at most as much again as the prompt's own prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    seed: int = 0


def choose(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> int:
    """The next token from one row of logits."""
    logits = np.asarray(logits, np.float64)
    if s.temperature <= 0:
        return int(np.argmax(logits))
    z = logits / s.temperature
    if s.top_k and s.top_k < len(z):
        z = np.where(z >= np.partition(z, -s.top_k)[-s.top_k], z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if s.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < s.top_p  # the smallest prefix whose mass reaches top_p
        mask = np.zeros_like(p, bool)
        mask[order[keep]] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(len(p), p=p))


MIN_BUCKET = 16
CACHE_STEP = 256


def bucket(n: int) -> int:
    """The padded length of a prompt of ``n`` tokens: the next power of two, at least MIN_BUCKET."""
    return max(MIN_BUCKET, 1 << max(n - 1, 0).bit_length())


def cache_length(padded_prompt: int, new_tokens: int) -> int:
    """The decoding cache's length: the padded prompt and the new tokens, rounded up to CACHE_STEP."""
    return -(-(padded_prompt + new_tokens) // CACHE_STEP) * CACHE_STEP


# Pure jitted functions of (graph definition, parameters): the model is split once per generation, not at
# every token as nnx.jit would (its per-call graph traversal costs more than a small model's step).
@partial(jax.jit, static_argnums=0)
def _prefill(graphdef, state, tokens, token_types, cache, segment_ids):
    return nnx.merge(graphdef, state).prefill(tokens, token_types, cache, segment_ids)


@partial(jax.jit, static_argnums=0, donate_argnums=3)
def _step(graphdef, state, tokens, cache):
    return nnx.merge(graphdef, state).step(tokens, cache)


class Stepper:
    """A model's prefill and recurrent step as compiled functions (split once)."""

    def __init__(self, model):
        self.graphdef, self.state = nnx.split(model)
        self.init_cache = model.init_cache

    def prefill(self, tokens, token_types, cache, segment_ids):
        return _prefill(self.graphdef, self.state, tokens, token_types, cache, segment_ids)

    def step(self, tokens, cache):
        return _step(self.graphdef, self.state, tokens, cache)


def generate_ids(
    model,
    prefix: Sequence[int],
    causal: Sequence[int],
    sampling: Sampling = Sampling(),
    stop: Callable[[list[int]], bool] | None = None,
    logits_out: list | None = None,
    on_token: Callable[[list[int], bool], None] | None = None,
) -> list[int]:
    """Generated token ids after ``prefix`` (bidirectional) + ``causal`` (START first). ``stop(ids)`` is asked
    after every token; ``logits_out``, when given, receives each step's logits (for tests and scoring);
    ``on_token(ids, last)`` is called once per token as it comes (``last``: no token follows), for streaming."""
    if not causal:
        raise ValueError("the causal part of a prompt starts with the START token; got none")
    n = len(prefix) + len(causal)
    pad = bucket(n) - n  # after the prompt: segment 0, token type 0 (see the module docstring)
    tokens = np.asarray([*prefix, *causal, *[0] * pad], np.int32)[None]
    types = np.asarray([1] * len(prefix) + [3] * len(causal) + [0] * pad, np.int32)[None]
    segments = np.asarray([1] * n + [0] * pad, np.int32)[None]
    run = Stepper(model)
    cache = run.init_cache(1, cache_length(n + pad, sampling.max_new_tokens))
    logits, cache = run.prefill(jnp.asarray(tokens), jnp.asarray(types), cache, jnp.asarray(segments))
    last = np.asarray(logits[0, n - 1])
    rng = np.random.default_rng(sampling.seed)
    out: list[int] = []
    for _ in range(sampling.max_new_tokens):
        if logits_out is not None:
            logits_out.append(last)
        out.append(choose(last, sampling, rng))
        done = (stop is not None and stop(out)) or len(out) == sampling.max_new_tokens
        if on_token is not None:
            on_token(out, done)
        if done:
            break
        logits, cache = run.step(jnp.asarray([out[-1]], jnp.int32), cache)
        last = np.asarray(logits[0])
    return out


def sequence_logits(model, prefix: Sequence[int], causal: Sequence[int]) -> jax.Array:
    """Full-sequence forward pass of one prompt laid out like ``generate_ids`` lays it out: (L, V) logits."""
    tokens = jnp.asarray([[*prefix, *causal]], jnp.int32)
    types = jnp.asarray([[1] * len(prefix) + [3] * len(causal)], jnp.int32)
    return model(tokens, token_types=types)[0]
