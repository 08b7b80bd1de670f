"""Weight transfer between runs: a new model starts from a source run's parameters (extend-length, finetune).

Parameters whose path exists in both are copied; a longer position table is tiled (or left fresh); a
family's other length-dependent parameters grow through its ``extend_params``; a new head starts fresh.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from ssmlm.errors import CheckpointError
from ssmlm.models.layout import to_layout


def transplant(target: nnx.Module, source_params, position_init: str = "tile", extend=None) -> dict[str, int]:
    """Copy every source parameter whose path exists in ``target`` into it.

    Equal shapes are copied. A longer position table (extend-length) keeps the source rows and fills
    the new ones by tiling them (as Longformer does) or leaves them at their fresh initialisation.
    Parameters only in the target (a new head) keep their initialisation. ``extend(path, old, new_shape)``
    is the model family's hook for other length-dependent parameters (gMLP's spatial weights).
    """
    tgt_state = nnx.state(target, nnx.Param)
    src = dict(nnx.to_flat_state(to_layout(source_params, tgt_state)))  # unrolled ↔ scanned blocks
    report = {"copied": 0, "extended": 0, "fresh": 0}
    flat = []
    for path, var in nnx.to_flat_state(tgt_state):
        if path not in src:
            report["fresh"] += 1
            flat.append((path, var))
            continue
        new, old = var.get_value(), src[path].get_value()
        if new.shape == old.shape:
            value = old
            report["copied"] += 1
        elif path[-2:] == ("position", "embedding") and new.shape[0] > old.shape[0]:
            n_old = old.shape[0]
            if position_init == "tile":
                reps = -(-new.shape[0] // n_old)
                value = jnp.tile(old, (reps, 1))[: new.shape[0]]
            else:
                value = new.at[:n_old].set(old)
            report["extended"] += 1
        elif extend is not None and (grown := extend(path, old, new.shape)) is not None:
            value = grown
            report["extended"] += 1
        elif path[0] == "classifier":  # a new label space (e.g. MRPC from an MNLI run): fresh classifier
            report["fresh"] += 1
            flat.append((path, var))
            continue
        else:
            raise CheckpointError(
                f"cannot load parameter {'/'.join(map(str, path))}: checkpoint shape {old.shape}, model {new.shape}"
            )
        flat.append((path, var.replace(value)))
    nnx.update(target, nnx.from_flat_state(flat))
    return report
