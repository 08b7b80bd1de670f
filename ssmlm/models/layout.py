"""The two parameter layouts of a model's blocks, and conversion between them.

unrolled (model.scan_layers = false): one module per block
    encoders   encoder/layers/<i>/<rest>
    LMs        blocks/<i>/<rest>
scanned  (model.scan_layers = true): one module whose parameters carry a leading axis
    encoders   encoder/layers/block/<rest>       row g = block g
    LMs        blocks/block/<j>/<rest>           a group of p blocks (ssmlm.models.lm), member j = 0..p-1:
                                                 row g of member j = block g·p + j

An LM's blocks repeat with period p (p = 2 for bidirectional: alternate in the recurrences, else 1), so the
scanned LM holds one group of p blocks. A scanned tree shows its p (the number of members, ``group_size``); the
unrolled one does not, so converting to the scanned layout takes p from the target.

Everything here is a pure function of parameter trees (nnx.State, flat lists of (path, value), Orbax
metadata trees): a checkpoint written in one layout is converted on load into the other. Values may be
arrays, nnx Variables, or abstract ``jax.ShapeDtypeStruct`` (so a restore target can be converted too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

LAYERS = "layers"  # the encoders' blocks
BLOCKS = "blocks"  # the LMs' blocks, scanned in groups
GROUPED = {LAYERS: False, BLOCKS: True}  # key of a model's blocks -> whether its stacked block is a group
STACKED = "block"  # the key of the stacked block under `layers` / `blocks`


def _name(k) -> str:
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def _layers_at(path: tuple) -> int | None:
    """Position of the `layers` / `blocks` key in a path, when what follows it is a block index or the stacked
    block."""
    names = [_name(k) for k in path]
    for j, n in enumerate(names[:-1]):
        if n in GROUPED and (names[j + 1] == STACKED or names[j + 1].isdigit()):
            return j
    return None


def _keys(path) -> tuple:
    return tuple(path.split("/")) if isinstance(path, str) else tuple(path)


def is_stacked(path) -> bool:
    """True for a path (tuple of keys, or a "/"-joined string) inside the scanned layout's stacked block."""
    keys = _keys(path)
    j = _layers_at(keys)
    return j is not None and _name(keys[j + 1]) == STACKED


def _member(path: tuple, j: int) -> int | None:
    """The member index of a stacked path of a grouped container (at ``j``), None for an encoder's."""
    return int(_name(path[j + 2])) if GROUPED[_name(path[j])] else None


def _flat(tree) -> list:
    if isinstance(tree, nnx.Module):
        tree = nnx.state(tree, nnx.Param)
    return tree if isinstance(tree, list) else jax.tree_util.tree_flatten_with_path(tree)[0]


def layout_of(tree) -> str | None:
    """ "scanned", "unrolled", or None (no blocks) for any pytree of parameters or a model."""
    for path, _ in _flat(tree):
        if (j := _layers_at(path)) is not None:
            return "scanned" if _name(path[j + 1]) == STACKED else "unrolled"
    return None


def group_size(tree) -> int | None:
    """p, the blocks in a scanned LM's group (the number of members under ``blocks/block``), for any pytree of
    parameters or a model; None when it has no such group (unrolled, or an encoder)."""
    members = {m for path, _ in _flat(tree) if is_stacked(path) and (m := _member(path, _layers_at(path))) is not None}
    return len(members) or None


def unstacked_path(path: tuple, g: int, group: int = 1) -> tuple:
    """The unrolled path of row ``g`` of a stacked leaf: block g, or for member j of an LM's group of
    ``group`` blocks, block g·group + j."""
    j = _layers_at(path)
    m = _member(path, j)
    if m is None:
        return (*path[: j + 1], g, *path[j + 2 :])
    return (*path[: j + 1], g * group + m, *path[j + 3 :])


def _stacked_path(path: tuple, j: int, group: int) -> tuple[tuple, int]:
    """(the stacked path, the row) of an unrolled block's leaf, its container key at ``j``."""
    i = int(_name(path[j + 1]))
    if GROUPED[_name(path[j])]:
        return (*path[: j + 1], STACKED, i % group, *path[j + 2 :]), i // group
    return (*path[: j + 1], STACKED, *path[j + 2 :]), i


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


def stack_layers(flat: list[tuple[tuple, object]], group: int = 1) -> list[tuple[tuple, object]]:
    """Unrolled → scanned: ``layers/<i>/rest`` for i = 0..n-1 become one ``layers/block/rest`` of n rows; an
    LM's ``blocks/<i>/rest`` become ``blocks/block/<i mod group>/rest`` of n / group rows (row i // group)."""
    out, groups, blocks = [], {}, {}
    for path, v in flat:
        j = _layers_at(path)
        if j is None or is_stacked(path):
            out.append((path, v))
            continue
        key, row = _stacked_path(path, j, group)
        if key not in groups:
            groups[key] = {}
            out.append((key, None))  # placeholder keeps the tree's order
        groups[key][row] = v
        if GROUPED[_name(path[j])]:
            blocks.setdefault(tuple(map(_name, path[: j + 1])), set()).add(int(_name(path[j + 1])))
    for where, indices in blocks.items():
        if len(indices) % group:
            raise ValueError(f"{'/'.join(where)}: {len(indices)} blocks are not whole groups of {group}")
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
    """Scanned → unrolled: ``layers/block/rest`` of n rows becomes ``layers/<i>/rest`` for i = 0..n-1, and an
    LM's ``blocks/block/<j>/rest`` of G rows (p members) becomes ``blocks/<g·p + j>/rest``; ordered block by
    block as an unrolled model lists them."""
    group = group_size(flat) or 1  # a model has one set of blocks, so one p
    out, per_layer = [], {}
    for path, v in flat:
        if not is_stacked(path):
            out.append((path, v))
            continue
        at = _layers_at(path) + 1
        for g in range(_raw(v).shape[0]):
            one = unstacked_path(path, g, group)
            per_layer.setdefault(int(_name(one[at])), []).append((one, _take(v, g)))
    # blocks go where the first stacked leaf was, so the order matches an unrolled model's flat state
    first = next((k for k, (p, _) in enumerate(flat) if is_stacked(p)), len(out))
    blocks = [item for i in sorted(per_layer) for item in per_layer[i]]
    return out[:first] + blocks + out[first:]


# ----------------------------------------------------------------------------- whole trees


def to_layout(params, target, group: int | None = None):
    """``params`` (an nnx.State or a flat list of (path, value)) in the layout of ``target`` (a model, a
    State, any pytree such as Orbax checkpoint metadata, or "scanned" / "unrolled"). An LM's group size p
    comes from a scanned ``target`` (else ``group``, default 1); scanned params of another p are regrouped.
    Unchanged when the layouts already agree."""
    want, have = target if isinstance(target, str) else layout_of(target), layout_of(params)
    if want is None or have is None:
        return params
    if group is None and not isinstance(target, str):
        group = group_size(target)
    if want == have and (want == "unrolled" or group is None or group == group_size(params)):
        return params
    flat = params if isinstance(params, list) else list(nnx.to_flat_state(params))
    if have == "scanned":
        flat = unstack_layers(flat)
    if want == "scanned":
        flat = stack_layers(flat, group or 1)
    return flat if isinstance(params, list) else nnx.from_flat_state(flat)
