"""The Birdie language models (ssmlm.models.lm and its blocks): scans, packing, decoding, leakage, Hawk details."""

import functools
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ssmlm.models import build_lm, count_params
from ssmlm.models import lm as lm_family
from ssmlm.models.config import ModelConfig
from ssmlm.models.flops import abstract as flops_abstract
from ssmlm.models.flops import param_counts
from ssmlm.models.hawk import A_RANGE, init_lambda, sqrt_bound_derivative
from ssmlm.models.lm_context import make_context
from ssmlm.models.rules import first_match, path_name
from ssmlm.models.scan import bidirectional_scan, linear_scan

HAS_TRANSFORMER = importlib.util.find_spec("ssmlm.models.transformer_lm") is not None
RECURRENT = ["gated_ssm", "gated_ssm_plus", "hawk"]
ARCHS = [
    *RECURRENT,
    pytest.param(
        "transformer_lm",
        marks=pytest.mark.skipif(not HAS_TRANSFORMER, reason="ssmlm.models.transformer_lm not written yet"),
    ),
]
START = 1


def tiny(arch, bidirectional="alternate", **kw):
    kw = {
        "vocab_size": 50,
        "hidden_size": 16,
        "state_size": 16,
        "num_layers": 2,
        "num_heads": 2,
        "dropout": 0.0,
        "bidirectional": bidirectional,
        **kw,
    }
    return ModelConfig(arch=arch, **kw)


@functools.cache
def model(arch, bidirectional="alternate"):
    return build_lm(tiny(arch, bidirectional), seed=1)


# ---- scans ----


def reference_scan(f, x, reset, reverse):
    f, x = np.asarray(f, np.float64), np.asarray(x, np.float64)
    h, out = np.zeros_like(x[:, 0]), np.zeros_like(x)
    for t in reversed(range(x.shape[1])) if reverse else range(x.shape[1]):
        h = np.where(reset[:, t, None], 0.0, f[:, t]) * h + x[:, t]
        out[:, t] = h
    return out


@pytest.mark.parametrize("impl", ["associative", "sequential"])
@pytest.mark.parametrize("reverse", [False, True])
def test_linear_scan_matches_step_by_step_recurrence(reverse, impl):
    rng = np.random.default_rng(0)
    f = rng.uniform(0.2, 1.0, (2, 13, 5)).astype(np.float32)
    x = rng.normal(size=(2, 13, 5)).astype(np.float32)
    reset = rng.random((2, 13)) < 0.25
    h = linear_scan(jnp.asarray(f, jnp.bfloat16), jnp.asarray(x, jnp.bfloat16), jnp.asarray(reset), reverse, impl)
    assert h.dtype == jnp.float32  # recurrences run in float32 whatever the input dtype
    ref = reference_scan(
        np.asarray(jnp.asarray(f, jnp.bfloat16), np.float32),
        np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32),
        reset,
        reverse,
    )
    np.testing.assert_allclose(np.asarray(h), ref, rtol=1e-5, atol=1e-5)
    h32 = linear_scan(jnp.asarray(f), jnp.asarray(x), jnp.asarray(reset), reverse, impl)
    np.testing.assert_allclose(np.asarray(h32), reference_scan(f, x, reset, reverse), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["associative", "sequential"])
def test_bidirectional_scan_halves(impl):
    rng = np.random.default_rng(1)
    tokens = jnp.zeros((1, 10), jnp.int32)
    seg = jnp.array([[1, 1, 1, 1, 1, 2, 2, 2, 2, 0]])
    types = jnp.array([[1, 1, 3, 3, 3, 1, 1, 1, 3, 0]])
    ctx = make_context(tokens, seg, types)
    f = rng.uniform(0.2, 1.0, (1, 10, 6)).astype(np.float32)
    x = rng.normal(size=(1, 10, 6)).astype(np.float32)
    fwd = reference_scan(f, x, np.asarray(ctx.fwd_reset), False)
    rev = reference_scan(f, x, np.asarray(ctx.rev_reset), True)
    np.testing.assert_allclose(bidirectional_scan(f, x, ctx, False, impl), fwd, rtol=1e-5, atol=1e-5)
    both = np.concatenate([fwd[..., :3], rev[..., 3:]], -1)
    np.testing.assert_allclose(bidirectional_scan(f, x, ctx, True, impl), both, rtol=1e-5, atol=1e-5)
    # causal region: the reverse half holds only its own input
    causal = np.asarray(bidirectional_scan(f, x, ctx, True, impl))[0, 2:5, 3:]
    np.testing.assert_allclose(causal, x[0, 2:5, 3:], rtol=1e-6)


def test_scan_impls_agree_in_value_and_gradient():
    """The two implementations of one recurrence: same states and same gradients (float32 rounding)."""
    rng = np.random.default_rng(3)
    f = jnp.asarray(rng.uniform(0.5, 1.0, (2, 300, 4)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(2, 300, 4)), jnp.float32)
    reset = jnp.asarray(rng.random((2, 300)) < 0.02)
    w = jnp.asarray(rng.normal(size=(2, 300, 4)), jnp.float32)
    grads = {}
    for impl in ("associative", "sequential"):
        loss = lambda f, x, impl=impl: jnp.sum(w * linear_scan(f, x, reset, True, impl))  # noqa: E731
        grads[impl] = jax.grad(loss, argnums=(0, 1))(f, x)
    for a, b in zip(grads["associative"], grads["sequential"], strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


# ---- packing and decoding, every family ----

SAMPLE_A = ([5, 6, 7], [8, 9])  # prefix, then START and the targets fed as inputs
SAMPLE_B = ([10, 11], [12])


def sample_row(prefix, ys):
    tokens = [*prefix, START, *ys]
    types = [1] * len(prefix) + [3] * (1 + len(ys))
    return tokens, types


def packed(samples, length):
    tokens, types, seg, pos = [], [], [], []
    for k, s in enumerate(samples, 1):
        t, ty = sample_row(*s)
        tokens += t
        types += ty
        seg += [k] * len(t)
        pos += list(range(len(t)))
    pad = length - len(tokens)
    return [jnp.array([v + [0] * pad]) for v in (tokens, seg, types, pos)]


@pytest.mark.parametrize("bidirectional", ["alternate", "none"])
@pytest.mark.parametrize("arch", ARCHS)
def test_packed_row_equals_separate_samples(arch, bidirectional):
    m = model(arch, bidirectional)
    for order in ([SAMPLE_A, SAMPLE_B], [SAMPLE_B, SAMPLE_A]):
        tokens, seg, types, pos = packed(order, 12)
        logits = m(tokens, seg, types, pos)
        start = 0
        for s in order:
            t, ty = sample_row(*s)
            alone = m(jnp.array([t]), token_types=jnp.array([ty]))
            np.testing.assert_allclose(logits[0, start : start + len(t)], alone[0], atol=1e-4, rtol=1e-4)
            start += len(t)


@pytest.mark.parametrize("bidirectional", ["alternate", "none"])
@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_then_step_equals_full_forward(arch, bidirectional):
    m = model(arch, bidirectional)
    p, k = 4, 5
    rng = np.random.default_rng(2)
    tokens = rng.integers(2, 50, (2, p + 1 + k))
    tokens[:, p] = START
    types = np.array([[1] * p + [3] * (1 + k)] * 2)
    full = m(jnp.asarray(tokens), token_types=jnp.asarray(types))
    cache = m.init_cache(2, p + 1 + k)
    logits, cache = m.prefill(jnp.asarray(tokens[:, : p + 1]), jnp.asarray(types[:, : p + 1]), cache)
    np.testing.assert_allclose(logits, full[:, : p + 1], atol=1e-4, rtol=1e-4)
    decoded = [logits[:, -1]]
    for j in range(p + 1, p + 1 + k):
        step_logits, cache = m.step(jnp.asarray(tokens[:, j]), cache)
        decoded.append(step_logits)
    np.testing.assert_allclose(jnp.stack(decoded, 1), full[:, p:], atol=1e-4, rtol=1e-4)


# ---- leakage, by the Jacobian of the logits with respect to the input embeddings ----


def dependence(m, tokens, seg, types, pos):
    """(L, L) bool: [t, s] = the logits at t depend on the input at s."""
    e0 = m.embeddings(tokens)[0]
    jac = jax.jacrev(lambda e: m(tokens, seg, types, pos, embedded=e[None])[0])(e0)  # (L, V, L, d)
    return np.asarray(jnp.abs(jac).sum((1, 3)) > 0)


@pytest.mark.parametrize("bidirectional", ["alternate", "none"])
@pytest.mark.parametrize("arch", ARCHS)
def test_no_leakage(arch, bidirectional):
    tokens, seg, types, pos = packed([([5, 6, 7], [8, 9]), ([10, 11, 12], [13])], 12)
    dep = dependence(model(arch, bidirectional), tokens, seg, types, pos)
    seg, types = np.asarray(seg[0]), np.asarray(types[0])
    idx = np.arange(len(seg))
    start = np.array([idx[(seg == s) & (types == 3)].min() if s else -1 for s in seg])  # START of t's sample
    same = (seg[:, None] == seg[None, :]) & (seg[:, None] > 0)
    causal = idx[None, :] <= idx[:, None]
    if bidirectional == "none":
        allowed = same & causal
    else:  # prefix positions see their whole prefix and START, nothing after it
        allowed = same & (causal | ((types[:, None] == 1) & (idx[None, :] <= start[:, None])))
        assert dep[0, 2] and dep[6, 8], "a bidirectional prefix should see later prefix tokens"
    real = seg > 0
    leaks = dep & ~allowed & real[:, None]
    assert not leaks.any(), f"position -> inputs it must not see: {np.argwhere(leaks).tolist()}"
    assert (dep | ~(same & causal))[real].all(), "every position should depend on its causal past"


# ---- Hawk, Gated SSM details, parameter counts and rules ----


def test_sqrt_bound_derivative_caps_the_gradient():
    assert float(sqrt_bound_derivative(4.0)) == 2.0
    assert float(jax.grad(sqrt_bound_derivative)(4.0)) == pytest.approx(0.25)
    assert not np.isfinite(float(jax.grad(jnp.sqrt)(0.0)))
    g0 = float(jax.grad(sqrt_bound_derivative)(0.0))
    assert g0 == pytest.approx(1000.0)


def test_hawk_decay_init_range():
    c = 8.0
    lam = init_lambda(jax.random.key(0), (20000,), c=c)
    a = np.asarray(jnp.exp(-c * jax.nn.softplus(lam)))
    assert a.min() >= A_RANGE[0] - 1e-5 and a.max() <= A_RANGE[1] + 1e-5
    assert a.mean() == pytest.approx(sum(A_RANGE) / 2, abs=2e-3)  # uniform
    assert np.histogram(a, 4, A_RANGE)[0].min() > 20000 / 4 * 0.9
    block = model("hawk").blocks[0]
    a = np.asarray(jnp.exp(-c * jax.nn.softplus(block.rg_lru.a_param[...])))
    assert a.min() >= A_RANGE[0] - 1e-5 and a.max() <= A_RANGE[1] + 1e-5


def test_gated_ssm_layer_parameter_count():
    d, n = 16, 24
    cfg = tiny("gated_ssm", hidden_size=d, state_size=n)
    block = lm_family.block_class("gated_ssm")(cfg, True, rngs=nnx.Rngs(0))
    assert count_params(block) == 5 * d * n + 4 * n + d + d  # + the norm's scale
    paper = lm_family.param_count_formula(
        ModelConfig(arch="gated_ssm", vocab_size=32000, hidden_size=2048, state_size=2560, num_layers=48)
    )
    assert 1.25e9 < paper["non_embedding"] < 1.27e9  # docs/faithfulness.md#birdie-models: ≈1.26B without embeddings


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("arch", [*RECURRENT, "transformer_lm"])
def test_param_count_formula(arch, tie):
    cfg = tiny(arch, state_size=24, num_layers=3, tie_embeddings=tie)
    abstract = flops_abstract(lambda: build_lm(cfg))
    formula = lm_family.param_count_formula(cfg)
    assert count_params(abstract) == formula["total"]
    assert param_counts(abstract)["embeddings"] == formula["embeddings"]  # what the FLOP count leaves out


def decays(arch):
    m = model(arch)
    rules = lm_family.param_rules(m.cfg)
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(m, nnx.Param))[0]
    return {path_name(p): rules[first_match(rules, path_name(p))].weight_decay for p, _ in leaves}


def test_param_rules_no_decay():
    ssm = decays("gated_ssm")
    assert not ssm["blocks/0/w_f/kernel"] and not ssm["blocks/1/w_f/bias"]
    assert not ssm["blocks/0/w_i/bias"] and not ssm["blocks/0/norm/scale"] and not ssm["final_norm/scale"]
    assert ssm["blocks/0/w_i/kernel"] and ssm["blocks/0/w_out/kernel"] and ssm["embeddings/embedding"]
    plus = decays("gated_ssm_plus")
    assert not plus["blocks/0/w_f/kernel"] and not plus["blocks/0/conv/bias"] and plus["blocks/0/conv/kernel"]
    assert plus["blocks/0/w_z_gate/kernel"] and plus["blocks/0/w_out_gate/kernel"] and not plus["blocks/0/w_f/bias"]
    hawk = decays("hawk")
    for name in [
        "rg_lru/a_param",
        "rg_lru/w_a/kernel",
        "rg_lru/w_x/kernel",
        "rg_lru/w_a/bias",
        "conv/bias",
        "norm/scale",
        "mlp/norm/scale",
    ]:
        assert not hawk[f"blocks/1/{name}"], name
    for name in ["w_gate/kernel", "w_input/kernel", "w_output/kernel", "conv/kernel", "mlp/w_up/kernel"]:
        assert hawk[f"blocks/1/{name}"], name


@pytest.mark.parametrize("arch", RECURRENT)
def test_bfloat16_compute_keeps_float32_recurrences(arch):
    m = build_lm(tiny(arch, compute_dtype="bfloat16"))
    tokens, seg, types, pos = packed([SAMPLE_A, SAMPLE_B], 12)
    logits = m(tokens, seg, types, pos)
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
    cache = m.init_cache(1, 8)
    _, cache = m.prefill(tokens[:, :4], types[:, :4], cache)
    step_logits, cache = m.step(tokens[:, 4], cache)
    assert np.isfinite(np.asarray(step_logits)).all()
    assert all(c["h"].dtype == jnp.float32 for c in cache["layers"])


def test_odd_state_refused_in_bidirectional_layer():
    with pytest.raises(ValueError, match="odd"):
        build_lm(tiny("gated_ssm", state_size=15))
    assert count_params(build_lm(tiny("gated_ssm", "none", state_size=15)))


@pytest.mark.slow  # 50-100 s on 2 busy cores: out of the default suite's 15 minutes; .ci/run runs it
def test_remat_and_tied_head_compute_the_same_function():
    tokens, seg, types, pos = packed([SAMPLE_A, SAMPLE_B], 12)
    plain = build_lm(tiny("hawk", tie_embeddings=True))
    remat = build_lm(tiny("hawk", tie_embeddings=True, remat=True))
    np.testing.assert_allclose(remat(tokens, seg, types, pos), plain(tokens, seg, types, pos), atol=1e-6)
    assert plain.head is None

    def loss(m):
        return m(tokens, seg, types, pos).mean()

    g_plain, g_remat = nnx.grad(loss)(plain), nnx.grad(loss)(remat)
    for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_remat), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
        assert np.isfinite(np.asarray(a)).all()


def test_sqrt_bound_derivative_vectorised_and_other_caps():
    x = jnp.array([0.0, 1e-12, 0.25, 1.0])
    g = jax.grad(lambda x: sqrt_bound_derivative(x, 10.0).sum())(x)
    np.testing.assert_allclose(g, [10.0, 10.0, 1.0, 0.5], rtol=1e-6)
