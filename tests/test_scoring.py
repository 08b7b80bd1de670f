"""Batched continuation log-likelihoods equal the one-sample, unpadded forward pass, whatever the batch."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from numerics import EPS32

from ssmlm.models import build_lm
from ssmlm.models.config import ModelConfig
from ssmlm.models.decode import Sampling, generate_ids, sequence_logits
from ssmlm.runs.scoring import bucket, continuation_logprobs, split_trailing_spaces, truncate

START = 1
# A batched request is padded to its bucket, so its forward pass sums in another order than the request alone: the two
# log-probabilities agree to float32 rounding. They are sums of same-sign terms (each log p ≤ 0), so a value's own
# magnitude is its terms' (tests/numerics.py): measured ≤ 2ε of it (AVX-512, SSE4.2); 128ε leaves a 60x margin,
# while a misaligned, dropped or extra token moves it by ≥ 1e-2.
LOGPROB_RTOL = 128 * EPS32


def tiny(arch: str):
    cfg = ModelConfig(
        arch=arch,
        hidden_size=32,
        num_layers=2,
        state_size=32,
        num_heads=2,
        vocab_size=48,
        dropout=0.0,
        initializer_range=0.3,
        max_seq_length=64,
    )
    return build_lm(cfg, seed=3)


# decode's one-prompt forward pass, compiled (run eagerly it takes seconds per request)
one_prompt = nnx.jit(sequence_logits, static_argnums=(1, 2))


def reference(model, prefix, causal, cont):
    """One request alone, no padding: Σ log_softmax(logits)[y_k] at the position before each y_k."""
    logp = np.asarray(jax.nn.log_softmax(one_prompt(model, tuple(prefix), (*causal, *cont[:-1])), axis=-1))
    first = len(prefix) + len(causal) - 1
    rows = logp[first : first + len(cont)]
    return float(sum(rows[k, y] for k, y in enumerate(cont))), all(rows[k].argmax() == y for k, y in enumerate(cont))


def requests(rng: np.random.Generator):
    ids = lambda n: [int(x) for x in rng.integers(2, 48, n)]  # noqa: E731
    return [
        (ids(6), [START], ids(3)),  # prefix mode: the prompt is bidirectional
        ([], [START, *ids(9)], ids(5)),  # causal mode: the prompt after START
        ([7], [START, *ids(2)], ids(1)),  # a paradigm token alone in the prefix
        (ids(21), [START], ids(12)),  # longer: the others are padded to its bucket
        (ids(3), [START], ids(2)),
    ]


@pytest.mark.parametrize("arch", ["gated_ssm", "transformer_lm"])
def test_batched_scores_equal_one_at_a_time(arch):
    model = tiny(arch)
    reqs = requests(np.random.default_rng(0))
    got = continuation_logprobs(model, reqs, batch_size=4)  # a full batch and one with 3 spare rows
    for (prefix, causal, cont), (logprob, n, greedy) in zip(reqs, got, strict=True):
        want, want_greedy = reference(model, prefix, causal, cont)
        assert n == len(cont)
        assert logprob == pytest.approx(want, rel=LOGPROB_RTOL)
        assert greedy == want_greedy


def test_greedy_continuation_is_flagged_and_a_changed_one_is_not():
    model = tiny("gated_ssm")
    prefix, causal = [5, 9, 11, 4], [START]
    cont = generate_ids(model, prefix, causal, Sampling(max_new_tokens=5))
    other = [*cont[:2], (cont[2] + 1) % 48, *cont[3:]]
    (lp, n, greedy), (lp2, _, greedy2) = continuation_logprobs(model, [(prefix, causal, cont), (prefix, causal, other)])
    assert n == 5 and greedy and not greedy2
    assert lp > lp2 and lp < 0


def test_long_requests_keep_their_last_tokens():
    model = tiny("gated_ssm")
    rng = np.random.default_rng(1)
    prefix, causal, cont = [int(x) for x in rng.integers(2, 48, 30)], [START, 8, 9], [10, 11, 12, 13]
    ((lp, n, _),) = continuation_logprobs(model, [(prefix, causal, cont)], max_len=20)
    # 30 + 3 + 3 inputs -> the last 20: 16 prefix tokens dropped from its left
    assert truncate(prefix, causal, cont, 20) == (prefix[16:], causal)
    assert lp == pytest.approx(reference(model, prefix[16:], causal, cont)[0], rel=LOGPROB_RTOL) and n == 4
    # past the prefix, the causal part loses its left too; the continuation is never cut
    assert truncate([1, 2], [START, 8, 9], cont, 5) == ([], [8, 9])  # 8 inputs, 3 dropped
    with pytest.raises(ValueError, match="continuation of 4 tokens"):
        truncate([], [START], cont, 3)


def test_empty_continuation_and_buckets():
    model = tiny("gated_ssm")
    assert continuation_logprobs(model, [([5], [START], [])]) == [(0.0, 0, True)]
    assert [bucket(n) for n in (1, 16, 17, 33, 64, 65, 129)] == [16, 16, 32, 64, 64, 128, 192]
    assert split_trailing_spaces("Question: why? Answer: ", "because") == ("Question: why? Answer:", " because")
    assert split_trailing_spaces("a\n", "b") == ("a\n", "b")
