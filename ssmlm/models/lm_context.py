"""What every language-model block needs to know about a packed row, derived once per forward pass.

A row holds samples laid out as ``[prefix…, START, y_1 … y_{M-1}]`` (docs/faithfulness.md#birdie-layout):
``segment_ids`` numbers the samples (0 = padding), ``token_types`` is 1 on the bidirectional prefix (3 on
the causal part, 0 on padding), ``positions`` counts within each sample. Two boolean reset masks are derived
from them rather than read from one 3-valued mask (docs/faithfulness.md#birdie-scan), because a token can be
both a sample's first and causal (a sample with an empty prefix):

    fwd_reset[t] = t == 0 or segment[t] != segment[t-1]          the forward state starts afresh
    rev_reset[t] = not prefix[t] or segment[t+1] != segment[t]    the reverse (right-to-left) state starts afresh
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Context:
    segment_ids: Any  # (B, L) int32, 0 = padding
    prefix: Any  # (B, L) bool: bidirectional prefix positions
    positions: Any  # (B, L) int32 position within the sample (RoPE)
    fwd_reset: Any  # (B, L) bool
    rev_reset: Any  # (B, L) bool


def make_context(tokens, segment_ids=None, token_types=None, positions=None) -> Context:
    """Context of a (B, L) batch. Missing ``segment_ids``: one sample per row; missing ``token_types``: all
    causal (a plain LM); missing ``positions``: 0, 1, 2, … along the row."""
    b, length = tokens.shape
    if segment_ids is None:
        segment_ids = jnp.ones((b, length), jnp.int32)
    segment_ids = jnp.asarray(segment_ids, jnp.int32)
    prefix = jnp.zeros((b, length), bool) if token_types is None else jnp.asarray(token_types) == 1
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
    first = jnp.ones((b, 1), bool)
    fwd_reset = jnp.concatenate([first, segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    last = jnp.concatenate([segment_ids[:, 1:] != segment_ids[:, :-1], first], axis=1)
    rev_reset = ~prefix | last
    return Context(segment_ids, prefix, jnp.asarray(positions, jnp.int32), fwd_reset, rev_reset)
