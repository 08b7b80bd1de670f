"""AdamW with the papers' settings, per-parameter learning-rate multipliers and weight decay given by the
model family's parameter rules (ssmlm.models.rules), and warmup followed by cosine / linear / constant decay.

The training config meets the parameter rules here: the recipe's ``train.param_rules`` go before the family's,
and the parameter groups families declare (``ParamRule.group``) take their settings from ``train`` (GROUPS)."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import NamedTuple

import jax
import optax

from ssmlm.errors import RecipeError
from ssmlm.models import family_rules
from ssmlm.models.config import ModelConfig
from ssmlm.models.rules import ParamRule, RuleCount, assign, common_rules, first_match, path_name, ssm_rule
from ssmlm.train_config import TrainConfig

# parameter group (ParamRule.group) -> its settings in the training config: (lr multiplier, weight decay)
GROUPS = {"ssm": lambda train: (train.ssm_lr_multiplier, train.ssm_weight_decay)}


def user_rules(train: TrainConfig) -> list[ParamRule]:
    """``train.param_rules`` from the recipe, which go before the family's rules."""
    return [ParamRule(r.pattern, r.lr_multiplier, r.weight_decay, r.name or "user") for r in train.param_rules]


def with_groups(rules: Sequence[ParamRule], train: TrainConfig) -> list[ParamRule]:
    """``rules`` with each known group's lr multiplier and weight decay taken from ``train`` (GROUPS); a rule of
    no group, or of a group the training config has no settings for, keeps its own."""
    out = []
    for r in rules:
        if r.group in GROUPS:
            lr_multiplier, weight_decay = GROUPS[r.group](train)
            r = dataclasses.replace(r, lr_multiplier=lr_multiplier, weight_decay=weight_decay)
        out.append(r)
    return out


def param_rules(model: ModelConfig, train: TrainConfig) -> list[ParamRule]:
    """The optimizer's parameter rules for this model: the recipe's train.param_rules, then the family's own
    (ssmlm.models.family_rules, ending with a catch-all), each group with the recipe's settings for it. First
    match wins; see ssmlm.models.rules."""
    return with_groups(user_rules(train) + family_rules(model), train)


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


class Optimizer(NamedTuple):
    tx: optax.GradientTransformation
    schedule: optax.Schedule  # the base learning rate by step (a rule's multiplier scales it)
    caught: list[RuleCount]  # per rule, the parameters it caught (empty when made without parameters)


def make_optimizer(
    cfg: TrainConfig,
    total: int,
    params=None,
    model: ModelConfig | None = None,
    rules: Sequence[ParamRule] | None = None,
) -> Optimizer:
    """AdamW whose learning-rate multiplier and weight decay come, per parameter, from the first matching rule.

    ``rules``: an explicit list; else the model family's (``param_rules``) when ``model`` is given; else, for
    callers without a model config, the SSM rule and the rules every family ends with. With
    ``params`` the rules are checked against them (a RecipeError for a parameter no rule matches, or a rule
    matching nothing) and ``caught`` counts what each rule took.

    Parameters sharing a multiplier share one AdamW (one optimizer-state group); with every multiplier 1
    there is a single AdamW, the official BiGS setup. Multiplier 0 freezes: zero updates, no state.
    """
    lr = schedule(cfg, total)
    if rules is None and model is not None:
        rules = param_rules(model, cfg)
    elif rules is None:
        rules = with_groups(user_rules(cfg) + [ssm_rule()] + common_rules(), cfg)
    rules = list(rules)
    family = model.arch if model is not None else ""
    caught = assign(rules, params, family) if params is not None else []

    @functools.cache
    def rule_of(name: str) -> ParamRule:
        i = first_match(rules, name)
        if i is None:  # only without params (with them, assign has already said so)
            raise RecipeError(f"parameter '{name}' matches no parameter rule")
        return rules[i]

    def per_leaf(fn):
        return lambda tree: jax.tree_util.tree_map_with_path(lambda p, _: fn(rule_of(path_name(p))), tree)

    decay = per_leaf(lambda r: r.weight_decay)
    adamw = lambda rate: optax.adamw(  # noqa: E731
        rate, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay
    )
    parts = [optax.clip_by_global_norm(cfg.grad_clip)] if cfg.grad_clip > 0 else []
    # Groups that hold parameters (a rule shadowed by earlier ones adds none).
    used = [r for r, c in zip(rules, caught, strict=True) if c.tensors] if caught else rules
    names = group_names(used)
    if set(names) == {1.0}:
        parts.append(adamw(lr))  # the same transformation (and state layout) as before rules existed
    else:
        groups = {}
        for m, name in names.items():
            scaled = lambda step, m=m: lr(step) * m  # noqa: E731
            groups[name] = optax.set_to_zero() if m == 0 else adamw(lr if m == 1 else scaled)
        parts.append(optax.multi_transform(groups, per_leaf(lambda r: names[r.lr_multiplier])))
    return Optimizer(optax.chain(*parts), lr, caught)


def group_names(rules: Sequence[ParamRule]) -> dict[float, str]:
    """Optimizer-state group name per learning-rate multiplier: 'default' (1), 'frozen' (0), else the first
    rule's name (so the SSM group keeps the name 'ssm' its checkpoints were written with) or 'groupN'."""
    names: dict[float, str] = {}
    for r in rules:
        m = r.lr_multiplier
        if m in names:
            continue
        if m == 1:
            names[m] = "default"
        elif m == 0:
            names[m] = "frozen"
        elif re.fullmatch(r"[A-Za-z_]\w*", r.name) and r.name not in {*names.values(), "default", "frozen"}:
            names[m] = r.name
        else:
            names[m] = f"group{len(names)}"
    return names


def rule_records(caught: Sequence[RuleCount]) -> list[dict]:
    """The table as plain data (checkpoint manifest)."""
    return [dataclasses.asdict(c) for c in caught]


def rule_table(caught: Sequence[RuleCount]):
    """The table as a rich Table, printed once at the start of training."""
    from rich.table import Table

    t = Table(title="parameter rules (first match wins)", title_justify="left")
    for col, just in (
        ("rule", "left"),
        ("pattern", "left"),
        ("lr x", "right"),
        ("decay", "left"),
        ("tensors", "right"),
        ("parameters", "right"),
    ):
        t.add_column(col, justify=just, overflow="fold")
    for c in caught:
        lr = "frozen" if c.lr_multiplier == 0 else f"{c.lr_multiplier:g}"
        t.add_row(c.name, c.pattern, lr, "yes" if c.weight_decay else "no", str(c.tensors), f"{c.elements:,}")
    return t
