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


def is_ssm(path) -> bool:
    """Parameters of an S4D kernel (A_re, A_im, C, D, log_step) live under an `ssm_*` module."""
    return any(str(getattr(k, "key", getattr(k, "name", ""))).startswith("ssm") for k in path)


def make_optimizer(cfg: TrainConfig, total: int, params=None) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW; with ``ssm_lr_multiplier`` ≠ 1 or ``ssm_weight_decay`` off, SSM parameters get their own
    group (the S4 convention; the official BiGS code treats them like every other parameter)."""
    lr = schedule(cfg, total)
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
    adamw = lambda rate, wd: optax.adamw(
        rate, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=wd, mask=decay_mask
    )  # noqa: E731
    special = cfg.ssm_lr_multiplier != 1.0 or not cfg.ssm_weight_decay
    if not special:
        parts.append(adamw(lr, cfg.weight_decay))
    else:
        ssm_lr = lambda step: lr(step) * cfg.ssm_lr_multiplier  # noqa: E731
        groups = {
            "default": adamw(lr, cfg.weight_decay),
            "ssm": adamw(ssm_lr, cfg.weight_decay if cfg.ssm_weight_decay else 0.0),
        }
        labels = lambda tree: jax.tree_util.tree_map_with_path(lambda p, _: "ssm" if is_ssm(p) else "default", tree)  # noqa: E731
        parts.append(optax.multi_transform(groups, labels))
    return optax.chain(*parts), lr
