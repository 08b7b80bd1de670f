"""What a training step is, apart from where it runs: the model's graph, the loss, the optimizer, the mesh and the
shardings and shapes of every argument.

The run and the ahead-of-time check are made of the same pieces. The run (ssmlm.train.loop) takes its
shardings from ``step_shardings`` and jits ``make_train_step`` with them, traced under the run's mesh on this
machine's devices. `--dry-run --target` (ssmlm.train.aot) builds a StepSpec of the same pieces around an abstract
model (``nnx.eval_shape``: nothing allocated) over a named TPU slice's or GPU node's devices and compiles it inside
``compiling_for(platform)``, so a model's ``auto`` choices (scan and attention paths) follow the platform compiled
for; in a run that platform is the machine's own. Both see the same mesh, shardings, ``grad_accum``, remat and
dtypes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ssmlm.train.mesh import BATCH_AXES, batch_sharding, param_shardings


def make_train_step(
    loss_fn: Callable, tx: optax.GradientTransformation, graphdef, seed: int, shardings=None, grad_accum: int = 1
):
    """The jitted update: (params, opt_state, batch, step) -> (params, opt_state, metrics).

    Dropout keys are fold_in(seed, step), so a step's randomness does not depend on how it was reached.
    With ``grad_accum`` > 1 the batch is split into that many micro-batches whose gradients are averaged
    before one update (same result as the whole batch, less activation memory). A step whose loss or
    gradient is not finite changes nothing and reports ``skipped`` = 1.

    Micro-batch i is rows i, i + grad_accum, i + 2·grad_accum, … of the batch: every device holds its share of
    each micro-batch already (the batch is split over devices in contiguous blocks), so no row moves between
    devices, and with ``shardings`` the micro-batches and the summed gradients are pinned to the batch's and the
    parameters' shardings. Without that, XLA put the micro-batch axis on the devices: a micro-batch lived on one
    device and the accumulated step needed more memory than the whole batch at once.
    """
    p_sh, o_sh, b_sh = shardings if shardings is not None else (None, None, None)
    pin = lambda tree, sh: tree if sh is None else jax.lax.with_sharding_constraint(tree, sh)  # noqa: E731

    def grads_of(params, batch, rng):
        def loss_of(p):
            return loss_fn(nnx.merge(graphdef, p), batch, rng)

        return jax.value_and_grad(loss_of, has_aux=True)(params)

    def micro_batches(batch):
        def split(x):
            x = x.reshape(x.shape[0] // grad_accum, grad_accum, *x.shape[1:]).swapaxes(0, 1)
            return x if b_sh is None else pin(x, NamedSharding(b_sh.mesh, P(None, BATCH_AXES)))

        return jax.tree.map(split, batch)

    def accumulated(params, batch, rng):
        micro = micro_batches(batch)

        def weighted(p, i):
            # Each micro-batch's loss is a mean over its own tokens; weighting by the token count
            # makes the accumulated update equal to the whole batch's.
            (loss, aux), grads = grads_of(p, jax.tree.map(lambda x: x[i], micro), jax.random.fold_in(rng, i))
            w = aux.get("weight", 1.0)
            grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)  # summed in float32 (bf16 parameters)
            loss, aux, grads = jax.tree.map(lambda x: x * w, (loss, aux, grads))
            return w, (loss, aux, pin(grads, p_sh))

        def one(acc, i):
            # the barrier makes micro-batch i wait for the sum so far: XLA may not run two micro-batches at once
            # (it did with a loop of one or two trips, which it unrolls, and then held both at once)
            p, acc = jax.lax.optimization_barrier((params, acc))
            total_w, (loss, aux, grads) = jax.tree.map(jnp.add, acc, weighted(p, i))
            return (total_w, (loss, aux, pin(grads, p_sh))), None

        zero = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(weighted, params, 0))
        (total_w, (loss, aux, grads)), _ = jax.lax.scan(one, zero, jnp.arange(grad_accum))
        loss, aux = jax.tree.map(lambda x: x / total_w, (loss, aux))
        # the mean gradient in each parameter's own dtype, as one batch's would be
        return loss, aux, jax.tree.map(lambda g, p: (g / total_w).astype(p.dtype), grads, params)

    def train_step(params, opt_state, batch, step):
        rng = jax.random.fold_in(jax.random.key(seed), step)  # traced: nothing runs before the step is compiled
        if grad_accum == 1:
            (loss, aux), grads = grads_of(params, batch, rng)
        else:
            loss, aux, grads = accumulated(params, batch, rng)
        # gradients laid out as their parameters: under fsdp each device then sums only its own shard of every
        # gradient (a reduce-scatter), where XLA otherwise all-reduced the whole gradient and sliced it later
        grads = pin(grads, p_sh)
        aux = {k: v for k, v in aux.items() if k != "weight"}
        gnorm = optax.tree.norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)

        def update(_):
            updates, new_opt = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_opt

        # One cond rather than a where per leaf: XLA copied the `ok` test into every leaf's fusion, which made the
        # step compile 1.5-2x longer (benchmarks/compile.py, BiGS d 256) at no gain in step time.
        new_params, new_opt = jax.lax.cond(ok, update, lambda _: (params, opt_state), None)
        metrics = {
            "loss": jnp.where(ok, loss, 0.0),
            "grad_norm": jnp.where(ok, gnorm, 0.0),
            "skipped": 1.0 - ok.astype(jnp.float32),
            **{k: jnp.where(ok, v, 0.0) for k, v in aux.items()},  # a skipped step adds nothing to the window's sums
        }
        return new_params, new_opt, metrics

    if shardings is None:  # parameters and optimizer state are replaced every step: reuse their buffers
        return jax.jit(train_step, donate_argnums=(0, 1))
    return jax.jit(
        train_step, in_shardings=(p_sh, o_sh, b_sh, None), out_shardings=(p_sh, o_sh, None), donate_argnums=(0, 1)
    )


def step_shardings(params, tx: optax.GradientTransformation, mesh: Mesh) -> tuple:
    """(parameters, optimizer state, batch) shardings on ``mesh`` for parameters (arrays or abstract)."""
    p_sh = param_shardings(params, mesh)
    o_sh = param_shardings(jax.eval_shape(tx.init, params), mesh)
    return p_sh, o_sh, batch_sharding(mesh)


@dataclass
class StepSpec:
    """Everything the jitted training step is made of; ``params`` may be real arrays or ShapeDtypeStructs."""

    loss_fn: Callable
    tx: optax.GradientTransformation
    graphdef: Any
    params: Any  # nnx.State of the parameters
    mesh: Mesh
    batch: Any  # the global batch's abstract arrays (a Batch of ShapeDtypeStruct)
    seed: int
    grad_accum: int
    platform: str  # cpu | gpu | tpu: what the step is compiled for (the models' auto choices follow it)

    def __post_init__(self):
        self.shardings = step_shardings(self.params, self.tx, self.mesh)

    def jitted(self):
        return make_train_step(self.loss_fn, self.tx, self.graphdef, self.seed, self.shardings, self.grad_accum)

    def abstract_args(self) -> tuple:
        """(params, opt_state, batch, step) as ShapeDtypeStructs carrying their shardings."""
        p_sh, o_sh, b_sh = self.shardings
        shaped = lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)  # noqa: E731
        params = jax.tree.map(shaped, self.params, p_sh)
        opt_state = jax.tree.map(shaped, jax.eval_shape(self.tx.init, self.params), o_sh)
        batch = jax.tree.map(lambda x: shaped(x, b_sh), self.batch)
        return params, opt_state, batch, jax.ShapeDtypeStruct((), jnp.int32)

    def traced(self, fn: Callable):
        """``fn()`` with the models' platform choices and the mesh of this step in effect (tracing, lowering)."""
        from ssmlm.models.platform import compiling_for

        with compiling_for(self.platform), jax.set_mesh(self.mesh):
            return fn()

    def lower(self):
        return self.traced(lambda: self.jitted().lower(*self.abstract_args()))
