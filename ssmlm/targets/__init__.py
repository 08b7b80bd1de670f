"""The accelerators a user rents, and abstract jax devices for compiling for them ahead of time on this host.

`parse_target("v5e:4x4")` gives a `Target` (``catalogue``: the rented hardware as data, with each figure's source);
`devices(target)` gives compile-only jax devices for it (``compile_only``: libtpu and jax's CUDA plugin, loaded
without the hardware, their start-up noise held back).
"""

from ssmlm.targets.catalogue import (
    ACCELERATORS,
    Accelerator,
    GpuSpec,
    Target,
    TpuSpec,
    known_targets_text,
    parse_target,
    peak_flops,
)
from ssmlm.targets.compile_only import (
    cuda_plugin_spec,
    devices,
    gpu_target_config,
    native_stderr_quieted,
    quiet_cuda_plugin,
)

# what the rest of ssmlm (and benchmarks/) imports from here; each module's other names are its own
__all__ = [
    "ACCELERATORS",
    "Accelerator",
    "GpuSpec",
    "Target",
    "TpuSpec",
    "cuda_plugin_spec",
    "devices",
    "gpu_target_config",
    "known_targets_text",
    "native_stderr_quieted",
    "parse_target",
    "peak_flops",
    "quiet_cuda_plugin",
]
