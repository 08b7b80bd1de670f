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
    cfg = ModelConfig(
        arch=arch,
        hidden_size=16,
        num_layers=2,
        state_size=16,
        num_heads=2,
        vocab_size=40,
        dropout=0.0,
        initializer_range=0.2,
    )
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


@pytest.mark.parametrize(
    "arch,bidirectional",
    [
        ("gated_ssm", "alternate"),
        ("gated_ssm_plus", "all"),
        ("hawk", "alternate"),
        ("transformer_lm", "alternate"),
        ("transformer_lm", "none"),
    ],
)
def test_padding_after_a_prompt_changes_nothing(arch, bidirectional):
    """Decoding pads a prompt to a bucket length (one compiled prefill for many lengths): whatever the padding
    holds, the prompt's logits, the cache after it and every step from it are those of the unpadded prompt."""
    import jax.numpy as jnp

    cfg = ModelConfig(
        arch=arch,
        hidden_size=16,
        num_layers=2,
        state_size=16,
        num_heads=2,
        vocab_size=40,
        dropout=0.0,
        initializer_range=0.2,
        bidirectional=bidirectional,
    )
    model = build_lm(cfg, seed=3)
    rng = np.random.default_rng(0)
    tokens = [5, 6, 7, 8, 9, 1, 11, 12]  # a prefix of 5, then START and two causal tokens (the convolutions' tail)
    types = [1] * 5 + [3] * 3
    n, padded = len(tokens), 16
    junk = rng.integers(2, 40, padded - n).tolist()  # not zeros: nothing of the padding may reach the prompt
    logits, cache = model.prefill(jnp.asarray([tokens]), jnp.asarray([types]), model.init_cache(1, 32))
    logits_p, cache_p = model.prefill(
        jnp.asarray([tokens + junk]),
        jnp.asarray([types + [0] * len(junk)]),
        model.init_cache(1, 32),
        jnp.asarray([[1] * n + [0] * len(junk)]),
    )
    assert_close_scaled(logits_p[0, :n], logits[0], rtol=16 * EPS32, name=f"{arch} prompt logits")
    assert int(cache_p["pos"][0]) == n
    for layer, layer_p in zip(cache["layers"], cache_p["layers"], strict=True):
        for key in layer:
            a, b = np.asarray(layer[key]), np.asarray(layer_p[key])
            if key in ("k", "v"):  # the Transformer's KV cache: the prompt's slots (the padding's are never read)
                a, b = a[:, :n], b[:, :n]
            assert_close_scaled(b, a, rtol=16 * EPS32, axis=None, name=f"{arch} cache {key}")
    for token in [13, 14, 15]:
        step, cache = model.step(jnp.asarray([token]), cache)
        step_p, cache_p = model.step(jnp.asarray([token]), cache_p)
        assert_close_scaled(step_p, step, rtol=16 * EPS32, name=f"{arch} step after the padded prompt")


@pytest.mark.parametrize("arch", ["gated_ssm", "transformer_lm"])
def test_prompts_of_many_lengths_share_one_compiled_prefill(arch):
    """An evaluation decodes one prompt per book, each of its own length: they are padded to a few bucket lengths,
    so the prefill (and the Transformer's step, whose cache is sized in steps) compiles once per bucket, not once
    per book (3-4 s a book on 2 CPU cores before)."""
    from ssmlm.models import decode

    cfg = ModelConfig(
        arch=arch,
        hidden_size=16,
        num_layers=1,
        state_size=16,
        num_heads=2,
        vocab_size=40,
        dropout=0.0,
        initializer_range=0.2,
    )
    model = build_lm(cfg, seed=4)
    before = decode._prefill._cache_size(), decode._step._cache_size()
    for n in range(17, 33):  # one bucket (32)
        generate_ids(model, list(range(2, n + 1)), [1], Sampling(max_new_tokens=2 + n % 3))
    assert decode._prefill._cache_size() - before[0] == 1
    assert decode._step._cache_size() - before[1] == 1
