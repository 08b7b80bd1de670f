"""Parameter counts, training FLOPs per token and parameter/optimizer memory — without allocating — and the
known devices' peak FLOP/s (what training's model-FLOPs utilisation divides by).

FLOPs use the usual 6N rule (2 per parameter forward, 4 backward) for every dense/embedding-free
parameter, plus the parts whose cost is not one multiply-add per parameter per token (each family's ``mixing_flops``):
  attention scores and mixing      12 · L · d per layer (QKᵀ and AV, forward + backward)
  S4D via FFT                      ≈ 30 · log2(2L) per channel per SSM (three length-2L FFTs, ×3)
  gMLP spatial projection          3 · L · d_ffn/2 · 2 per layer (an L×L matrix per gate channel)
  tied MLM decoder                 6 · d · V · (predictions / L) (logits only at masked positions)
"""

from __future__ import annotations

import contextlib

import jax
from flax import nnx

from ssmlm.models.config import ModelConfig, family


def _leaves(model) -> list[tuple[str, int]]:
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return [("/".join(map(str, path)), int(v.get_value().size)) for path, v in flat]


def param_counts(model) -> dict[str, int]:
    leaves = _leaves(model)
    total = sum(n for _, n in leaves)
    embed = sum(n for p, n in leaves if "/embeddings/" in f"/{p}/" and p.rsplit("/", 2)[-2] != "norm")
    spatial = sum(n for p, n in leaves if "spatial" in p)
    return {"total": total, "embeddings": embed, "non_embedding": total - embed, "spatial": spatial}


def flops_per_token(model, cfg: ModelConfig, seq_len: int, predictions: int | None = None) -> float:
    counts = param_counts(model)
    d = cfg.hidden_size
    dense_params = counts["non_embedding"] - counts["spatial"]
    flops = 6.0 * dense_params + family(cfg.arch).mixing_flops(cfg, seq_len)
    if predictions is not None and cfg.vocab_size:
        flops += 6.0 * d * cfg.vocab_size * predictions / seq_len
    return flops


def memory_bytes(model, cfg: ModelConfig) -> dict[str, int]:
    """Parameters in their dtype, AdamW's two float32 moments, and float32 gradients."""
    n = param_counts(model)["total"]
    p_bytes = 2 if cfg.param_dtype == "bfloat16" else 4
    return {"params": n * p_bytes, "optimizer": 2 * n * 4, "gradients": n * 4, "total": n * (p_bytes + 12)}


def abstract(build) -> nnx.Module:
    """A model whose parameters are shapes only (jax.ShapeDtypeStruct): nothing is allocated."""
    with _plain_tracer_errors():
        return nnx.eval_shape(build)


@contextlib.contextmanager
def _plain_tracer_errors():
    """Every RNG draw of flax asks its tracer for `.sharding`, and jax's AttributeError for that builds a message
    by walking the whole trace so far: quadratic in the model's size (12 of the 15 s of `ssmlm pretrain
    bigs_full --dry-run` on 2 cores, jax 0.10). Inside this block the message omits where the tracer came from."""
    from jax._src.interpreters import partial_eval as pe  # private: skipped if a jax release moves it

    tracer = getattr(pe, "DynamicJaxprTracer", None)
    original = getattr(tracer, "_origin_msg", None)
    if original is None:
        yield
        return
    tracer._origin_msg = lambda self: ""
    try:
        yield
    finally:
        tracer._origin_msg = original


# Dense bf16 peak per device (FLOP/s), for the model-FLOPs utilisation estimate (training's mfu).
PEAK_FLOPS = {
    "H100": 989e12,
    "H200": 989e12,
    "A100": 312e12,
    "TPU v3": 123e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
}


def peak_flops_per_second(configured: float | None = None) -> float | None:
    """``configured`` (train.peak_flops) if set, else the known peak of this device kind times the device count."""
    if configured:
        return configured
    kind = jax.devices()[0].device_kind
    per = next((v for k, v in PEAK_FLOPS.items() if k.lower() in kind.lower()), None)
    return per * jax.device_count() if per else None
