"""Masked multi-head attention for packed rows: the Transformer LM's attention (ssmlm.models.transformer_lm),
computed several ways that return the same values, and its decoding form over a KV cache.

A packed row holds several samples, each a run of one segment id, then padding (segment 0). Query q may attend
to key k when (the prefix term only in a bidirectional, prefix-LM layer)

    allowed(q, k) = [(prefix_q ∧ prefix_k) ∨ k ≤ q] ∧ segment_q = segment_k ∧ segment_k ≠ 0

and gets softmax(q kᵀ/√d_h) v over its allowed keys; a query with no allowed key (exactly the padding ones, as
every other query sees itself) gets 0. ``impl`` picks how:

    dense      the full masked (B, H, L, L) score matrix (ssmlm.models.layers.attend): the reference, and the
               only one forward-mode autodiff (jax.jvp, jacfwd) goes through.
    blockwise  queries and keys in blocks of ``block`` positions; query block i reads only key blocks
               ⌊lo_i/block⌋ … ⌊hi_i/block⌋, where [lo_i, hi_i] is the span of keys its queries may see (from the
               first key of their sample to the last of its prefix, or to the query itself). Most of a packed
               row's L × L pairs belong to other samples or the causal future: with 4 samples of L/4 the dense
               matrix is ≥ 3/4 masked, and this skips it. Exact softmax by the online (flash-attention)
               recurrence; a jax.custom_vjp with a blockwise backward that recomputes the scores from the saved
               log-sum-exp, so memory is O(L · block) per head, not O(L²), in both passes. Each (row, query
               block) has its own key range, so one row's layout never costs another row work.
    cudnn      jax.nn.dot_product_attention's cuDNN kernel with the boolean mask (GPU only; bf16/fp16 inputs,
               head size a multiple of 8); padding queries are zeroed after the call, as cuDNN gives them the
               mean of the values.
    splash     jax's Pallas splash attention for TPU (jax.experimental.pallas.ops.tpu.splash_attention, as MaxText
               uses it), causal layers only: its mask is static (known at compile time) and combined in the
               kernel with dynamic segment ids, allowed = k ≤ q ∧ segment_q = segment_k, which is the mask above
               for every real query; padding queries are zeroed after the call. A prefix-LM layer's mask depends
               on each row's prefix, which a static mask cannot say, so those layers stay dense. Not compiling for
               a TPU it runs in Pallas's interpreter (slow: for tests).
    auto       by the platform the step is compiled for (ssmlm.models.platform.backend), not the host: blockwise
               on CPU; on a GPU cudnn where cuDNN takes the inputs and this host has the cuDNN library to compile
               it with (platform.cudnn_available), else dense (the blockwise loop runs one small block at a
               time, which suits a CPU core, not an accelerator); on a TPU splash for causal layers, dense for
               prefix-LM ones. ``attention_choice`` says which and why, for reports.

The blockwise spans need no assumption on the layout: they come from sorting each row by segment, so a sample
split into several runs is still attended exactly (with less skipping). Scores are float32 whatever the compute
dtype, as in the dense path; the two agree to float32 rounding (tests/test_attention.py).

``attend_cache`` is decoding's form: one new query per row over a KV cache of which only slots 0..lengths are
filled. It reads the cache in blocks up to the one holding the longest row's last slot, so a step costs the
filled length, not the cache's size.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ssmlm.models import platform
from ssmlm.models.layers import MASK_VALUE, attend

__all__ = ["IMPLS", "attend_cache", "attention_choice", "attention_mask", "resolve", "segment_attention"]

IMPLS = ("auto", "dense", "blockwise", "cudnn", "splash")
# Query and key block size of the blockwise path. Measured on CPU (2 shared cores), forward + backward at L 2048,
# B 2, H 4, d_h 64: with 4 samples per row 64 / 128 / 256 / 512 took 135 / 124 / 134 / 146 ms (dense 550 ms); with
# one sample 508 / 455 / 529 / 433 ms (dense 551 ms). Smaller blocks skip more but pay more per-block overhead.
BLOCK = 128
# Cache slots read per iteration of attend_cache's loop: 64, 128 and 256 within noise of each other for a cache
# filled to 64 or 2000 (B 1 and 8, CPU); 512 slower.
DECODE_BLOCK = 128
# The splash path's query and key block: the largest of these dividing the row (padded to a multiple of 128, the
# kernel's lane width). 512: MaxText's default for every splash block (MaxText at 315ebb5, MaxText/configs/base.yml,
# sa_block_q and the rest).
SPLASH_BLOCKS = (512, 256, 128)
# Mesh axes the batch is split over (ssmlm.train.mesh.BATCH_AXES) and the one heads may be split over: the splash
# kernel runs per device inside shard_map (a Mosaic kernel cannot be partitioned by XLA).
BATCH_AXES, HEAD_AXIS = ("data", "fsdp"), "tensor"


def attention_mask(ctx, bidirectional: bool):
    """allowed (B, L_q, L_k) bool for one packed row per batch entry (module docstring); ``ctx`` has
    segment_ids (B, L) int (0 = padding) and prefix (B, L) bool (ssmlm.models.lm_context.Context)."""
    seg, n = ctx.segment_ids, ctx.segment_ids.shape[1]
    see = jnp.tril(jnp.ones((n, n), bool))[None]  # k ≤ q
    if bidirectional:
        see = see | (ctx.prefix[:, :, None] & ctx.prefix[:, None, :])
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
    return see & same


def attention_choice(impl: str, dtype, head_size: int, bidirectional: bool) -> tuple[str, str]:
    """(the implementation ``impl`` stands for, why) for one layer: inputs of ``dtype`` and ``head_size``, a
    prefix-LM layer if ``bidirectional``; auto decided for the platform being compiled for (module docstring)."""
    if impl not in IMPLS:
        raise ValueError(f"attention {impl!r}: expected one of {', '.join(IMPLS)}")
    if impl == "splash" and bidirectional:
        raise ValueError(
            "attention splash: a prefix-LM (bidirectional) layer's mask depends on the data, which splash's static "
            "masks cannot express; use auto or dense"
        )
    if impl != "auto":
        return impl, "model.attention"
    target = platform.backend()
    if target == "cpu":
        return "blockwise", "auto for cpu: skips the masked blocks, one block at a time"
    if target == "tpu":
        if bidirectional:
            return "dense", "auto for tpu, prefix-LM layer: splash's masks are static, the prefix is not"
        if jax.sharding.get_abstract_mesh().empty and jax.device_count() > 1:
            return "dense", "auto for tpu, no mesh in context to run splash per device on"  # e.g. decoding
        return "splash", "auto for tpu, causal layer"
    if target != "gpu":
        return "dense", f"auto for {target}"
    # cuDNN's flash attention refuses float32 and other head sizes
    if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16) or head_size % 8 or head_size > 128:
        return "dense", "auto for gpu: cuDNN takes bf16/fp16 and head sizes ≤ 128, multiples of 8"
    if not platform.cudnn_available():
        return "dense", "auto for gpu: cuDNN not installed on this host; a GPU machine with cuDNN uses cudnn"
    return "cudnn", "auto for gpu"


def resolve(impl: str, dtype, head_size: int, bidirectional: bool) -> str:
    """The implementation ``impl`` stands for (``attention_choice``)."""
    return attention_choice(impl, dtype, head_size, bidirectional)[0]


def segment_attention(q, k, v, ctx, bidirectional: bool, impl: str = "auto", block: int = BLOCK):
    """softmax(q kᵀ/√d_h) v over the allowed keys (module docstring) for q, k, v (B, L, H, d_h) and ``ctx``
    (segment_ids, prefix: (B, L)) -> (B, L, H, d_h) in v's dtype, 0 for padding queries."""
    impl = resolve(impl, q.dtype, q.shape[-1], bidirectional)
    if impl == "splash":
        return splash_attention(q, k, v, ctx.segment_ids, interpret=platform.backend() != "tpu")
    if impl == "dense":
        return attend(q, k, v, attention_mask(ctx, bidirectional))
    if impl == "cudnn":
        mask = attention_mask(ctx, bidirectional)[:, None]  # (B, 1, L, L): broadcast over heads
        out = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="cudnn")
        return jnp.where((ctx.segment_ids != 0)[:, :, None, None], out, 0).astype(v.dtype)
    n = q.shape[1]
    nb = -(-n // block)
    pad = nb * block - n  # padded positions are segment 0: never attended, their outputs cut off below
    seg = jnp.pad(jnp.asarray(ctx.segment_ids, jnp.int32), ((0, 0), (0, pad)))
    prefix = jnp.pad(jnp.asarray(ctx.prefix, bool), ((0, 0), (0, pad))) & bidirectional
    # a barrier, so XLA does not constant-fold the sorts when the layout is a constant (one sample per row, as
    # in prefill): folding a sort of 4096 positions takes seconds of compile time
    lo, hi = jax.vmap(key_span)(*jax.lax.optimization_barrier((seg, prefix)))
    first = jnp.min(lo.reshape(-1, nb, block), axis=-1) // block  # (B, nb): key blocks of query block i
    last = jnp.max(hi.reshape(-1, nb, block), axis=-1) // block  # empty (first > last) for all-padding
    blocks = lambda x: jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(x.shape[0], nb, block, *x.shape[2:])
    out = _flash(blocks(q), blocks(k), blocks(v), seg, prefix, first, last)
    return out.reshape(q.shape[0], nb * block, *q.shape[2:])[:, :n]


def key_span(seg, prefix):
    """For each query of one row (seg (L,) int, prefix (L,) bool, already False in a causal layer): the first
    and last key it may attend, lo = the first position of its segment, hi = its own position or, on a
    prefix, the last prefix position of its segment; padding gets the empty span (L, -1).

    Found by sorting positions by segment and binary search (O(L log L)), so a segment need not be one run."""
    n = seg.shape[0]
    pos = jnp.arange(n, dtype=jnp.int32)
    # sorted by (segment, position): a segment's first position heads its run
    s_seg, s_pos = jax.lax.sort((seg, pos), num_keys=2)
    lo = s_pos[jnp.searchsorted(s_seg, seg, side="left")]
    # sorted by (segment, prefix, position): the run's last entry is its last prefix position if it has one
    s_seg, s_pre, s_pos = jax.lax.sort((seg, prefix.astype(jnp.int32), pos), num_keys=3)
    end = jnp.searchsorted(s_seg, seg, side="right") - 1
    hi = jnp.where(prefix, jnp.maximum(pos, jnp.where(s_pre[end] == 1, s_pos[end], -1)), pos)
    real = seg != 0
    return jnp.where(real, lo, n), jnp.where(real, hi, -1)


# ---- splash (TPU): jax.experimental.pallas.ops.tpu.splash_attention ----


def splash_attention(q, k, v, segment_ids, interpret: bool = False):
    """Causal attention within segments by the splash kernel: q, k, v (B, L, H, d_h), segment_ids (B, L) int
    (0 = padding) -> (B, L, H, d_h) in v's dtype, 0 for padding queries; the causal layer's segment_attention.
    ``interpret``: run the kernel in Pallas's interpreter (any platform; slow).

    The row is padded to a multiple of 128 positions with segment 0, which no real query attends. A padding query
    attends to the earlier padding (at least itself), so no softmax row is empty, and its output is zeroed. Splash
    does not scale the scores: q is scaled by 1/√d_h first, in float32, as the dense path scales q kᵀ."""
    n, d = q.shape[1], q.shape[-1]
    length = -(-n // 128) * 128
    pad = lambda x: jnp.pad(x, ((0, 0), (0, length - n)) + ((0, 0),) * (x.ndim - 2))  # noqa: E731
    q = (q.astype(jnp.float32) / math.sqrt(d)).astype(q.dtype)
    seg = pad(jnp.asarray(segment_ids, jnp.int32))
    out = _splash_over_mesh(pad(q), pad(k), pad(v), seg, interpret)[:, :n]
    return jnp.where((seg[:, :n] != 0)[:, :, None, None], out, 0).astype(v.dtype)


def _splash_over_mesh(q, k, v, seg, interpret: bool):
    """The kernel on each device's share of the batch (and of the heads, over HEAD_AXIS where that divides them)
    under the mesh in context (jax.set_mesh), by jax.shard_map: XLA cannot partition a Mosaic kernel itself
    ("Mosaic kernels cannot be automatically partitioned"), as MaxText wraps it (MaxText at 492d01d,
    MaxText/layers/attention_op.py, AttentionOp.tpu_flash_attention). Without a mesh the kernel is called as is."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = jax.sharding.AxisType.Manual
    free = {a: s for a, s, t in zip(mesh.axis_names, mesh.axis_sizes, mesh.axis_types, strict=True) if t != manual}
    if mesh.empty or math.prod(free.values()) == 1:
        return _splash_local(q, k, v, seg, interpret)
    batch = tuple(a for a in BATCH_AXES if a in free)
    if q.shape[0] % math.prod(free[a] for a in batch):
        batch = ()  # a batch the mesh does not divide stays whole on each device (shard_map gathers it)
    heads = HEAD_AXIS if HEAD_AXIS in free and q.shape[2] % free[HEAD_AXIS] == 0 else None
    spec, seg_spec = P(batch or None, None, heads, None), P(batch or None, None)
    local = functools.partial(_splash_local, interpret=interpret)
    # check_vma off (MaxText's check_rep=False): splash's pallas_call declares no varying axes for its outputs,
    # which jax 0.10's checked shard_map refuses
    run = jax.shard_map(
        local, mesh=mesh, in_specs=(spec, spec, spec, seg_spec), out_specs=spec, axis_names=set(free), check_vma=False
    )
    return run(q, k, v, seg)


def _splash_local(q, k, v, seg, interpret: bool):
    """One device's splash: q, k, v (B, L, H, d), seg (B, L), L a multiple of 128 -> (B, L, H, d) in q's dtype."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    length, heads = q.shape[1], q.shape[2]
    block = next(b for b in SPLASH_BLOCKS if length % b == 0)
    sizes = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )
    mask = splash.MultiHeadMask([splash.CausalMask((length, length))] * heads)
    kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  (B, H, L, d): the kernel's layout
    run = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(s, s)))
    out = _traced_under(run, _kernel_precision(q.dtype))(heads_first(q), heads_first(k), heads_first(v), seg)
    return heads_first(out)


def _kernel_precision(dtype) -> str | None:
    """The matmul precision the kernel's products are traced under. Mosaic refuses "highest" on bf16 operands
    ("Bad lhs type"), whose products the float32 accumulator holds exactly at any precision, so those take
    "default" (the same values); and "high" on any operands, so float32 ones take "highest" (more exact) for it.
    Otherwise the setting in effect, as the dense path's products have."""
    current = jax.config.jax_default_matmul_precision
    if jnp.dtype(dtype) != jnp.float32:
        return "default"
    return "highest" if current in ("high", "tensorfloat32") else current


def _traced_under(fn, precision: str | None):
    """``fn`` (of arrays) with its forward and backward both traced under matmul ``precision``: splash's backward
    (a custom_vjp's) is traced when the gradient is taken, outside any ``with jax.default_matmul_precision``
    around the call, so both passes set it here."""

    @jax.custom_vjp
    def wrapped(*args):
        with jax.default_matmul_precision(precision):
            return fn(*args)

    def forward(*args):
        with jax.default_matmul_precision(precision):
            out, backward = jax.vjp(fn, *args)
        return out, backward  # the vjp function is a pytree (jax.tree_util.Partial) of its residuals

    def backward(pullback, cotangent):
        with jax.default_matmul_precision(precision):
            return pullback(cotangent)

    wrapped.defvjp(forward, backward)
    return wrapped


# ---- the blockwise kernel: q, k, v (B, nb, block, H, d_h); seg, prefix (B, nb·block); first, last (B, nb) ----


def _allowed(seg, prefix, b, i, j, block: int):
    """The mask of query block i against key block j of row b, (block, block) bool (module docstring; prefix
    is already False in a causal layer)."""
    take = lambda x, blk: jax.lax.dynamic_slice_in_dim(x[b], blk * block, block)
    sq, sk, pq, pk = take(seg, i), take(seg, j), take(prefix, i), take(prefix, j)
    qi = i * block + jnp.arange(block)
    kj = j * block + jnp.arange(block)
    see = (kj[None, :] <= qi[:, None]) | (pq[:, None] & pk[None, :])
    return see & (sq[:, None] == sk[None, :]) & (sk[None, :] != 0)


def _scores(qb, kb):
    """(block, H, d) × (block, H, d) → (H, block_q, block_k) float32, as ssmlm.models.layers.attention_weights."""
    s = jnp.einsum("qhd,khd->hqk", qb, kb).astype(jnp.float32)
    return s / jnp.sqrt(qb.shape[-1]).astype(jnp.float32)


def _forward_block(q, k, v, seg, prefix, first, last, n):
    """Query block n (row n // nb, block n % nb) → its output (block, H, d) and log-sum-exp (H, block)."""
    nb, block, heads, d = q.shape[1:]
    b, i = n // nb, n % nb
    qb = q[b, i]

    def body(carry):
        j, m, total, acc = carry
        ok = _allowed(seg, prefix, b, i, j, block)
        s = jnp.where(ok, _scores(qb, k[b, j]), MASK_VALUE)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp(s - m_new[..., None]) * ok  # exactly 0 off the mask, even while m is still MASK_VALUE
        scale = jnp.exp(m - m_new)
        pv = jnp.einsum("hqk,khd->hqd", p.astype(v.dtype), v[b, j], preferred_element_type=jnp.float32)
        return j + 1, m_new, total * scale + p.sum(-1), acc * scale[..., None] + pv

    init = (
        first[b, i],
        jnp.full((heads, block), MASK_VALUE, jnp.float32),
        jnp.zeros((heads, block), jnp.float32),
        jnp.zeros((heads, block, d), jnp.float32),
    )
    _, m, total, acc = jax.lax.while_loop(lambda c: c[0] <= last[b, i], body, init)
    seen = total > 0  # False only for padding queries: output 0 (as the dense path's zeroed weights give)
    total = jnp.where(seen, total, 1.0)
    out = jnp.where(seen[..., None], acc / total[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(total), 0.0)  # log Σ exp(s): the backward's softmax weights are exp(s − lse)
    return jnp.swapaxes(out, 0, 1).astype(v.dtype), lse


def _forward(q, k, v, seg, prefix, first, last):
    count = q.shape[0] * q.shape[1]
    run = functools.partial(_forward_block, q, k, v, seg, prefix, first, last)
    out, lse = jax.lax.map(run, jnp.arange(count))  # (B·nb, block, H, d), (B·nb, H, block)
    return out.reshape(q.shape), lse.reshape(*q.shape[:2], *lse.shape[1:])


def _backward_block(res, dout, delta, n, grads):
    """Query block n's share of the gradients: its dq (block, H, d) float32, and its contributions added into
    the running dk, dv (B, nb, block, H, d) float32, from the scores recomputed with the saved log-sum-exp."""
    q, k, v, seg, prefix, first, last, lse = res
    nb, block, _, _ = q.shape[1:]
    b, i = n // nb, n % nb
    qb, dob, lse_b, delta_b = q[b, i], dout[b, i], lse[b, i], delta[b, i]

    def body(carry):
        j, dq, dk, dv = carry
        kb, vb = k[b, j], v[b, j]
        ok = _allowed(seg, prefix, b, i, j, block)
        p = jnp.exp(jnp.where(ok, _scores(qb, kb), MASK_VALUE) - lse_b[..., None]) * ok  # the softmax weights
        dp = jnp.einsum("qhd,khd->hqk", dob, vb, preferred_element_type=jnp.float32)
        ds = p * (dp - delta_b[..., None]) / jnp.sqrt(qb.shape[-1]).astype(jnp.float32)
        f32 = dict(preferred_element_type=jnp.float32)
        dq = dq + jnp.einsum("hqk,khd->qhd", ds.astype(kb.dtype), kb, **f32)
        add = lambda acc, x: jax.lax.dynamic_update_slice(acc, (acc[b, j] + x)[None, None], (b, j, 0, 0, 0))
        dk = add(dk, jnp.einsum("hqk,qhd->khd", ds.astype(qb.dtype), qb, **f32))
        dv = add(dv, jnp.einsum("hqk,qhd->khd", p.astype(dob.dtype), dob, **f32))
        return j + 1, dq, dk, dv

    dk, dv = grads
    init = (first[b, i], jnp.zeros(qb.shape, jnp.float32), dk, dv)
    _, dq, dk, dv = jax.lax.while_loop(lambda c: c[0] <= last[b, i], body, init)
    return (dk, dv), dq


@jax.custom_vjp
def _flash(q, k, v, seg, prefix, first, last):
    return _forward(q, k, v, seg, prefix, first, last)[0]


def _flash_fwd(q, k, v, seg, prefix, first, last):
    out, lse = _forward(q, k, v, seg, prefix, first, last)
    return out, (q, k, v, seg, prefix, first, last, lse, out)


def _flash_bwd(res, dout):
    *res, out = res
    q, k, v = res[:3]
    # Δ_q = Σ_d dout·out = Σ_k p dp, the softmax's backward term, per query and head: (B, nb, H, block)
    delta = jnp.swapaxes(jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1), -1, -2)
    zeros = jnp.zeros(k.shape, jnp.float32)
    step = lambda grads, n: _backward_block(res, dout, delta, n, grads)
    (dk, dv), dq = jax.lax.scan(step, (zeros, zeros), jnp.arange(q.shape[0] * q.shape[1]))
    return dq.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ---- decoding ----


def attend_cache(q, keys, values, last, block: int = DECODE_BLOCK):
    """One query per row over a KV cache: q (B, H, d_h), keys/values (B, S, H, d_h), ``last`` (B,) int the last
    slot row b may attend (slots 0..last[b]) -> (B, H, d_h) in the values' dtype. Reads the cache ``block``
    slots at a time, only up to the block holding max(last), with the online softmax (no gradient: decoding)."""
    size = keys.shape[1]
    block = min(block, size)
    heads, d = q.shape[1:]

    def body(carry):
        j, m, total, acc = carry
        # the last block may run past the cache: dynamic_slice then starts earlier, and the slots it re-reads
        # (below j·block) are masked, so each slot counts once
        start = jnp.minimum(j * block, size - block)
        slots = start + jnp.arange(block)
        kb = jax.lax.dynamic_slice_in_dim(keys, start, block, axis=1)
        vb = jax.lax.dynamic_slice_in_dim(values, start, block, axis=1)
        ok = ((slots >= j * block)[None] & (slots[None] <= last[:, None]))[:, None]  # (B, 1, block)
        s = jnp.einsum("bhd,bkhd->bhk", q, kb).astype(jnp.float32) / jnp.sqrt(d).astype(jnp.float32)
        s = jnp.where(ok, s, MASK_VALUE)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.exp(s - m_new[..., None]) * ok
        scale = jnp.exp(m - m_new)
        pv = jnp.einsum("bhk,bkhd->bhd", p.astype(values.dtype), vb, preferred_element_type=jnp.float32)
        return j + 1, m_new, total * scale + p.sum(-1), acc * scale[..., None] + pv

    b = q.shape[0]
    init = (
        jnp.int32(0),
        jnp.full((b, heads), MASK_VALUE, jnp.float32),
        jnp.zeros((b, heads), jnp.float32),
        jnp.zeros((b, heads, d), jnp.float32),
    )
    _, _, total, acc = jax.lax.while_loop(lambda c: c[0] * block <= jnp.max(last), body, init)
    return (acc / jnp.where(total > 0, total, 1.0)[..., None]).astype(values.dtype)
