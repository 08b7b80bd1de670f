"""The two parameter layouts of an encoder's blocks, and conversion between them.

unrolled (model.scan_layers = false): one module per block, paths  encoder/layers/<i>/<rest>
scanned  (model.scan_layers = true):  one module whose parameters carry a leading layer axis,
                                      paths  encoder/layers/block/<rest>, leaf i = block i

Everything here is a pure function of parameter trees (nnx.State, flat lists of (path, value), Orbax
metadata trees): a checkpoint written in one layout is converted on load into the other. Values may be
arrays, nnx Variables, or abstract ``jax.ShapeDtypeStruct`` (so a restore target can be converted too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

LAYERS = "layers"
STACKED = "block"  # the key of the stacked block under `layers`


def _name(k) -> str:
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def _layers_at(path: tuple) -> int | None:
    """Position of the `layers` key in a path, when what follows it is a block index or the stacked block."""
    names = [_name(k) for k in path]
    for j, n in enumerate(names[:-1]):
        if n == LAYERS and (names[j + 1] == STACKED or names[j + 1].isdigit()):
            return j
    return None


def is_stacked(path) -> bool:
    """True for a path (tuple of keys, or a "/"-joined string) inside the scanned layout's stacked block."""
    keys = tuple(path.split("/")) if isinstance(path, str) else tuple(path)
    j = _layers_at(keys)
    return j is not None and _name(keys[j + 1]) == STACKED


def layout_of(tree) -> str | None:
    """ "scanned", "unrolled", or None (no blocks) for any pytree of parameters or a model."""
    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree, nnx.Param)
    flat = tree if isinstance(tree, list) else jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, _ in flat:
        if (j := _layers_at(path)) is not None:
            return "scanned" if _name(path[j + 1]) == STACKED else "unrolled"
    return None


def unstacked_path(path: tuple, i: int) -> tuple:
    j = _layers_at(path)
    return (*path[: j + 1], i, *path[j + 2 :])


# ----------------------------------------------------------------------------- values


def _raw(v):
    return v.get_value() if isinstance(v, nnx.Variable) else v


def _like(v, value):
    return v.replace(value) if isinstance(v, nnx.Variable) else value


def _stack(values: list):
    raws = [_raw(v) for v in values]
    if isinstance(raws[0], jax.ShapeDtypeStruct):
        x = raws[0]
        value = jax.ShapeDtypeStruct((len(raws), *x.shape), x.dtype, sharding=None)
    else:
        value = jnp.stack(raws)
    return _like(values[0], value)


def _take(v, i: int):
    x = _raw(v)
    value = jax.ShapeDtypeStruct(x.shape[1:], x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x[i]
    return _like(v, value)


# ----------------------------------------------------------------------------- flat states


def stack_layers(flat: list[tuple[tuple, object]]) -> list[tuple[tuple, object]]:
    """Unrolled → scanned: ``layers/<i>/rest`` for i = 0..n-1 become one ``layers/block/rest`` of n rows."""
    out, groups = [], {}
    for path, v in flat:
        j = _layers_at(path)
        if j is None or is_stacked(path):
            out.append((path, v))
            continue
        key = (*path[: j + 1], STACKED, *path[j + 2 :])
        if key not in groups:
            groups[key] = {}
            out.append((key, None))  # placeholder keeps the tree's order
        groups[key][int(_name(path[j + 1]))] = v
    result = []
    for path, v in out:
        if v is None and path in groups:
            rows = groups[path]
            if sorted(rows) != list(range(len(rows))):
                raise ValueError(f"layers of {'/'.join(map(str, path))}: indices {sorted(rows)} are not 0..n-1")
            v = _stack([rows[i] for i in range(len(rows))])
        result.append((path, v))
    return result


def unstack_layers(flat: list[tuple[tuple, object]]) -> list[tuple[tuple, object]]:
    """Scanned → unrolled: ``layers/block/rest`` of n rows becomes ``layers/<i>/rest`` for i = 0..n-1,
    ordered block by block as an unrolled model lists them."""
    out, per_layer = [], {}
    for path, v in flat:
        if not is_stacked(path):
            out.append((path, v))
            continue
        n = _raw(v).shape[0]
        for i in range(n):
            per_layer.setdefault(i, []).append((unstacked_path(path, i), _take(v, i)))
    # blocks go where the first stacked leaf was, so the order matches an unrolled model's flat state
    first = next((k for k, (p, _) in enumerate(flat) if is_stacked(p)), len(out))
    blocks = [item for i in sorted(per_layer) for item in per_layer[i]]
    return out[:first] + blocks + out[first:]


# ----------------------------------------------------------------------------- whole trees


def to_layout(params, target):
    """``params`` (an nnx.State or a flat list of (path, value)) in the layout of ``target`` (a model, a
    State, any pytree such as Orbax checkpoint metadata, or "scanned" / "unrolled"). Unchanged when the
    layouts already agree."""
    want, have = target if isinstance(target, str) else layout_of(target), layout_of(params)
    if want is None or have is None or want == have:
        return params
    flat = params if isinstance(params, list) else list(nnx.to_flat_state(params))
    flat = stack_layers(flat) if want == "scanned" else unstack_layers(flat)
    return flat if isinstance(params, list) else nnx.from_flat_state(flat)
