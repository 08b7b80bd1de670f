"""The platform a step is compiled for, which the models' ``auto`` choices follow (scan and attention paths).

By default that is the host's: ``jax.default_backend()``. A driver that compiles ahead of time for another
target (a TPU slice or a GPU node, from a CPU host: jax.experimental.topologies) traces inside
``compiling_for(platform)``, so ``auto`` picks the target's paths, not the host's:

    with compiling_for("tpu"), jax.set_mesh(mesh):
        compiled = jax.jit(step).lower(*abstract_args).compile()

The setting is a ``contextvars.ContextVar``: it holds for the code traced inside the block, in this thread.
jax.jit caches traces by argument types and jax's own configuration, not by this setting, so the driver traces a
function anew (a fresh ``jax.jit`` of it) for each platform it compiles one function for.

``cudnn_available`` tells, before compiling, whether this host can compile jax's cuDNN attention for a GPU
target: jax checks for NVIDIA's cuDNN library while tracing it and raises "cuDNN not found" without it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax

__all__ = ["PLATFORMS", "backend", "compiling_for", "cudnn_available"]

PLATFORMS = ("cpu", "gpu", "tpu")
# jax.default_backend() and a device's .platform name the GPU by its vendor's stack on some installs
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}
_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("ssmlm_compiling_for", default=None)


def _normalise(name: str) -> str:
    return _ALIASES.get(name, name)


def backend() -> str:
    """ "cpu", "gpu" or "tpu": the platform being compiled for (``compiling_for``'s), else the host's default."""
    target = _TARGET.get()
    return target if target is not None else _normalise(jax.default_backend())


@contextlib.contextmanager
def compiling_for(platform: str):
    """Within the block, ``backend()`` is ``platform`` (cpu, gpu or tpu; cuda and rocm mean gpu)."""
    if not isinstance(platform, str) or _normalise(platform.lower()) not in PLATFORMS:
        accepted = ", ".join((*PLATFORMS, *_ALIASES))
        raise ValueError(f"compiling_for({platform!r}): expected one of {accepted}")
    token = _TARGET.set(_normalise(platform.lower()))
    try:
        yield
    finally:
        _TARGET.reset(token)


@functools.cache
def cudnn_available() -> bool:
    """Whether jax finds NVIDIA's cuDNN library here, so that jax.nn.dot_product_attention(implementation="cudnn")
    can be traced and compiled for a GPU target (the cuDNN wheel or a system libcudnn)."""
    try:
        # the check the cuDNN attention makes while tracing (jax/_src/cudnn/fused_attention_stablehlo.py,
        # check_cudnn_version): jax's CUDA plugin's version helpers, which load libcudnn
        from jax._src.lib import cuda_versions
    except ImportError:
        return False
    if cuda_versions is None:
        return False
    try:
        cuda_versions.cudnn_get_version()
    except RuntimeError:
        return False
    return True
