"""Decoding: the sampling rules, and generate_ids giving the full forward pass's logits token by token."""

from __future__ import annotations

import numpy as np
import pytest
from numerics import EPS32, assert_close_scaled

from ssmlm.models import build_lm
from ssmlm.models.config import ModelConfig
from ssmlm.models.decode import Sampling, choose, generate_ids, sequence_logits


def test_sampling_rules():
    logits = np.array([0.0, 3.0, 2.5, -1.0, 1.5])
    rng = np.random.default_rng(0)
    assert choose(logits, Sampling(temperature=0.0), rng) == 1
    assert choose(logits, Sampling(temperature=1.0, top_k=1), rng) == 1
    assert choose(logits, Sampling(temperature=1.0, top_p=1e-6), rng) == 1
    draws = {choose(logits, Sampling(temperature=1.0, top_k=2), rng) for _ in range(300)}
    assert draws == {1, 2}
    # top-p 0.9 keeps the smallest set reaching 0.9: here the three likeliest tokens
    p = np.exp(logits) / np.exp(logits).sum()
    assert p[[1, 2]].sum() < 0.9 <= p[[1, 2, 4]].sum()
    draws = {choose(logits, Sampling(temperature=1.0, top_p=0.9), rng) for _ in range(500)}
    assert draws == {1, 2, 4}
    a = [choose(logits, Sampling(temperature=2.0), np.random.default_rng(5)) for _ in range(3)]
    assert a == [choose(logits, Sampling(temperature=2.0), np.random.default_rng(5)) for _ in range(3)]


@pytest.mark.parametrize("arch", ["gated_ssm", "hawk", "transformer_lm"])
def test_generated_tokens_get_the_full_forward_logits(arch):
    cfg = ModelConfig(arch=arch, hidden_size=16, num_layers=2, state_size=16, num_heads=2, vocab_size=40,
                      dropout=0.0, initializer_range=0.2)  # fmt: skip
    model = build_lm(cfg, seed=1)
    prefix, causal = [5, 6, 7, 8], [1]
    seen: list = []
    out = generate_ids(model, prefix, causal, Sampling(max_new_tokens=6), logits_out=seen)
    assert len(out) == 6
    full = np.asarray(sequence_logits(model, prefix, causal + out[:-1]))
    # one token at a time (cache, recurrent step) vs the whole sequence (parallel scan, masked attention): the same
    # logits up to float32 rounding, relative to each position's logits (tests/numerics.py); measured ≤ 5ε, AVX-512
    # and SSE4.2
    assert_close_scaled(np.stack(seen), full[len(prefix) :], rtol=64 * EPS32, name=f"{arch} decoded logits")
    assert out == [int(np.argmax(row)) for row in full[len(prefix) :]]  # greedy
    stopped = generate_ids(model, prefix, causal, Sampling(max_new_tokens=6), stop=lambda ids: len(ids) == 2)
    assert stopped == out[:2]
