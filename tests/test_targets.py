"""ssmlm.targets: what a user rents (catalogue), and compile-only devices for it (compile_only: libtpu and jax's CUDA
plugin, no hardware)."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from ssmlm.errors import UserError
from ssmlm.targets.catalogue import ACCELERATORS, known_targets_text, parse_target, peak_flops
from ssmlm.targets.compile_only import devices, gpu_target_config

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
HAS_CUDA_PLUGIN = importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu not installed (pip install 'ssmlm[tpu]')")
needs_cuda_plugin = pytest.mark.skipif(
    not HAS_CUDA_PLUGIN, reason="jax's CUDA plugin not installed (pip install 'ssmlm[gpu-aot]')"
)


@pytest.mark.parametrize(
    "text, topology, chips, hosts",
    [
        ("v5e:4x4", "v5e:4x4", 16, 2),
        ("v5e:2x2", "v5e:2x2", 4, 1),
        ("v5p:2x2x2", "v5p:2x2x2", 8, 2),
        ("v4:2x2x1", "v4:2x2x1", 4, 1),
        ("v3:4x4", "v3:4x4", 16, 4),
        (" V6E:16x16 ", "v6e:16x16", 256, 32),
        # Cloud's slice names: TensorCores for v3, v4 and v5p (2 per chip), chips for v5e and v6e
        ("v5e-16", "v5e:4x4", 16, 2),
        ("v5litepod-8", "v5e:2x4", 8, 1),
        ("v5p-8", "v5p:2x2x1", 4, 1),
        ("v4-8", "v4:2x2x1", 4, 1),
        ("v4-32", "v4:2x2x4", 16, 4),
        ("v6e-8", "v6e:2x4", 8, 1),
        ("v3-8", "v3:2x2", 4, 1),
        # GPUs: "<partitions>x<hosts>x<gpus per host>"
        ("h100-80gb", "1x1x1", 1, 1),
        ("h100-80gb:8", "1x1x8", 8, 1),
        ("a100-80gb:4x5", "1x5x4", 20, 5),
        ("h200:8x2", "1x2x8", 16, 2),
    ],
)
def test_parse_target(text, topology, chips, hosts):
    target = parse_target(text)
    assert (target.topology, target.chips, target.hosts, target.name) == (topology, chips, hosts, text.strip())


def test_figures():
    v5e, h100 = ACCELERATORS["v5e"], ACCELERATORS["h100-80gb"]
    assert (v5e.platform, v5e.device_kind, v5e.peak_bf16_flops) == ("tpu", "TPU v5 lite", 197e12)
    assert peak_flops(parse_target("v5e-16")) == 16 * 197e12
    assert h100.platform == "gpu" and h100.gpu.compute_capability == (9, 0) and h100.gpu.sm_count == 132
    assert parse_target("v4:2x2x1").num_devices == 8 and parse_target("v5p-8").num_devices == 4
    for acc in ACCELERATORS.values():
        assert acc.hbm_bytes > 0 and acc.hbm_bandwidth > 0 and acc.interconnect_bandwidth > 0 and acc.chips_per_host
    config = gpu_target_config(ACCELERATORS["a100-80gb"])
    assert "core_count: 108" in config and 'device_description_str: "NVIDIA A100-SXM4-80GB"' in config


@pytest.mark.parametrize(
    "text, says",
    [
        ("tpu-v9:2x2", ["unknown accelerator 'tpu-v9:2x2'", "v5e", "h100-80gb", "v5e-16"]),
        ("", ["unknown accelerator"]),
        ("v5e:3x3", ["'v5e:3x3'", "v5e takes one of 1x1, 2x2, 2x4, 4x4"]),
        ("v5e", ["v5e takes one of"]),
        ("v5e:2x2x1", ["v5e takes one of"]),
        ("v5p:2x2", ["v5p takes AxBxC"]),
        ("v5p:3x3x3", ["v5p takes AxBxC", "2x2x1"]),
        ("v4:16x16x32", ["at most 4096 chips"]),
        ("v5p-6", ["not a v5p slice", "TensorCores, 2 per chip", "v5p-8"]),
        ("v5e-12", ["not a v5e slice", "counts chips", "v5e-16"]),
        ("h100-80gb:9", ["at most 8 GPUs per host"]),
        ("h100-80gb:0", ["NAME:GPUSxHOSTS"]),
        ("a100-80gb:4x5x2", ["NAME:GPUSxHOSTS"]),
        ("h200:eight", ["NAME:GPUSxHOSTS"]),
    ],
)
def test_parse_errors(text, says):
    with pytest.raises(UserError) as caught:
        parse_target(text)
    message = str(caught.value)
    assert "\n" not in message
    for part in says:
        assert part in message


def test_known_targets_text_is_one_line():
    text = known_targets_text()
    assert "\n" not in text and all(name in text for name in ACCELERATORS)


def _compile_tiny(target):
    """A 256x256 bf16 matmul for `target`'s devices: the whole path from parse_target to an executable."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices(target)), ("data",))
    arg = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
    return jax.jit(lambda x: x @ x).lower(arg).compile().memory_analysis()


def _host_still_cpu():
    import jax

    assert jax.default_backend() == "cpu"
    assert {d.platform for d in jax.devices()} == {"cpu"}


@needs_libtpu
def test_tpu_devices_and_compile():
    found = devices(parse_target("v5e:2x2"))
    assert len(found) == 4 and {d.device_kind for d in found} == {"TPU v5 lite"}
    assert devices(parse_target("v5e:2x2"))[0] is found[0]  # cached per topology
    assert {d.process_index for d in devices(parse_target("v5e:4x4"))} == {0, 1}  # 8 chips a host
    assert len(devices(parse_target("v4-8"))) == 8  # libtpu's v4: a device per TensorCore
    memory = _compile_tiny(parse_target("v5e:2x2"))
    assert memory.argument_size_in_bytes == 256 * 256 * 2 and memory.output_size_in_bytes == 256 * 256 * 2
    _host_still_cpu()


@needs_cuda_plugin
def test_gpu_devices_and_compile():
    found = devices(parse_target("h100-80gb:8"))
    assert len(found) == 8 and {d.device_kind for d in found} == {"NVIDIA H100 80GB HBM3"}
    many = devices(parse_target("a100-80gb:4x5"))
    assert len(many) == 20 and {d.device_kind for d in many} == {"NVIDIA A100-SXM4-80GB"}
    # one process per host, its GPUs numbered after the previous host's
    assert [d.process_index for d in many] == [h for h in range(5) for _ in range(4)]
    memory = _compile_tiny(parse_target("h100-80gb:8"))
    assert memory.argument_size_in_bytes == 256 * 256 * 2 and memory.output_size_in_bytes == 256 * 256 * 2
    _host_still_cpu()


_USER_SHELL = textwrap.dedent(
    """
    import sys
    from ssmlm.targets.catalogue import parse_target
    from ssmlm.targets.compile_only import devices
    from tests.test_targets import _compile_tiny
    found = devices(parse_target("a100-80gb:4x5")) + devices(parse_target("v5e:2x2"))
    memory = _compile_tiny(parse_target("h100-80gb:8"))
    print(len(found), found[0].device_kind, found[-1].device_kind, memory.argument_size_in_bytes, flush=True)
    print("MARK", file=sys.stderr, flush=True)
    import jax
    print(jax.default_backend(), {d.platform for d in jax.devices()})
    """
)


@needs_libtpu
@needs_cuda_plugin
@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="a GPU host: jax registers its CUDA plugin itself")
def test_user_shell_without_jax_platforms():
    """In a user's shell JAX_PLATFORMS is unset, and jax refuses its CUDA plugin on a host without CUDA libraries
    (printing a traceback); devices() still works, prints none of that nor libtpu's complaints about the missing
    TPU, and the host stays on CPU."""
    # conftest's compilation cache holds this file's programs already, and jax cannot read a compile-only one back
    # (it warns, then compiles): a user's shell has neither
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_COMPILATION_CACHE_DIR")}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, "-c", _USER_SHELL], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [f"24 NVIDIA A100-SXM4-80GB TPU v5 lite {256 * 256 * 2}", "cpu {'cpu'}"]
    assert run.stderr.split("MARK")[0].strip() == ""


def test_missing_extras_name_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    missing = ("libtpu", "jax_plugins.xla_cuda12")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    with pytest.raises(UserError, match=r"pip install 'ssmlm\[tpu\]'"):
        devices(parse_target("v6e:4x8"))
    with pytest.raises(UserError, match=r"pip install 'ssmlm\[gpu-aot\]'"):
        devices(parse_target("a100-40gb:16"))


@pytest.mark.skipif(importlib.util.find_spec("jax_plugins.xla_cuda12") is None, reason="needs the gpu-aot extra")
def test_a_cpu_process_with_the_cuda_plugin_prints_none_of_its_start_up_lines():
    """What `ssmlm` and each `experiment --jobs N` worker do on a machine without a GPU: nothing on stderr."""
    code = (
        "from ssmlm.targets.compile_only import quiet_cuda_plugin; quiet_cuda_plugin(); "
        "import jax.numpy as jnp; jnp.zeros(2).block_until_ready(); print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert "cuda" not in done.stderr.lower() and "absl" not in done.stderr, done.stderr


def _without_jax_plugins(*argv: str) -> subprocess.CompletedProcess:
    """`ssmlm ARGV` in a process where the `jax_plugins` package does not exist, as on a plain install (no gpu-aot
    extra): a None entry in sys.modules makes every import of it, find_spec's of a submodule too, fail for real."""
    code = (
        f"import sys; sys.modules['jax_plugins'] = None; sys.argv = {['ssmlm', *argv]!r}; "
        "import ssmlm.cli; ssmlm.cli.main()"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_a_plain_install_without_jax_plugins_starts():
    """The README's first command on a fresh machine: `ssmlm` with no gpu-aot extra (no jax_plugins at all)."""
    done = _without_jax_plugins("--help")
    assert done.returncode == 0, done.stderr
    assert "pretrain" in done.stdout and "Traceback" not in done.stderr


def test_a_plain_install_asks_for_the_gpu_extra_in_one_line():
    done = _without_jax_plugins("pretrain", "--dry-run", "--target", "a100-80gb:1", "-q")
    assert done.returncode == 2, done.stdout + done.stderr
    # (the simulation leaves the plugin's package metadata, so jax may still announce it: only our lines count)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: compiling for NVIDIA GPUs needs jax's CUDA plugin: pip install 'ssmlm[gpu-aot]'"]
    assert "Traceback" not in done.stderr
