"""The jitted update (ssmlm.train.loop.make_train_step): a step whose loss or gradient is not finite changes
neither the parameters nor the optimizer state and reports skipped = 1; a finite one updates both."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ssmlm.train.loop import make_train_step


def loss_fn(model, batch, rng):
    # batch["scale"] = inf makes the loss and every gradient non-finite
    loss = jnp.mean((model(batch["x"]) * batch["scale"]) ** 2)
    return loss, {}


def test_non_finite_step_changes_nothing():
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(1e-2)
    step = make_train_step(loss_fn, tx, graphdef, seed=0)
    x = jnp.ones((4, 3))
    copy = lambda t: jax.tree.map(lambda a: np.array(a), t)  # noqa: E731 (the step donates its inputs)

    p0, o0 = copy(params), copy(tx.init(params))
    p1, o1, m = step(jax.tree.map(jnp.asarray, p0), jax.tree.map(jnp.asarray, o0), {"x": x, "scale": jnp.inf}, 0)
    assert float(m["skipped"]) == 1.0 and float(m["loss"]) == 0.0
    for a, b in zip(jax.tree.leaves(p0) + jax.tree.leaves(o0), jax.tree.leaves(p1) + jax.tree.leaves(o1), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    p2, o2, m = step(jax.tree.map(jnp.asarray, p0), jax.tree.map(jnp.asarray, o0), {"x": x, "scale": 1.0}, 1)
    assert float(m["skipped"]) == 0.0 and np.isfinite(float(m["loss"])) and float(m["loss"]) > 0
    changed = [
        not np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p2), strict=True)
    ]
    assert all(changed)
    assert int(jax.tree.leaves(o2)[0]) == 1  # adam's count moved on


def test_accumulation_equals_the_whole_batch_and_keeps_bfloat16_parameters():
    """grad_accum 2 gives the whole batch's update (micro-batch i: every other row); bfloat16 parameters stay
    bfloat16 (the gradients are summed in float32 and cast back: before, the optimizer state changed dtype and
    the step did not compile)."""

    def mse(model, batch, rng):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2), {}

    x = jax.random.normal(jax.random.key(1), (8, 3))
    batch = {"x": x, "y": jnp.sin(x[:, :2])}
    for dtype in (jnp.float32, jnp.bfloat16):
        graphdef, params = nnx.split(nnx.Linear(3, 2, param_dtype=dtype, rngs=nnx.Rngs(0)), nnx.Param)
        tx = optax.adam(0.1)  # its moments take the parameters' dtype
        copy = lambda t: jax.tree.map(jnp.array, t)  # noqa: E731 (the step donates its inputs)
        whole = make_train_step(mse, tx, graphdef, seed=0)(copy(params), tx.init(params), batch, 0)[0]
        accum = make_train_step(mse, tx, graphdef, seed=0, grad_accum=2)(copy(params), tx.init(params), batch, 0)[0]
        for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(accum), strict=True):
            assert a.dtype == b.dtype == dtype
            tol = 1e-6 if dtype == jnp.float32 else 1e-2
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)
