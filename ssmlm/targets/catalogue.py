"""The accelerators a user rents, as data: each TPU and GPU's figures and what its compiler needs, and
`parse_target`, which reads a name such as "v5e:4x4", a Cloud slice name such as "v5p-8", or "a100-80gb:4x5" (4 GPUs
on each of 5 hosts) into a `Target`.

Tried with libtpu 0.0.42.1 and jax-cuda12-plugin 0.10.2: every TPU in the table below, v3 included, is accepted as
"NAME:SHAPE" (v2 too, left out as no longer rented). Cloud's slice names themselves ("v5e-16") are not: they are mapped
to shapes here.

Figures are per chip, each with its public source. Bandwidths are bytes/s; `interconnect_bandwidth` is the
bidirectional total of one chip (ICI for TPUs, NVLink for GPUs), the way Google Cloud and NVIDIA quote it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ssmlm.errors import UserError

GiB = 2**30


@dataclass(frozen=True)
class TpuSpec:
    """What the TPU compiler and Cloud's slice names need beyond the headline figures."""

    dims: int  # 2: a 2D torus (v3, v5e, v6e), 3: a 3D torus (v4, v5p)
    host_bounds: tuple[int, int, int]  # the chips one host (VM) holds, as libtpu's chips_per_host_bounds
    cores_per_chip: int  # TensorCores; Cloud's slice names count these for v2-v4 and v5p ("v5p-8" = 4 chips)
    slice_counts_cores: bool
    devices_per_chip: int  # jax devices per chip in libtpu's compile-only topology (seen with libtpu 0.0.42.1)
    shapes: tuple[tuple[int, str], ...]  # chips -> Cloud's default shape for that many chips
    max_chips: int  # the largest single slice
    slice_prefixes: tuple[str, ...] = ()  # other names Cloud uses in slice names ("v5litepod-16")


@dataclass(frozen=True)
class GpuSpec:
    """The fields of XLA's GpuTargetConfigProto (xla/stream_executor/device_description.proto) that its GPU
    compiler reads when no GPU is attached; memory size and bandwidth come from the `Accelerator`."""

    compute_capability: tuple[int, int]
    sm_count: int
    fp32_cores_per_sm: int
    clock_ghz: float
    l2_cache_bytes: int
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int
    nvlink_links: int
    shared_memory_per_block: int = 48 * 1024
    threads_per_block: int = 1024
    threads_per_sm: int = 2048
    threads_per_warp: int = 32
    registers_per_sm: int = 65536
    registers_per_block: int = 65536


@dataclass(frozen=True)
class Accelerator:
    name: str
    platform: str  # "tpu" or "gpu"
    hbm_bytes: int  # per chip: Cloud's HBM figure (v5p's: what libtpu leaves programs), or what CUDA reports
    peak_bf16_flops: float  # per chip, dense
    hbm_bandwidth: float  # bytes/s per chip
    interconnect_bandwidth: float  # bytes/s per chip, bidirectional total (ICI for TPUs, NVLink for GPUs)
    chips_per_host: int
    device_kind: str  # what jax reports as Device.device_kind
    tpu: TpuSpec | None = None
    gpu: GpuSpec | None = None


# The 2D slices Cloud rents: v5e and v6e list exactly these (https://cloud.google.com/tpu/docs/v5e, /v6e). For v3 it
# lists sizes, v3-8 to v3-2048 in a 1024-chip pod (https://cloud.google.com/tpu/docs/v3), a 32x32 torus
# (https://jax-ml.github.io/scaling-book/tpus/); each size's shape here is the squarest one, as for 3D below.
_SHAPES_2D_V5E = ((1, "1x1"), (4, "2x2"), (8, "2x4"), (16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"))
_SHAPES_2D_V5E += ((256, "16x16"),)
_SHAPES_2D_V3 = ((4, "2x2"), (16, "4x4"), (32, "4x8"), (64, "8x8"), (128, "8x16"), (256, "16x16"), (512, "16x32"))
_SHAPES_2D_V3 += ((1024, "32x32"),)
# 3D defaults, "the one most similar to a cube" (https://cloud.google.com/tpu/docs/types-topologies; the v5p table at
# https://cloud.google.com/tpu/docs/v5p lists 2x2x1, 2x2x2, 2x4x4, 4x4x4, ... 16x16x24; 2x2x4 is Cloud's 16-chip v4
# example).
_SHAPES_3D = ((4, "2x2x1"), (8, "2x2x2"), (16, "2x2x4"), (32, "2x4x4"), (64, "4x4x4"), (128, "4x4x8"), (256, "4x8x8"))
_SHAPES_3D += ((512, "8x8x8"), (1024, "8x8x16"), (2048, "8x16x16"), (4096, "16x16x16"))

# ICI for v3 and v4 is not on Cloud's pages; https://jax-ml.github.io/scaling-book/tpus/ (Google DeepMind) gives the
# bidirectional bandwidth of one link: v3 2e11 B/s over 4 links (2D torus), v4 9e10 B/s over 6 links (3D). Its figures
# for v5e, v5p and v6e times their links equal Cloud's per-chip figures used below.
_TPUS = (
    # https://cloud.google.com/tpu/docs/v3: 123 TFLOPs bf16, "32 GiB, 900 GBps" HBM2, 2 TensorCores per chip.
    Accelerator(
        name="v3",
        platform="tpu",
        hbm_bytes=32 * GiB,
        peak_bf16_flops=123e12,
        hbm_bandwidth=900e9,
        interconnect_bandwidth=4 * 2e11,
        chips_per_host=4,
        device_kind="TPU v3",
        tpu=TpuSpec(
            dims=2,
            host_bounds=(2, 2, 1),
            cores_per_chip=2,
            slice_counts_cores=True,
            devices_per_chip=2,
            shapes=_SHAPES_2D_V3,
            max_chips=1024,
        ),
    ),
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOPs, "32 GiB, 1200 GBps", 2 TensorCores, 4096 chips a pod.
    # libtpu's compile-only v4 has one device per TensorCore (8 for v4:2x2x1), where a v4 host running jax shows one
    # megacore device per chip.
    Accelerator(
        name="v4",
        platform="tpu",
        hbm_bytes=32 * GiB,
        peak_bf16_flops=275e12,
        hbm_bandwidth=1200e9,
        interconnect_bandwidth=6 * 9e10,
        chips_per_host=4,
        device_kind="TPU v4",
        tpu=TpuSpec(
            dims=3,
            host_bounds=(2, 2, 1),
            cores_per_chip=2,
            slice_counts_cores=True,
            devices_per_chip=2,
            shapes=_SHAPES_3D,
            max_chips=4096,
        ),
    ),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOPs, "16 GB, 819 GBps" HBM2, bidirectional ICI 400 GBps per chip,
    # 8 chips per host, one TensorCore.
    Accelerator(
        name="v5e",
        platform="tpu",
        hbm_bytes=16 * 10**9,
        peak_bf16_flops=197e12,
        hbm_bandwidth=819e9,
        interconnect_bandwidth=400e9,
        chips_per_host=8,
        device_kind="TPU v5 lite",
        tpu=TpuSpec(
            dims=2,
            host_bounds=(2, 4, 1),
            cores_per_chip=1,
            slice_counts_cores=False,
            devices_per_chip=1,
            shapes=_SHAPES_2D_V5E,
            max_chips=256,
            slice_prefixes=("v5litepod",),
        ),
    ),
    # https://cloud.google.com/tpu/docs/v5p: 459 TFLOPs, 95 GiB HBM ("96 GiB physical ... 95 GiB to account for HBM
    # that the TPU system and the libtpu runtime reserve"), 2765 GBps, bidirectional ICI 1200 GBps per chip, 4-chip
    # VMs, 2 TensorCores (one megacore device), largest slice 16x16x24.
    Accelerator(
        name="v5p",
        platform="tpu",
        hbm_bytes=95 * GiB,
        peak_bf16_flops=459e12,
        hbm_bandwidth=2765e9,
        interconnect_bandwidth=1200e9,
        chips_per_host=4,
        device_kind="TPU v5",
        tpu=TpuSpec(
            dims=3,
            host_bounds=(2, 2, 1),
            cores_per_chip=2,
            slice_counts_cores=True,
            devices_per_chip=1,
            shapes=_SHAPES_3D + ((6144, "16x16x24"),),
            max_chips=6144,
        ),
    ),
    # https://cloud.google.com/tpu/docs/v6e: 918 TFLOPs, "32 GB" HBM at 1640 GBps, bidirectional ICI 800 GBps per
    # chip, 8 chips per host, one TensorCore.
    Accelerator(
        name="v6e",
        platform="tpu",
        hbm_bytes=32 * 10**9,
        peak_bf16_flops=918e12,
        hbm_bandwidth=1640e9,
        interconnect_bandwidth=800e9,
        chips_per_host=8,
        device_kind="TPU v6 lite",
        tpu=TpuSpec(
            dims=2,
            host_bounds=(2, 4, 1),
            cores_per_chip=1,
            slice_counts_cores=False,
            devices_per_chip=1,
            shapes=_SHAPES_2D_V5E,
            max_chips=256,
        ),
    ),
)

# GPUs. Headline figures: NVIDIA's datasheets (A100: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/
# a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; H100: https://resources.nvidia.com/en-us-tensor-core/
# nvidia-tensor-core-gpu-datasheet; H200: https://www.nvidia.com/en-us/data-center/h200/). Their bf16 figures for
# Hopper (1,979 TFLOPS) are with sparsity, "specifications 1/2 lower without sparsity"; NVLink 600 / 900 GB/s is the
# bidirectional total of 12 / 18 links. Per-SM limits: CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability" (https://docs.nvidia.com/cuda/cuda-c-programming-guide/): 8.0 has 164 KB shared memory per SM,
# 163 KB per block opted in; 9.0 has 228 / 227 KB. SMs, FP32 cores and L2: NVIDIA's A100 and H100 architecture
# whitepapers (108 SMs x 64, 40 MB; 132 SMs x 128, 50 MB on H100 SXM5). Clock, memory size and L2 as the device
# reports them (cudaDeviceProp): for H100 and H200 as read on the machines this project was checked on (driver
# 580.159.04; the H200 has 60 MiB of L2, not the H100's 50), for A100 from XLA's own spec files
# (github.com/openxla/xla, xla/backends/gpu/target_config/specs), which record real devices' values.
# Hosts: Google Cloud's A2 and A3 machine types hold 16 A100 40GB (a2-megagpu-16g), 8 A100 80GB (a2-ultragpu-8g), 8
# H100 (a3-highgpu-8g) or 8 H200 (a3-ultragpu-8g) (https://cloud.google.com/compute/docs/gpus).
_A100 = dict(
    compute_capability=(8, 0), sm_count=108, fp32_cores_per_sm=64, clock_ghz=1.41, l2_cache_bytes=40 * 2**20,
    shared_memory_per_sm=164 * 1024, shared_memory_per_block_optin=163 * 1024, nvlink_links=12,
)  # fmt: skip
_HOPPER = dict(
    compute_capability=(9, 0), sm_count=132, fp32_cores_per_sm=128, clock_ghz=1.98, l2_cache_bytes=50 * 2**20,
    shared_memory_per_sm=228 * 1024, shared_memory_per_block_optin=227 * 1024, nvlink_links=18,
)  # fmt: skip
_H200 = dict(_HOPPER, l2_cache_bytes=60 * 2**20)
_GPUS = (
    # 40 GB HBM2 at 1,555 GB/s, 312 TFLOPS bf16 dense.
    Accelerator(
        name="a100-40gb",
        platform="gpu",
        hbm_bytes=42_331_013_120,
        peak_bf16_flops=312e12,
        hbm_bandwidth=1555e9,
        interconnect_bandwidth=600e9,
        chips_per_host=16,
        device_kind="NVIDIA A100-SXM4-40GB",
        gpu=GpuSpec(**_A100),
    ),
    # 80 GB HBM2e at 2,039 GB/s.
    Accelerator(
        name="a100-80gb",
        platform="gpu",
        hbm_bytes=85_100_068_864,
        peak_bf16_flops=312e12,
        hbm_bandwidth=2039e9,
        interconnect_bandwidth=600e9,
        chips_per_host=8,
        device_kind="NVIDIA A100-SXM4-80GB",
        gpu=GpuSpec(**_A100),
    ),
    # H100 SXM: 80 GB HBM3 at 3.35 TB/s, 1,979 / 2 TFLOPS bf16 dense.
    Accelerator(
        name="h100-80gb",
        platform="gpu",
        hbm_bytes=85_017_493_504,
        peak_bf16_flops=989.5e12,
        hbm_bandwidth=3.35e12,
        interconnect_bandwidth=900e9,
        chips_per_host=8,
        device_kind="NVIDIA H100 80GB HBM3",
        gpu=GpuSpec(**_HOPPER),
    ),
    # H200 SXM: 141 GB HBM3e at 4.8 TB/s, the same GH100 compute as H100 SXM. jax and nvidia-smi call it
    # "NVIDIA H200" (XLA's spec file says "NVIDIA H200 141GB HBM3e").
    Accelerator(
        name="h200",
        platform="gpu",
        hbm_bytes=150_109_880_320,
        peak_bf16_flops=989.5e12,
        hbm_bandwidth=4.8e12,
        interconnect_bandwidth=900e9,
        chips_per_host=8,
        device_kind="NVIDIA H200",
        gpu=GpuSpec(**_H200),
    ),
)

ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in _TPUS + _GPUS}


@dataclass(frozen=True)
class Target:
    accelerator: Accelerator
    topology: str  # what the compiler is given: "v5e:4x4" for a TPU, "1x<hosts>x<gpus per host>" for GPUs
    chips: int
    hosts: int
    name: str  # as the user wrote it

    @property
    def num_devices(self) -> int:
        """How many jax devices `devices(target)` gives (chips, or TensorCores where libtpu counts those)."""
        return self.chips * (self.accelerator.tpu.devices_per_chip if self.accelerator.tpu else 1)


def known_targets_text() -> str:
    tpus = ", ".join(a.name for a in _TPUS)
    gpus = ", ".join(a.name for a in _GPUS)
    return (
        f"TPUs {tpus} as NAME:SHAPE (v5e:4x4, v5p:2x2x2) or a Cloud slice name (v5e-16, v5p-8); "
        f"GPUs {gpus} as NAME (one GPU), NAME:GPUS (one host) or NAME:GPUSxHOSTS (a100-80gb:4x5)"
    )


def peak_flops(target: Target) -> float:
    """Dense bf16 FLOP/s of the whole target."""
    return target.accelerator.peak_bf16_flops * target.chips


def parse_target(text: str) -> Target:
    """ "v5e:4x4", "v5p-8", "h100-80gb:8", "a100-80gb:4x5" -> Target; a UserError (one line) when it is not one."""
    raw = text.strip()
    name, _, shape = raw.lower().partition(":")
    if name in ACCELERATORS:
        acc = ACCELERATORS[name]
        return _tpu_target(acc, shape, raw) if acc.tpu else _gpu_target(acc, shape, raw)
    sliced = re.fullmatch(r"(.+)-(\d+)", name)
    if sliced and not shape:
        for acc in _TPUS:
            if sliced.group(1) in (acc.name, *acc.tpu.slice_prefixes):
                return _slice_target(acc, int(sliced.group(2)), raw)
    raise UserError(f"unknown accelerator {raw!r}: known are {known_targets_text()}")


def _slice_target(acc: Accelerator, count: int, raw: str) -> Target:
    spec = acc.tpu
    chips, rest = divmod(count, spec.cores_per_chip) if spec.slice_counts_cores else (count, 0)
    shapes = dict(spec.shapes)
    if rest or chips not in shapes:
        unit = spec.cores_per_chip if spec.slice_counts_cores else 1
        known = ", ".join(f"{acc.name}-{c * unit}" for c, _ in spec.shapes)
        what = "TensorCores, 2 per chip" if spec.slice_counts_cores else "chips"
        raise UserError(f"{raw!r} is not a {acc.name} slice Cloud rents (the number counts {what}): try {known}")
    return _tpu_target(acc, shapes[chips], raw)


def _tpu_target(acc: Accelerator, shape: str, raw: str) -> Target:
    spec = acc.tpu
    dims = _dims(shape)
    if dims is None or len(dims) != spec.dims or not _tpu_shape_ok(acc, dims):
        raise UserError(f"{raw!r}: {acc.name} takes {_tpu_shapes_text(acc)}")
    chips = math.prod(dims)
    return Target(acc, f"{acc.name}:{'x'.join(map(str, dims))}", chips, max(1, chips // acc.chips_per_host), raw)


def _tpu_shape_ok(acc: Accelerator, dims: tuple[int, ...]) -> bool:
    spec = acc.tpu
    if spec.dims == 2:  # Cloud rents these 2D shapes only
        return "x".join(map(str, dims)) in dict(spec.shapes).values()
    # 3D: each side at most 4 or a multiple of 4 (Cloud's rule for v4 topologies), whole hosts of 2x2x1 chips.
    sides_ok = all(d in (1, 2, 4) or d % 4 == 0 for d in dims) and dims[0] % 2 == 0 and dims[1] % 2 == 0
    return sides_ok and math.prod(dims) <= spec.max_chips


def _tpu_shapes_text(acc: Accelerator) -> str:
    spec = acc.tpu
    if spec.dims == 2:
        return "one of " + ", ".join(s for _, s in spec.shapes) + " (chips along each side of the torus)"
    return (
        f"AxBxC chips with A and B even, each side at most 4 or a multiple of 4, at most {spec.max_chips} chips "
        f"(e.g. 2x2x1, 2x2x2, 4x4x4)"
    )


def _gpu_target(acc: Accelerator, shape: str, raw: str) -> Target:
    dims = _dims(shape) if shape else (1,)
    if dims is None or len(dims) > 2 or dims[0] > acc.chips_per_host:
        raise UserError(
            f"{raw!r}: {acc.name} takes NAME (one GPU), NAME:GPUS for one host or NAME:GPUSxHOSTS, "
            f"with at most {acc.chips_per_host} GPUs per host"
        )
    per_host, hosts = dims[0], dims[1] if len(dims) == 2 else 1
    return Target(acc, f"1x{hosts}x{per_host}", per_host * hosts, hosts, raw)


def _dims(shape: str) -> tuple[int, ...] | None:
    if not re.fullmatch(r"\d+(x\d+)*", shape):
        return None
    dims = tuple(int(d) for d in shape.split("x"))
    return dims if all(d > 0 for d in dims) else None
