"""Device mesh, parameter partitioning and batch placement.

The mesh has three axes: ``data`` (batch), ``fsdp`` (batch, and parameters fully sharded across it)
and ``tensor`` (parameters split Megatron-style). Sizes come from the recipe's ``mesh`` section; -1
means "the rest of the devices". Parameters are placed by rules that look only at shapes:

  a dense kernel (d_in, d_out)     widening (d_out ≥ d_in): P(fsdp, tensor) — column parallel
                                   narrowing:               P(tensor, fsdp) — row parallel
  an embedding table (rows, d)     P(tensor, fsdp)
  everything else (biases, LayerNorms, the SSM kernels' few parameters, Toeplitz vectors): replicated
A dimension is only split when the axis size divides it. XLA inserts the collectives, so any rule is
correct; these only decide speed and memory. Batches are split over (data, fsdp).

Multi-host: `maybe_initialize_distributed` starts JAX's distributed runtime when the environment asks
for it (TPU pods and SLURM are detected by JAX; or set SSMLM_COORDINATOR, SSMLM_NUM_PROCESSES and
SSMLM_PROCESS_ID). Every process then feeds only its own rows of each global batch.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ssmlm import hosts
from ssmlm.errors import UserError
from ssmlm.models.layout import STACKED, is_stacked
from ssmlm.train_config import MeshConfig

BATCH_AXES = ("data", "fsdp")


def maybe_initialize_distributed() -> None:
    """Start jax.distributed when running under several processes; a no-op on one machine."""
    if getattr(jax.distributed, "is_initialized", lambda: False)():
        return
    coord = os.environ.get("SSMLM_COORDINATOR")
    if coord:
        if os.environ.get("JAX_PLATFORMS", "cpu").startswith("cpu"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU processes talk over gloo
        jax.distributed.initialize(
            coordinator_address=coord,
            num_processes=int(os.environ["SSMLM_NUM_PROCESSES"]),
            process_id=int(os.environ["SSMLM_PROCESS_ID"]),
            heartbeat_timeout_seconds=hosts.heartbeat_timeout(),
        )
    elif os.environ.get("SLURM_NTASKS", "1") != "1" or os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") > 0:
        # JAX reads the cluster from SLURM / the TPU metadata
        jax.distributed.initialize(heartbeat_timeout_seconds=hosts.heartbeat_timeout())


def barrier(name: str, what: str, setting: str = "SSMLM_BARRIER_TIMEOUT") -> None:
    """All processes wait here, at most ``setting``'s seconds, then stop with one line naming the missing hosts
    (a no-op with one process): ssmlm.hosts.barrier."""
    hosts.barrier(name, what, setting)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]
    if sizes.count(-1) > 1:
        raise UserError(f"mesh: at most one axis may be -1, got data={cfg.data} fsdp={cfg.fsdp} tensor={cfg.tensor}")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if n % known:
            raise UserError(f"mesh: {n} devices are not divisible by the fixed axes' product {known}")
        sizes[sizes.index(-1)] = n // known
    if int(np.prod(sizes)) != n:
        raise UserError(f"mesh: data x fsdp x tensor = {'x'.join(map(str, sizes))} does not use the {n} devices")
    return Mesh(np.array(devices).reshape(sizes), ("data", "fsdp", "tensor"))


def _spec(shape: tuple[int, ...], mesh: Mesh, path: str) -> P:
    if is_stacked(path):  # scanned layout: the leading layer axis is never sharded, the rest as one block's
        return P(None, *_spec(shape[1:], mesh, path.replace(f"/{STACKED}/", "/0/")))
    size = mesh.shape
    fits = lambda dim, axis: size[axis] > 1 and shape[dim] % size[axis] == 0  # noqa: E731
    if len(shape) != 2 or "ssm" in path or "spatial" in path:
        return P()
    if path.endswith("embedding"):
        return P("tensor" if fits(0, "tensor") else None, "fsdp" if fits(1, "fsdp") else None)
    if shape[1] >= shape[0]:
        return P("fsdp" if fits(0, "fsdp") else None, "tensor" if fits(1, "tensor") else None)
    return P("tensor" if fits(0, "tensor") else None, "fsdp" if fits(1, "fsdp") else None)


def param_shardings(params, mesh: Mesh):
    """A NamedSharding for every leaf of ``params`` (any pytree of arrays or ShapeDtypeStructs)."""

    def one(path, leaf):
        name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        return NamedSharding(mesh, _spec(tuple(leaf.shape), mesh, name))

    return jax.tree_util.tree_map_with_path(one, params)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(BATCH_AXES))


def check_batch(batch_size: int, mesh: Mesh, processes: int | None = None, grad_accum: int = 1) -> None:
    """Each micro-batch (``batch_size`` / ``grad_accum`` rows) splits over the mesh's batch axes and over the
    ``processes`` (default: this run's) that feed it."""
    ways = mesh.shape["data"] * mesh.shape["fsdp"]
    processes = jax.process_count() if processes is None else processes
    rows = batch_size // grad_accum
    what = f"train.batch_size = {batch_size}" + (
        f" / train.grad_accum = {grad_accum} = {rows} rows" if grad_accum > 1 else ""
    )
    if rows % ways:
        raise UserError(f"{what} must be divisible by the mesh's data x fsdp = {ways}")
    if rows % processes:
        raise UserError(f"{what} must be divisible by the {processes} processes")


def put_batch(local, sharding: NamedSharding):
    """Assemble the global batch (a Batch or dict of host arrays) from every process's local rows."""
    return jax.tree.map(lambda v: jax.make_array_from_process_local_data(sharding, v), local)
