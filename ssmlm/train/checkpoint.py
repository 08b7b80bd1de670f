"""Orbax checkpoints of a run: parameters, optimizer state and a JSON manifest (step, data position,
metrics). Saves are asynchronous and committed atomically (Orbax writes to a temporary directory and
renames it), so an interrupted save never becomes the latest checkpoint.

Layout: RUN/checkpoints/<step>/{params, opt_state, meta}.
"""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as cm

from ssmlm.errors import CheckpointError


class Checkpoints:
    def __init__(self, run_dir: Path, keep: int = 2, best: str | None = None):
        """Keep the newest ``keep`` checkpoints, plus the best one by validation metric ``best`` (lower
        is better for losses and perplexity, higher for everything else)."""
        self.dir = (Path(run_dir) / "checkpoints").resolve()  # Orbax needs absolute paths
        self.best = best
        policy = cm.LatestN(n=keep)
        if best:
            lower = "loss" in best or "perplexity" in best
            policy = cm.AnyPreservationPolicy(
                [
                    policy,
                    cm.BestN(
                        get_metric_fn=lambda m: m[best], reverse=lower, n=1, keep_checkpoints_without_metrics=False
                    ),
                ]
            )
        opts = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=True, preservation_policy=policy)
        self.mgr = ocp.CheckpointManager(self.dir, options=opts)

    def latest_step(self) -> int | None:
        return self.mgr.latest_step()

    def save(self, step: int, params, opt_state, meta: dict, eval_metrics: dict | None = None) -> None:
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta),
        )
        metrics = eval_metrics if (self.best and eval_metrics and self.best in eval_metrics) else None
        self.mgr.save(step, args=args, force=True, metrics=metrics)

    def best_step(self) -> int | None:
        return self.mgr.best_step() if self.best else None

    def restore(self, step: int, abstract_params, abstract_opt_state):
        r = self.mgr.restore(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardRestore(abstract_params),
                opt_state=ocp.args.StandardRestore(abstract_opt_state),
                meta=ocp.args.JsonRestore(),
            ),
        )
        return r.params, r.opt_state, r.meta

    def wait(self) -> None:
        self.mgr.wait_until_finished()

    def close(self) -> None:
        self.mgr.wait_until_finished()
        self.mgr.close()


def load_params(run_dir: Path, abstract_params, step: int | None = None):
    """Parameters (and the manifest) of a run's newest (or given) checkpoint, without optimizer state."""
    ckpt_dir = (Path(run_dir) / "checkpoints").resolve()
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no checkpoints/ directory; is this an ssmlm run directory?")
    # Read onto this process's first device, whatever mesh wrote the checkpoint.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract_params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None) or device),
        abstract_params,
    )
    with ocp.CheckpointManager(ckpt_dir) as mgr:
        step = step if step is not None else mgr.latest_step()
        if step is None:
            raise CheckpointError(f"{run_dir}: holds no complete checkpoint")
        try:
            r = mgr.restore(
                step,
                args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore()),
            )
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{run_dir}: checkpoint {step} does not fit the model: {str(e)[:200]}") from None
    return r.params, r.meta
