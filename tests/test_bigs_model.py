"""The BiGS encoder and its heads (ssmlm.models): parameter counts, shapes, directionality, and a float64
numpy re-implementation of the gated layer / MLM model written from docs/faithfulness.md#bigs-layer, #bigs-s4d
and #bigs-heads.

Full-size counts are checked without allocating (nnx.eval_shape); everything that runs uses tiny sizes.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.special import erf

from ssmlm.models import build_classifier, build_mlm, count_params, with_vocab
from ssmlm.models.bigs import GatedLayer, flip, param_count_formula
from ssmlm.models.heads import Pooler
from ssmlm.recipe import ModelConfig

V, H, D3, LMAX, NSSM = 50, 16, 48, 16, 8


def cfg_small(**kw):
    # The official layout (no final LayerNorm, padding not masked): what the numpy references below read.
    base = dict(
        vocab_size=V,
        hidden_size=H,
        num_layers=1,
        intermediate_size=D3,
        max_seq_length=LMAX,
        num_ssm=NSSM,
        final_norm=False,
        mask_padding=False,
    )
    base.update(kw)
    return ModelConfig(**base)


def arr(p):
    return np.asarray(p[...], np.float64)


_JIT: dict = {}


def jitted(module, fn, key):
    """fn(module, *args) compiled once per ``key`` and reused for every module with the same structure.

    (nnx graphdefs of two separately built layers never compare equal, because each holds its own
    functools.partial activation, so nnx.jit would recompile for every new model.) Callers pass a key that
    identifies the config, so the cached graphdef has the same activation as ``module``."""
    graphdef, state = nnx.split(module)
    if key not in _JIT:
        _JIT[key] = jax.jit(lambda st, *a: fn(nnx.merge(graphdef, st), *a))
    compiled = _JIT[key]
    return lambda *a: compiled(state, *a)


def shape_count(make) -> tuple[int, int]:
    """(number of parameters, number of leaves) of a module built abstractly, without allocating."""
    from ssmlm.models.flops import abstract

    leaves = jax.tree.leaves(nnx.state(abstract(make), nnx.Param))
    return sum(math.prod(x.shape) for x in leaves), len(leaves)


def test_abstract_builds_leave_jax_tracer_errors_as_they_were():
    """The abstract build silences jax's costly tracer-origin messages only while it runs, also when it fails."""
    from jax._src.interpreters import partial_eval as pe

    from ssmlm.models.flops import abstract

    before = pe.DynamicJaxprTracer._origin_msg
    cfg = ModelConfig(vocab_size=V, num_layers=2, hidden_size=16, intermediate_size=32, max_seq_length=8, num_ssm=4)
    assert shape_count(lambda: build_mlm(cfg))[0] == param_count_formula(cfg)["mlm_total"]
    assert pe.DynamicJaxprTracer._origin_msg is before

    def broken():
        raise ValueError("no model")

    with pytest.raises(ValueError, match="no model"):
        abstract(broken)
    assert pe.DynamicJaxprTracer._origin_msg is before


# ----------------------------------------------------------------------------- independent numpy reference


def gelu_exact(x):
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def layer_norm(x, scale, bias, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def ref_ssm(ssm, u):
    """y_t = Σ_{j≤t} K_j u_{t-j} + D u_t with K of docs/faithfulness.md#bigs-s4d (all modes summed, real part,
    Re A clipped)."""
    a = np.minimum(arr(ssm.A_re), -1e-4) + 1j * arr(ssm.A_im)
    c = arr(ssm.C)
    c = c[:, 0] + 1j * c[:, 1]
    step = float(np.exp(arr(ssm.log_step)[0]))
    length = u.shape[1]
    k = np.real((c * (np.exp(step * a) - 1) / a) @ np.exp(step * a[:, None] * np.arange(length)[None]))
    toeplitz = np.array([[k[t - s] if s <= t else 0.0 for s in range(length)] for t in range(length)])
    return np.einsum("ts,bsh->bth", toeplitz, u) + arr(ssm.D)[0] * u


def ref_dense(lin, x):
    return x @ arr(lin.kernel) + arr(lin.bias)


def ref_layer(layer, h, gelu):
    """docs/faithfulness.md#bigs-layer, pre-LN gated block."""
    x = layer_norm(h, arr(layer.norm.scale), arr(layer.norm.bias))
    v = gelu(ref_dense(layer.w_v, x))
    f = gelu(ref_dense(layer.w_f, x))
    b = gelu(ref_dense(layer.w_b, x[:, ::-1]))
    u1 = ref_dense(layer.w_u1, ref_ssm(layer.ssm_f, f))
    u2 = ref_dense(layer.w_u2, ref_ssm(layer.ssm_b, b))
    u = gelu(ref_dense(layer.w_u, u1 * u2[:, ::-1]))
    return h + ref_dense(layer.w_o, u * v)


def ref_mlm(model, ids, token_types, layer_gelu):
    enc = model.encoder
    e = enc.embeddings
    length = ids.shape[1]
    h = arr(e.word.embedding)[ids] + arr(e.token_type.embedding)[token_types] + arr(e.position.embedding)[:length]
    h = layer_norm(h, arr(e.norm.scale), arr(e.norm.bias))
    for layer in enc.layers:
        h = ref_layer(layer, h, layer_gelu)
    head = model.mlm_head
    t = layer_norm(gelu_exact(ref_dense(head.transform, h)), arr(head.norm.scale), arr(head.norm.bias))
    return t @ arr(e.word.embedding).T + arr(head.bias)


CFG = cfg_small(num_layers=1, initializer_range=0.2)  # the config most tests share (one compile each)
LAYER_CFG = cfg_small(initializer_range=0.3)


def logits(model, cfg, ids, positions=None, token_type_ids=None, rng=None):
    """model(ids, ...) compiled once per config and per kind of call (token types are always passed)."""
    tt = jnp.zeros_like(ids) if token_type_ids is None else token_type_ids
    if positions is not None:
        fn = jitted(model, lambda m, i, t, p: m(i, positions=p, token_type_ids=t), ("mlm-pos", cfg))
        return np.asarray(fn(ids, tt, positions))
    if rng is not None:
        fn = jitted(model, lambda m, i, t, r: m(i, token_type_ids=t, rng=r), ("mlm-rng", cfg))
        return np.asarray(fn(ids, tt, rng))
    return np.asarray(jitted(model, lambda m, i, t: m(i, token_type_ids=t), ("mlm", cfg))(ids, tt))


def layer_out(layer, cfg, x):
    return np.asarray(jitted(layer, lambda lyr, z: lyr(z), ("layer", cfg))(x))


def layer_jacobian_blocks(layer, cfg, length=8, seed=0):
    """|d out[i] / d in[j]| summed over channels for a random (1, L, H) input: an (L_out, L_in) matrix."""
    x = jax.random.normal(jax.random.key(seed), (1, length, H))
    jac = jitted(layer, lambda lyr, z: jax.jacobian(lambda y: lyr(y))(z), ("jac", cfg))(x)
    return np.abs(np.asarray(jac)[0, :, :, 0, :, :]).sum(axis=(1, 3))


@pytest.fixture(scope="module")
def mlm():
    return build_mlm(CFG, seed=0)


def random_ids(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, shape), jnp.int32)


# ----------------------------------------------------------------------------- parameter counts


def test_bigs_large_parameter_count_without_allocating():
    """23L, H1024, I3072, L128, vocab 30522: 346,314,134 parameters in 608 leaves in the official
    layout (final_norm off, one module per layer); ssmlm's default final LayerNorm adds 2·1024 in 2 leaves.
    The scanned layout holds the same parameters in 26 stacked leaves for all layers."""
    cfg = ModelConfig(
        vocab_size=30522,
        num_layers=23,
        hidden_size=1024,
        intermediate_size=3072,
        max_seq_length=128,
        num_ssm=64,
        final_norm=False,
        scan_layers=False,
    )
    assert param_count_formula(cfg) == {
        "per_layer": 13_645_316,
        "encoder": 313_842_268,
        "embeddings": 31_389_696,
        "mlm_total": 346_314_134,
    }
    n, leaves = shape_count(lambda: build_mlm(cfg))
    assert n == 346_314_134
    assert leaves == 608  # 26 per layer + 5 embedding + 5 head
    n, leaves = shape_count(lambda: build_mlm(dataclasses.replace(cfg, final_norm=True)))
    assert (n, leaves) == (346_314_134 + 2 * 1024, 610)
    assert param_count_formula(dataclasses.replace(cfg, final_norm=True))["mlm_total"] == n
    assert shape_count(lambda: build_mlm(dataclasses.replace(cfg, scan_layers=True))) == (346_314_134, 26 + 10)


def test_bigs_12_layer_parameter_count_without_allocating():
    """12L, H768, I3072, L128: 137,555,562. Built abstractly at 2 layers (tracing 12 is slow), the
    per-layer difference and the 2-layer total must fit the table's per-layer and embedding figures."""
    cfg = ModelConfig(
        vocab_size=30522, num_layers=12, hidden_size=768, intermediate_size=3072, final_norm=False, scan_layers=False
    )  # leaf counts of the official layout
    assert param_count_formula(cfg) == {
        "per_layer": 9_449_220,
        "encoder": 113_390_640,
        "embeddings": 23_542_272,
        "mlm_total": 137_555_562,
    }
    one = shape_count(lambda: build_mlm(dataclasses.replace(cfg, num_layers=1)))
    two = shape_count(lambda: build_mlm(dataclasses.replace(cfg, num_layers=2)))
    per_layer = two[0] - one[0]
    assert per_layer == 9_449_220 and two[1] - one[1] == 26
    head = 768 * 768 + 768 + 2 * 768 + 30522
    assert one[0] == 23_542_272 + per_layer + head
    assert one[0] + 11 * per_layer == 137_555_562


def test_full_size_per_layer_breakdown():
    cfg = ModelConfig(vocab_size=30522)
    abstract = nnx.eval_shape(lambda: GatedLayer(cfg, rngs=nnx.Rngs(0)))
    sizes = {
        name: sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(getattr(abstract, name), nnx.Param)))
        for name in ["norm", "w_v", "w_f", "w_b", "w_u1", "w_u2", "w_u", "w_o", "ssm_f", "ssm_b"]
    }
    assert sizes == {
        "norm": 2048,
        "w_v": 3_148_800,
        "w_f": 1_049_600,
        "w_b": 1_049_600,
        "w_u1": 1_049_600,
        "w_u2": 1_049_600,
        "w_u": 3_148_800,
        "w_o": 3_146_752,
        "ssm_f": 258,
        "ssm_b": 258,
    }
    assert sum(sizes.values()) == 13_645_316


def test_longer_position_tables_add_only_position_rows():
    totals = {512: 346_707_350, 1024: 347_231_638, 4096: 350_377_366}
    for length, total in totals.items():
        assert (
            param_count_formula(ModelConfig(vocab_size=30522, max_seq_length=length, final_norm=False))["mlm_total"]
            == total
        )
    # built (abstractly, one layer to keep it quick): only the position table grows
    one = {
        n: shape_count(lambda n=n: build_mlm(ModelConfig(vocab_size=30522, num_layers=1, max_seq_length=n)))[0]
        for n in (128, 4096)
    }
    assert one[4096] - one[128] == (4096 - 128) * 1024 == totals[4096] - 346_314_134


def test_small_model_count_matches_hand_formula(mlm):
    ln, ssm = 2 * H, 4 * NSSM + 2
    per_layer = ln + (H * D3 + D3) + 4 * (H * H + H) + (H * D3 + D3) + (D3 * H + H) + 2 * ssm
    embeddings = V * H + LMAX * H + 2 * H + 2 * H
    head = H * H + H + 2 * H + V
    assert count_params(mlm) == CFG.num_layers * per_layer + embeddings + head == param_count_formula(CFG)["mlm_total"]
    # the decoder is tied: no (H, V) matrix anywhere
    shapes = [x.shape for x in jax.tree.leaves(nnx.state(mlm, nnx.Param))]
    assert (H, V) not in shapes and shapes.count((V, H)) == 1


def test_classifier_count_and_shapes():
    model = build_classifier(CFG, num_labels=3)
    pc = param_count_formula(CFG)
    assert count_params(model) == pc["encoder"] + pc["embeddings"] + (H * H + H) + (H * 3 + 3)
    ids = random_ids((2, 10))
    mask = jnp.ones((2, 10), jnp.int32)
    out = nnx.eval_shape(lambda m: m(ids, mask), model)
    assert out.shape == (2, 3) and out.dtype == jnp.float32


def test_with_vocab():
    cfg = ModelConfig(hidden_size=16)
    assert with_vocab(cfg, 77).vocab_size == 77
    same = with_vocab(with_vocab(cfg, 77), 77)
    assert same.vocab_size == 77 and same.hidden_size == 16


# ----------------------------------------------------------------------------- shapes and forward


def test_output_shapes_and_positions(mlm):
    ids = random_ids((2, 10))
    full = logits(mlm, CFG, ids)
    assert full.shape == (2, 10, V) and full.dtype == np.float32
    pos = jnp.array([[1, 4, 0], [2, 3, 9]], jnp.int32)
    sel = logits(mlm, CFG, ids, positions=pos)
    assert sel.shape == (2, 3, V)
    # logits at the selected positions are those of the full output (the head is position-wise)
    np.testing.assert_allclose(sel, np.take_along_axis(full, np.asarray(pos)[..., None], axis=1), atol=1e-5)


def test_shorter_inputs_and_too_long_input(mlm):
    assert nnx.eval_shape(lambda m: m(random_ids((1, 5))), mlm).shape == (1, 5, V)
    assert nnx.eval_shape(lambda m: m(random_ids((1, LMAX))), mlm).shape == (1, LMAX, V)
    with pytest.raises(ValueError, match="max_seq_length"):
        nnx.eval_shape(lambda m: m(random_ids((1, LMAX + 1))), mlm)


def test_encoder_hidden_shape_and_kernels(mlm):
    ids = random_ids((2, 10))
    assert jitted(mlm, lambda m, i: m.encoder(i), ("enc", CFG))(ids).shape == (2, 10, H)
    fwd, bwd = jitted(mlm, lambda m: m.encoder.kernels(10), ("kernels", CFG))()
    assert fwd.shape == (CFG.num_layers, 10) and bwd.shape == (CFG.num_layers, 10)
    layer = mlm.encoder.layers[-1]
    a = np.minimum(arr(layer.ssm_f.A_re), -1e-4) + 1j * arr(layer.ssm_f.A_im)
    c = arr(layer.ssm_f.C) @ np.array([1, 1j])
    step = float(np.exp(arr(layer.ssm_f.log_step)[0]))
    want = np.real((c * (np.exp(step * a) - 1) / a) @ np.exp(step * a[:, None] * np.arange(10)))
    np.testing.assert_allclose(fwd[-1], want, rtol=1e-4, atol=1e-5)
    assert np.abs(np.asarray(fwd) - np.asarray(bwd)).max() > 1e-3  # independent parameters per direction


@pytest.mark.parametrize("layer_gelu,num_layers", [("exact", 1), ("tanh", 2)])
def test_mlm_matches_numpy_reference(layer_gelu, num_layers):
    """Whole model (embeddings, gated layers, tied MLM head) against the float64 re-implementation.

    The MLM head always uses the exact GELU (official code); cfg.gelu only affects the gated layers."""
    cfg = dataclasses.replace(CFG, gelu=layer_gelu, num_layers=num_layers)
    model = build_mlm(cfg, seed=3)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, V, (2, 10))
    tt = rng.integers(0, 2, (2, 10))
    got = logits(model, cfg, jnp.asarray(ids), token_type_ids=jnp.asarray(tt))
    act = gelu_tanh if layer_gelu == "tanh" else gelu_exact
    want = ref_mlm(model, ids, tt, act)
    # float32 vs float64 differ by ~1e-6 here; swapping any GELU for the other variant moves logits by ~1e-4
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    other = ref_mlm(model, ids, tt, gelu_exact if layer_gelu == "tanh" else gelu_tanh)
    assert np.abs(got - other).max() > 2e-5 * np.abs(want).max()


def test_gated_layer_gelu_choice_is_applied():
    """A layer built with gelu='tanh' matches the tanh reference and not the exact one (and vice versa)."""
    x = np.random.default_rng(0).normal(size=(2, 10, H))
    deltas = {}
    for kind in ["exact", "tanh"]:
        cfg = dataclasses.replace(LAYER_CFG, gelu=kind)
        layer = GatedLayer(cfg, rngs=nnx.Rngs(params=7))
        out = layer_out(layer, cfg, jnp.asarray(x, jnp.float32)).astype(np.float64) - x
        o_exact = ref_layer(layer, x, gelu_exact) - x
        o_tanh = ref_layer(layer, x, gelu_tanh) - x
        scale = np.abs(o_exact).max()
        deltas[kind] = (np.abs(out - o_exact).max() / scale, np.abs(out - o_tanh).max() / scale)
    # exact layer: close to the exact reference, measurably off the tanh one; tanh layer the other way round
    assert deltas["exact"][0] < 2e-5 and deltas["exact"][1] > 1e-4, deltas
    assert deltas["tanh"][1] < 2e-5 and deltas["tanh"][0] > 1e-4, deltas
    # GELU(1): 0.8411920 (tanh) vs 0.8413447 (exact) — the reference activations themselves
    assert gelu_tanh(1.0) == pytest.approx(0.8411920, abs=1e-7)
    assert gelu_exact(1.0) == pytest.approx(0.8413447, abs=1e-7)


def test_token_types_change_output(mlm):
    ids = random_ids((2, 10))
    a = logits(mlm, CFG, ids)
    b = logits(mlm, CFG, ids, token_type_ids=jnp.ones_like(ids))
    assert np.abs(a - b).max() > 1e-3
    # the type-1 row of the table is what changed: the embedding sums differ by exactly E_type[1] - E_type[0]
    emb = mlm.encoder.embeddings
    diff = arr(emb.token_type.embedding)[1] - arr(emb.token_type.embedding)[0]
    assert np.abs(diff).max() > 1e-3


def test_dropout_only_with_rng(mlm):
    ids = random_ids((2, 10))
    a, b = logits(mlm, CFG, ids), logits(mlm, CFG, ids)
    np.testing.assert_array_equal(a, b)
    c = logits(mlm, CFG, ids, rng=jax.random.key(0))
    d = logits(mlm, CFG, ids, rng=jax.random.key(0))
    e = logits(mlm, CFG, ids, rng=jax.random.key(1))
    np.testing.assert_array_equal(c, d)
    assert np.abs(a - c).max() > 1e-3 and np.abs(c - e).max() > 1e-3


def test_deterministic_for_fixed_seed():
    ids = random_ids((2, 10))
    m1, m2, m3 = build_mlm(CFG, seed=5), build_mlm(CFG, seed=5), build_mlm(CFG, seed=6)
    p1, p2, p3 = (jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (m1, m2, m3))
    assert all(np.array_equal(a, b) for a, b in zip(p1, p2, strict=True))
    assert any(not np.array_equal(a, b) for a, b in zip(p1, p3, strict=True))
    np.testing.assert_array_equal(logits(m1, CFG, ids), logits(m2, CFG, ids))
    assert np.abs(logits(m1, CFG, ids) - logits(m3, CFG, ids)).max() > 1e-4


def test_initialisation_statistics():
    model = build_mlm(dataclasses.replace(CFG, initializer_range=0.02), seed=0)
    layers = model.encoder.layers
    w = np.concatenate(
        [arr(getattr(lyr, n).kernel).ravel() for lyr in layers for n in ("w_v", "w_u", "w_o")]
        + [
            arr(model.encoder.embeddings.word.embedding).ravel(),
            arr(model.encoder.embeddings.position.embedding).ravel(),
        ]
    )
    assert np.std(w) == pytest.approx(0.02, rel=0.05)  # N(0, 0.02²), as the official code
    assert abs(np.mean(w)) < 0.002
    assert np.all(arr(layers[0].w_v.bias) == 0) and np.all(arr(layers[0].norm.scale) == 1)
    np.testing.assert_array_equal(arr(model.mlm_head.bias), 0.0)
    # MLM transform: lecun normal, std ≈ 1/sqrt(fan_in) (truncated normal)
    assert np.std(arr(model.mlm_head.transform.kernel)) == pytest.approx(1 / math.sqrt(H), rel=0.2)


# ----------------------------------------------------------------------------- direction and structure


def test_gated_layer_is_bidirectional():
    layer = GatedLayer(LAYER_CFG, rngs=nnx.Rngs(params=0))
    mag = layer_jacobian_blocks(layer, LAYER_CFG)
    off = ~np.eye(8, dtype=bool)
    # every output position depends on every other input position, before and after it
    assert np.all(mag[off] > 1e-4 * mag[off].max())


def test_forward_stream_alone_is_causal_backward_alone_anticausal():
    """Make one stream constant (its output projection kernel 0, bias 1): the layer becomes one-directional.

    This checks the wiring: U1 must see 0..t and flip(U2) must see t..L-1."""
    length = 8
    upper = np.triu(np.ones((length, length), bool), 1)  # in > out
    for kill, forbidden in [("w_u2", upper), ("w_u1", upper.T)]:
        layer = GatedLayer(LAYER_CFG, rngs=nnx.Rngs(params=0))
        lin = getattr(layer, kill)
        lin.kernel[...] = jnp.zeros_like(lin.kernel[...])
        lin.bias[...] = jnp.ones_like(lin.bias[...])
        mag = layer_jacobian_blocks(layer, LAYER_CFG, length)
        scale = mag.max()
        assert np.all(mag[forbidden] < 1e-6 * scale), f"{kill}=const: dependence leaks across the wrong side"
        allowed = ~forbidden & ~np.eye(length, dtype=bool)
        assert np.all(mag[allowed] > 1e-5 * scale)


def tie_backward_to_forward(layer):
    for name in ["A_re", "A_im", "C", "D", "log_step"]:
        getattr(layer.ssm_b, name)[...] = jnp.array(getattr(layer.ssm_f, name)[...])
    for src, dst in [("w_f", "w_b"), ("w_u1", "w_u2")]:
        s, d = getattr(layer, src), getattr(layer, dst)
        s.bias[...] = s.bias[...] + 0.1  # non-zero (tied) biases make the check stricter
        d.kernel[...] = jnp.array(s.kernel[...])
        d.bias[...] = jnp.array(s.bias[...])


def test_flip_equivariance_with_tied_directions():
    x = jax.random.normal(jax.random.key(1), (2, 10, H))
    layer = GatedLayer(LAYER_CFG, rngs=nnx.Rngs(params=2))
    untied_gap = np.abs(layer_out(layer, LAYER_CFG, flip(x)) - np.asarray(flip(layer_out(layer, LAYER_CFG, x)))).max()
    tie_backward_to_forward(layer)
    out, out_flipped = layer_out(layer, LAYER_CFG, x), layer_out(layer, LAYER_CFG, flip(x))
    scale = np.abs(out - np.asarray(x)).max()
    np.testing.assert_allclose(out_flipped, np.asarray(flip(jnp.asarray(out))), atol=1e-5 * max(scale, 1.0))
    assert untied_gap > 1e-3 * scale  # with independent parameters the symmetry does not hold


def test_zero_output_projection_is_identity():
    model = build_mlm(CFG, seed=4)
    assert len(model.encoder.layers) == CFG.num_layers
    x = jax.random.normal(jax.random.key(2), (2, 10, H))
    layer = model.encoder.layers[0]
    assert np.abs(layer_out(layer, CFG, x) - np.asarray(x)).max() > 1e-3
    for i, lyr in enumerate(model.encoder.layers):
        lyr.w_o.kernel[...] = jnp.zeros_like(lyr.w_o.kernel[...])
        lyr.w_o.bias[...] = jnp.zeros_like(lyr.w_o.bias[...])
        model.encoder.layers[i] = lyr  # a copy in the scanned layout: write it back
    layer = model.encoder.layers[0]
    np.testing.assert_array_equal(layer_out(layer, CFG, x), np.asarray(x))
    # the whole stack then returns the embedding output (no final LayerNorm)
    ids = random_ids((2, 10))
    enc = jitted(model, lambda m, i: m.encoder(i), ("enc", CFG))(ids)
    emb = jitted(model, lambda m, i: m.encoder.embeddings(i, jnp.zeros_like(i), None), ("emb", CFG))(ids)
    np.testing.assert_array_equal(np.asarray(enc), np.asarray(emb))


# ----------------------------------------------------------------------------- pooler


@pytest.mark.parametrize("pooler", ["non_padding_mean", "mean"])
def test_pooler_masking(pooler):
    pool = Pooler(dataclasses.replace(CFG, pooler=pooler), rngs=nnx.Rngs(params=0))
    h = jax.random.normal(jax.random.key(0), (2, 6, H))
    mask = jnp.array([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    got = np.asarray(jax.jit(lambda a, b: pool(a, b))(h, mask))
    hn = np.asarray(h, np.float64)
    if pooler == "mean":
        pooled = hn.mean(1)
    else:
        pooled = np.stack([hn[0, :3].mean(0), hn[1].mean(0)])
    want = np.tanh(pooled @ arr(pool.dense.kernel) + arr(pool.dense.bias))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- residual scale


def test_gate_product_grows_quadratically_and_final_norm_bounds_what_heads_read():
    """The measured failure: after MLM pretraining one layer's branch reached rms 190 (the others ~1), because
    U1 ⊗ Flip(U2) multiplies two linear SSM read-outs, so scaling both by c scales the branch by ~c². The MLM
    head normalises, so MLM never bounds it; the pooler read the raw stream and its tanh saturated. With
    final_norm (default) the heads read a LayerNorm'd stream whatever the branch scale; without it (official)
    the stream the pooler reads carries the growth."""
    ids = jnp.asarray(np.random.default_rng(0).integers(5, V, (2, LMAX)), jnp.int32)
    out = {}
    for final_norm in (True, False):
        model = build_classifier(cfg_small(num_layers=2, final_norm=final_norm, initializer_range=0.2), 2)
        for c in (1.0, 10.0):
            layer = model.encoder.layers[1]
            for w in (layer.w_u1, layer.w_u2):
                w.kernel[...] = w.kernel[...] * (c if c > 1 else 1.0)
            model.encoder.layers[1] = layer  # a copy in the scanned layout: write it back
            x = model.encoder.embeddings(ids, jnp.zeros_like(ids), None)
            branch = layer(model.encoder.layers[0](x)) - model.encoder.layers[0](x)
            h = model.encoder(ids)
            out[final_norm, c] = (float(jnp.sqrt((branch**2).mean())), float(jnp.sqrt((h**2).mean())))
    (b1, _), (b10, _) = out[False, 1.0], out[False, 10.0]
    assert 30 < b10 / b1 < 300  # ~c² = 100 (GELU is ~x/2 near 0 and ~x for large x, so a bit more)
    assert out[False, 10.0][1] > 3 * out[False, 1.0][1]  # official: the heads see the growth
    for c in (1.0, 10.0):  # final norm: the heads see unit scale
        assert 0.5 < out[True, c][1] < 2.0


def test_gate_norm_removes_the_quadratic_path():
    """model.gate_norm normalises U1 ⊗ Flip(U2) before W_u: scaling both SSM read-outs by 10 leaves the branch
    output as it was (LayerNorm is scale-invariant), where the paper's block grows ~100x (test above)."""
    layer = GatedLayer(cfg_small(gate_norm=True, initializer_range=0.2), rngs=nnx.Rngs(params=0))
    x = jax.random.normal(jax.random.key(1), (2, LMAX, H))
    before = layer(x) - x
    for w in (layer.w_u1, layer.w_u2):
        w.kernel[...] = w.kernel[...] * 10.0
        w.bias[...] = w.bias[...] * 10.0
    after = layer(x) - x
    np.testing.assert_allclose(np.asarray(after), np.asarray(before), rtol=1e-3, atol=1e-5)
    plain = cfg_small(initializer_range=0.2)
    extra = count_params(build_mlm(dataclasses.replace(plain, gate_norm=True))) - count_params(build_mlm(plain))
    assert (
        extra
        == 2 * H * plain.num_layers
        == param_count_formula(dataclasses.replace(plain, gate_norm=True))["mlm_total"]
        - param_count_formula(plain)["mlm_total"]
    )


@pytest.mark.slow  # 50 s on 2 cores (CI time); run with -m slow
def test_pooler_input_stays_bounded_after_pretraining(tmp_path, corpus_file):
    """A short MLM pretraining of the default architecture (final_norm on), then the quantity that blew up in
    the user's run: the mean-pooled last hidden state the pooler reads (norm ~1,937 against 6.65 at init;
    docs/faithfulness.md#bigs-final-norm). It stays at the LayerNorm's scale, ~√d."""
    from conftest import tiny_recipe

    from ssmlm.recipe import load_recipe
    from ssmlm.runs import open_run
    from ssmlm.train.drive import pretrain

    d = 32
    model = {"hidden_size": d, "num_layers": 2, "intermediate_size": 96}
    path = tiny_recipe(
        tmp_path / "r.yaml", corpus_file, model, train={"steps": 60, "batch_size": 16, "learning_rate": 1e-2}
    )
    pretrain(load_recipe(str(path)), tmp_path / "runs/scale", quiet=True)
    model, _ = open_run(tmp_path / "runs/scale").load_model()
    ids = jnp.asarray(np.random.default_rng(0).integers(5, 150, (8, 32)), jnp.int32)
    h = model.encoder(ids, attention_mask=jnp.ones_like(ids))
    pooled = np.linalg.norm(np.asarray(h.mean(1)), axis=-1)
    assert model.encoder.final_norm is not None
    assert (pooled < 2 * np.sqrt(d)).all()
