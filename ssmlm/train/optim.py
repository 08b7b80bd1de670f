"""AdamW with the papers' settings, weight decay masked off biases and LayerNorm parameters, and
warmup followed by cosine / linear / constant decay."""

from __future__ import annotations

import jax
import optax

from ssmlm.recipe import TrainConfig


def warmup_steps(cfg: TrainConfig, total: int) -> int:
    return cfg.warmup_steps if cfg.warmup_steps is not None else int(round(cfg.warmup_ratio * total))


def schedule(cfg: TrainConfig, total: int) -> optax.Schedule:
    warm = min(warmup_steps(cfg, total), total)
    peak = cfg.learning_rate
    decay = max(total - warm, 1)
    if cfg.schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, decay, alpha=cfg.end_lr_ratio)
    elif cfg.schedule == "linear":
        after = optax.linear_schedule(peak, 0.0, decay)
    else:
        after = optax.constant_schedule(peak)
    if warm == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warm), after], [warm])


def decay_mask(params):
    """True where weight decay applies: not on any `bias` nor LayerNorm `scale` (as the official code)."""

    def keep(path, _):
        names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        names = [n for n in names if n != "value"]
        return names[-1] not in ("bias", "scale")

    return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(cfg: TrainConfig, total: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    lr = schedule(cfg, total)
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
    parts.append(
        optax.adamw(lr, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask)
    )
    return optax.chain(*parts), lr
