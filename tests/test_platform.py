"""ssmlm.models.platform: ``auto`` (scan and attention paths) follows the platform a step is compiled for, not the
host. Read from executables compiled on this host for a TPU slice (v5e 2x2, jax.experimental.topologies and
libtpu) and a GPU node (H100, the CUDA plugin): the TPU's has the associative scan and the splash kernel, sharded
over a mesh, forward and backward. Splash's values equal the dense path's, run in Pallas's interpreter on CPU."""

import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P
from numerics import EPS32, assert_close_scaled

from ssmlm.models import build_lm, platform
from ssmlm.models.attention import attention_choice, segment_attention
from ssmlm.models.config import LMConfig
from ssmlm.models.lm_context import make_context
from ssmlm.models.platform import compiling_for
from ssmlm.models.scan import linear_scan, scan_choice
from ssmlm.models.scan import resolve as scan_resolve

# An H100 described by hand (jax.experimental.topologies compiles for it without one): a minimal
# GpuTargetConfigProto. Fields left out of gpu_device_info (the core count, say) crash XLA's compiler with SIGFPE.
H100 = """
gpu_device_info {
  cuda_compute_capability { major: 9 minor: 0 }
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_block_optin: 232448 shared_memory_per_core: 233472 threads_per_core_limit: 2048
  core_count: 132 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  registers_per_core_limit: 65536 registers_per_block_limit: 65536 device_memory_size: 84942979072
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 }
"""
# splash and dense sum the softmax in different orders, and splash scales q before the product: float32 rounding
# (measured ≤ 2ε of the array's largest entry), far below a masking error's ≥ 1e-2
ROUNDING = 64 * EPS32


@pytest.fixture(autouse=True)
def full_float32_matmuls():
    """Float32 products in full precision, as in tests/test_attention.py: on a GPU XLA's default is TF32, whose
    rounding differs between the paths by far more than float32's. Compiling splash for a TPU under it checks
    that the kernel takes products Mosaic accepts whatever the setting (attention._kernel_precision)."""
    with jax.default_matmul_precision("highest"):
        yield


@pytest.fixture(scope="module")
def tpu():
    """The 4 abstract chips of a v5e 2x2 slice, to compile for."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # other processes (tests) may hold libtpu
    from jax.experimental import topologies

    try:
        return topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
    except Exception as e:  # no libtpu, or one that cannot describe the slice
        pytest.skip(f"no TPU topology to compile for (libtpu): {e}")


@pytest.fixture(scope="module")
def gpu():
    """One abstract H100, to compile for."""
    from jax.experimental import topologies

    try:
        return topologies.get_topology_desc(topology_name="h100", platform="cuda", target_config=H100, topology="1x1x1")
    except Exception as e:  # no CUDA plugin
        pytest.skip(f"no GPU topology to compile for (jax's CUDA plugin): {e}")


def shaped(shape, dtype, sharding):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def test_compiling_for_sets_the_platform_inside_only():
    host = {"cuda": "gpu", "rocm": "gpu"}.get(jax.default_backend(), jax.default_backend())
    assert platform.backend() == host
    with compiling_for("tpu"):
        assert platform.backend() == "tpu"
        with compiling_for("cuda"):
            assert platform.backend() == "gpu"
        assert platform.backend() == "tpu"
    assert platform.backend() == host
    with pytest.raises(ValueError, match="cpu, gpu, tpu"), compiling_for("v5e"):
        pass


def test_auto_follows_the_target():
    on_cpu = jax.default_backend() == "cpu"
    assert scan_resolve("auto") == ("sequential" if on_cpu else "associative")
    if on_cpu:
        assert attention_choice("auto", jnp.bfloat16, 64, False)[0] == "blockwise"
    with compiling_for("tpu"):
        assert scan_resolve("auto") == "associative"
        assert scan_choice("sequential") == ("sequential", "model.scan_impl")
        assert attention_choice("auto", jnp.bfloat16, 64, False)[0] == "splash"
        chosen, why = attention_choice("auto", jnp.bfloat16, 64, True)
        assert chosen == "dense" and "prefix" in why  # a prefix-LM layer: the mask is not static
    with compiling_for("cpu"):
        assert scan_resolve("auto") == "sequential"
        assert attention_choice("auto", jnp.bfloat16, 64, True)[0] == "blockwise"
    with compiling_for("gpu"):
        assert scan_resolve("auto") == "associative"
        assert attention_choice("auto", jnp.float32, 64, True)[0] == "dense"  # cuDNN takes no float32
        chosen, why = attention_choice("auto", jnp.bfloat16, 64, True)
        if platform.cudnn_available():
            assert chosen == "cudnn"
        else:
            assert chosen == "dense" and "cuDNN not installed" in why
    with pytest.raises(ValueError, match="prefix-LM"):
        attention_choice("splash", jnp.bfloat16, 64, True)


def scan_hlo(devices, length: int) -> str:
    """The compiled TPU executable of a causal linear scan over ``length`` positions (a fresh jit: jit caches
    a trace by its arguments, not by compiling_for)."""
    s = SingleDeviceSharding(devices[0])
    args = shaped((2, length, 128), jnp.float32, s), shaped((2, length, 128), jnp.float32, s)
    fn = jax.jit(lambda f, x, r: linear_scan(f, x, r))
    return fn.lower(*args, shaped((2, length), jnp.bool_, s)).compile().as_text()


def test_auto_compiles_the_associative_scan_for_a_tpu_target(tpu):
    """Compiled here for a TPU: inside compiling_for("tpu") the executable has no loop, and the associative
    scan's strided slices (≥ one per level of its log₂ L tree); without it, this CPU host's choice, the
    sequential scan's while loop (which the bug compiled into TPU executables)."""
    length = 1024
    with compiling_for("tpu"):
        associative = scan_hlo(tpu, length)
    sequential = scan_hlo(tpu, length)
    assert re.search(r"\bwhile\(", sequential)
    assert not re.search(r"\bwhile\(", associative)
    assert len(re.findall(r"\bslice\(", associative)) >= math.log2(length)


def packed(batch: int, length: int, bidirectional: bool):
    """A packed batch: per row samples of 3 lengths (prefixes when ``bidirectional``), then padding."""
    seg, types = np.zeros((batch, length), np.int32), np.zeros((batch, length), np.int32)
    for r in range(batch):
        at = 0
        for s, n in enumerate([length // 3 - r, length // 4, length // 5 + r]):
            seg[r, at : at + n] = s + 1
            types[r, at : at + n] = 3
            types[r, at : at + n // 3] = 1 if bidirectional else 3
            at += n
    return make_context(jnp.asarray(seg), jnp.asarray(seg), jnp.asarray(types))


def attention_hlo(mesh, spec, bidirectional: bool, grad: bool) -> str:
    """The compiled TPU executable of the LM's auto attention under ``mesh`` (forward, or its gradient)."""
    b, length, heads, d = 8, 300, 4, 64
    sh = NamedSharding(mesh, spec)
    qkv = [shaped((b, length, heads, d), jnp.bfloat16, sh)] * 3
    ids = [shaped((b, length), jnp.int32, NamedSharding(mesh, P(spec[0])))] * 2

    def attention(q, k, v, seg, types):
        return segment_attention(q, k, v, make_context(seg, seg, types), bidirectional)

    loss = lambda *a: attention(*a).astype(jnp.float32).sum()  # noqa: E731
    fn = jax.grad(loss, argnums=(0, 1, 2)) if grad else attention
    with compiling_for("tpu"), jax.set_mesh(mesh):
        return jax.jit(fn).lower(*qkv, *ids).compile().as_text()


@pytest.mark.parametrize(("shape", "spec"), [((1, 4, 1), P(("data", "fsdp"))), ((1, 2, 2), P("fsdp", None, "tensor"))])
def test_splash_compiles_for_a_tpu_mesh(tpu, shape, spec):
    """Causal layers compile to the splash kernel (a Mosaic custom call) per device under shard_map, forward
    and backward, with the batch split over (data, fsdp) and the heads over tensor; prefix-LM layers stay dense."""
    mesh = Mesh(np.array(tpu).reshape(shape), ("data", "fsdp", "tensor"))
    assert "tpu_custom_call" in attention_hlo(mesh, spec, False, grad=False)
    assert attention_hlo(mesh, spec, False, grad=True).count("tpu_custom_call") >= 2  # dq and dk/dv kernels
    assert "tpu_custom_call" not in attention_hlo(mesh, spec, True, grad=False)


def test_splash_equals_dense_in_the_interpreter():
    """Outputs and gradients on packed causal rows (the row padded from 200 to 256 for the kernel's blocks),
    the splash kernel run in Pallas's interpreter on this host."""
    b, length, heads, d = 3, 200, 2, 16
    ctx = packed(b, length, False)
    rng = np.random.default_rng(0)
    q, k, v, cot = (jnp.asarray(rng.standard_normal((b, length, heads, d)), jnp.float32) for _ in range(4))

    def vjp(impl):
        out, back = jax.vjp(lambda q, k, v: segment_attention(q, k, v, ctx, False, impl), q, k, v)
        return out, *back(cot)

    splash, dense = jax.jit(lambda: vjp("splash"))(), jax.jit(lambda: vjp("dense"))()
    pad = np.asarray(ctx.segment_ids == 0)
    for name, a, want in zip(["out", "dq", "dk", "dv"], splash, dense, strict=True):
        assert_close_scaled(a, want, rtol=ROUNDING, axis=None, name=name)
        assert np.all(np.asarray(a)[pad] == 0)


def test_lm_with_splash_equals_dense_in_the_interpreter():
    """The whole causal Transformer LM (bidirectional: none) on packed rows: the same logits either way."""
    cfg = LMConfig(
        arch="transformer_lm",
        hidden_size=16,
        num_heads=2,
        num_layers=2,
        vocab_size=40,
        dropout=0.0,
        initializer_range=0.2,
        attention="dense",
        bidirectional="none",
    )
    ctx = packed(2, 130, False)
    tokens = jnp.where(ctx.segment_ids > 0, np.random.default_rng(4).integers(1, 40, ctx.segment_ids.shape), 0)
    model = build_lm(cfg, seed=1)
    run = jax.jit(lambda model: model(tokens, ctx.segment_ids, None, ctx.positions))
    dense = run(model)
    for block in model.blocks:
        block.attention = "splash"
    assert_close_scaled(run(model), dense, rtol=ROUNDING, name="logits")


def test_gpu_target_compiles_the_chosen_attention(gpu):
    """Compiling for a GPU from this host: auto takes cudnn only where the cuDNN library is here to compile it
    with, else dense, and what it takes compiles (forward and backward)."""
    s = SingleDeviceSharding(gpu.devices[0])
    b, length, heads, d = 2, 128, 4, 64
    qkv = [shaped((b, length, heads, d), jnp.bfloat16, s)] * 3
    ids = [shaped((b, length), jnp.int32, s)] * 2
    with compiling_for("gpu"):
        chosen, _ = attention_choice("auto", jnp.bfloat16, d, True)
        assert chosen == ("cudnn" if platform.cudnn_available() else "dense")

        def loss(q, k, v, seg, types):
            out = segment_attention(q, k, v, make_context(seg, seg, types), True)
            return out.astype(jnp.float32).sum()

        hlo = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(*qkv, *ids).compile().as_text()
    assert ("__cudnn$fmha" in hlo) == (chosen == "cudnn")  # cuDNN's attention custom calls
