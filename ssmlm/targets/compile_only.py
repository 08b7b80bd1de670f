"""Abstract jax devices for compiling for a `Target` ahead of time on this host, and the quieting of what the
compilers' plugins print while they load here.

`devices(target)` gives compile-only jax devices, which a `Mesh` and `jax.jit(...).lower(...).compile()` accept as if
they were attached, so a program's memory and code can be checked here, on a CPU host, before any money is spent.
Nothing here makes a TPU or GPU jax's default backend: the host stays on CPU.

Compiling needs the compiler of the target's platform: libtpu for TPUs (`pip install 'ssmlm[tpu]'`) and jax's CUDA
plugin for GPUs (`pip install 'ssmlm[gpu-aot]'`); neither needs the hardware. libtpu refuses a shape that its hosts do
not tile unless told the chips per host (so "v5e:1x1" needs chips_per_host_bounds, passed below).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from ssmlm.errors import UserError
from ssmlm.targets.catalogue import Accelerator, Target


def gpu_target_config(acc: Accelerator) -> str:
    """XLA's GpuTargetConfigProto for `acc`, as protobuf text: what its GPU compiler asks of an attached GPU."""
    g = acc.gpu
    major, minor = g.compute_capability
    # Hopper kernels are built for sm_90a (wgmma, TMA), as on a real H100; XLA's own H100 spec file says so too.
    extension = " feature_extension: ACCELERATED_FEATURES" if major == 9 else ""
    info = {
        "threads_per_block_limit": g.threads_per_block,
        "threads_per_warp": g.threads_per_warp,
        "shared_memory_per_block": g.shared_memory_per_block,
        "shared_memory_per_core": g.shared_memory_per_sm,
        "threads_per_core_limit": g.threads_per_sm,
        "core_count": g.sm_count,
        "fpus_per_core": g.fp32_cores_per_sm,
        "block_dim_limit_x": 2**31 - 1,  # grid limits, the same for every compute capability since 3.0
        "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535,
        "memory_bandwidth": int(acc.hbm_bandwidth),
        "l2_cache_size": g.l2_cache_bytes,
        "clock_rate_ghz": g.clock_ghz,
        "device_memory_size": acc.hbm_bytes,
        "shared_memory_per_block_optin": g.shared_memory_per_block_optin,
        "registers_per_core_limit": g.registers_per_sm,
        "registers_per_block_limit": g.registers_per_block,
        "thread_dim_limit_x": 1024,
        "thread_dim_limit_y": 1024,
        "thread_dim_limit_z": 64,
    }
    lines = ["gpu_device_info {", *(f"  {k}: {v}" for k, v in info.items())]
    lines += [
        f"  cuda_compute_capability {{ major: {major} minor: {minor}{extension} }}",
        f"  device_interconnect_info {{ active_links: {g.nvlink_links} }}",
        f'  name: "{acc.device_kind}"',
        "}",
        'platform_name: "CUDA"',
        # The toolchain jax-cuda12-plugin 0.10.2 was built with (its _versions module): CUDA 12.9, cuDNN 9.8.
        "dnn_version_info { major: 9 minor: 8 patch: 0 }",
        "runtime_version { major: 12 minor: 9 patch: 0 }",
        f'device_description_str: "{acc.device_kind}"',  # becomes the devices' device_kind
    ]
    return "\n".join(lines) + "\n"


def devices(target: Target) -> list:
    """Compile-only jax devices for `target` (`target.num_devices` of them, process_index = host), for a Mesh and
    `jax.jit(...).lower(...).compile()`. The host's own backend stays what it was (CPU)."""
    acc = target.accelerator
    if acc.tpu:
        dims = tuple(int(d) for d in target.topology.partition(":")[2].split("x")) + (1,)
        bounds = tuple(min(d, h) for d, h in zip(dims, acc.tpu.host_bounds, strict=False))
        return list(_tpu_devices(target.topology, bounds))
    return list(_gpu_devices(target.topology, gpu_target_config(acc)))


@functools.cache
def _tpu_devices(topology: str, host_bounds: tuple[int, ...]) -> tuple:
    if importlib.util.find_spec("libtpu") is None:
        raise UserError(f"compiling for {topology} needs libtpu: pip install 'ssmlm[tpu]'")
    # libtpu takes a lock file so that one process holds it; without this a second shell, or a second pytest-xdist
    # worker, fails with "Internal error when accessing libtpu multi-process lockfile". Read when libtpu loads.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        with native_stderr_quieted():
            from jax.experimental.topologies import get_topology_desc

            found = get_topology_desc(topology_name=topology, platform="tpu", chips_per_host_bounds=list(host_bounds))
    except Exception as err:  # libtpu raises its own runtime errors
        raise UserError(f"libtpu refused {topology}: {_first_line(err)}") from err
    return tuple(found.devices)


@functools.cache
def _gpu_devices(topology: str, target_config: str) -> tuple:
    plugin = _cuda_plugin_path()
    options = dict(target_config=target_config, topology=topology)
    try:
        with native_stderr_quieted():
            from jax.experimental.topologies import get_topology_desc  # importing jax loads the plugin's stubs

            try:
                found = get_topology_desc(topology_name="aot", platform="cuda", **options).devices
            except NotImplementedError:
                found = _gpu_devices_without_registration(plugin, options)
    except Exception as err:
        raise UserError(f"jax's CUDA plugin refused topology {topology}: {_first_line(err)}") from err
    return tuple(found)


def cuda_plugin_spec():
    """The gpu-aot extra's CUDA plugin module spec, or None. A plain install has no ``jax_plugins`` package at all,
    and find_spec raises for a submodule of a missing package instead of returning None."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12")
    except ModuleNotFoundError:
        return None


def _cuda_plugin_path() -> Path:
    spec = cuda_plugin_spec()
    library = Path(next(iter(spec.submodule_search_locations or ()), "")) / "xla_cuda_plugin.so" if spec else None
    if library is None or not library.exists():
        raise UserError("compiling for NVIDIA GPUs needs jax's CUDA plugin: pip install 'ssmlm[gpu-aot]'")
    return library


def _gpu_devices_without_registration(plugin: Path, options: dict) -> list:
    """jax registers its CUDA plugin only after checking the CUDA libraries, which a host without a GPU lacks (unless
    JAX_PLATFORMS leaves CUDA out); compiling needs none of them, so load the plugin for its topology alone. No
    backend is registered: jax.devices() is unchanged."""
    from jax._src.lib import xla_client

    topology = xla_client.make_c_api_device_topology(_cuda_c_api(str(plugin)), "aot", **options)
    return topology._make_compile_only_devices()


@functools.cache
def _cuda_c_api(plugin: str):
    from jax._src.lib import xla_client

    return xla_client.load_pjrt_plugin_dynamically("cuda", plugin)


@contextlib.contextmanager
def native_stderr_quieted():
    """Hold back what libtpu and the CUDA plugin print straight to file descriptor 2 while they load on a host
    without their hardware ("could not determine TPU accelerator type", "Could not find cuda drivers"): expected
    here, alarming to a user. Shown after all when loading fails."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            os.write(2, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def quiet_cuda_plugin() -> None:
    """On a CPU-only process (JAX_PLATFORMS=cpu) with the gpu-aot extra installed, hold back the CUDA plugin's
    native start-up lines: its import prints "Could not find cuda drivers" three times, and its registration with
    jax (``initialize``, called when jax first starts its backends) once more, each with an absl warning.

    Lazily: importing the plugin imports jax, seconds that a command's quick refusal must not spend, so only a
    finder is installed here. It quiets the imports that print: the plugin's CUDA extensions (``jax_cuda12_plugin``,
    which jaxlib loads while jax is imported) and the plugin module, which jax's discovery imports when its backends
    start. Only those, each brief: a line another thread prints meanwhile (a command's start line) is held back too.
    """
    if os.environ.get("JAX_PLATFORMS") != "cpu" or cuda_plugin_spec() is None:
        return
    plugin = sys.modules.get(_CUDA_PLUGIN)
    if plugin is not None:  # jax already started: only its registration is left to quiet
        _quiet_initialize(plugin)
    elif not any(isinstance(f, _QuietCudaPluginFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietCudaPluginFinder())


_CUDA_PLUGIN = "jax_plugins.xla_cuda12"


class _QuietCudaPluginFinder(importlib.abc.MetaPathFinder):
    """Finds the CUDA plugin's modules as the other finders do, with a loader that runs their imports quietly."""

    def find_spec(self, name, path=None, target=None):
        if name != _CUDA_PLUGIN and name.partition(".")[0] != "jax_cuda12_plugin":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            found = finder.find_spec(name, path, target)
            if found is not None:
                found.loader = _QuietLoader(found.loader)
                return found
        return None


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # resource readers and the rest: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):  # an extension module is loaded (and prints) here
        with native_stderr_quieted():
            return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        with native_stderr_quieted():
            self.loader.exec_module(module)
        if module.__name__ == _CUDA_PLUGIN:
            _quiet_initialize(module)


def _quiet_initialize(plugin) -> None:
    initialize = plugin.initialize
    if getattr(initialize, "quieted", False):
        return

    @functools.wraps(initialize)
    def quietly() -> None:
        with native_stderr_quieted():
            initialize()

    quietly.quieted = True
    plugin.initialize = quietly  # jax calls the module's attribute when it discovers plugins


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
