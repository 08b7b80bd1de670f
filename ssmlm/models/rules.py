"""Parameter rules: which learning-rate multiplier and whether weight decay apply to each parameter.

A rule's ``pattern`` is a Python regular expression *searched* (``re.search``) in the parameter's path, its
module names joined by '/', e.g. ``encoder/layers/3/ssm_f/log_step`` or ``mlm_head/norm/scale``. Anchor it
yourself: ``(^|/)`` and ``$`` for whole path components. Patterns should not name layer indices, so that a
rule also holds when the layers are scanned (stacked under one path without the index).

A parameter takes the first rule of the list that matches it. Every family's list ends with a catch-all
(``.*``), and user rules from ``train.param_rules`` go before the family's. A family's rule may name a
parameter *group* (``group="ssm"``: the S4D parameters); the training package gives a group the recipe's
settings for it (ssmlm.train.optim: ``train.ssm_lr_multiplier``, ``train.ssm_weight_decay``), so models never
see the training config.

Two mistakes are errors: a rule whose pattern matches no parameter at all (a typo, or a rule meant for another
family) and a parameter no rule matches (only possible for a list without a catch-all). A rule that matches only
parameters an earlier rule already took is allowed; it catches 0 and the optimizer's table shows it.

This module is deliberately light (no jax import at module level): the models package uses it to state
its rules, the training package to apply them. It imports ssmlm.errors only (no recipe or training code).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ssmlm.errors import RecipeError


@dataclasses.dataclass(frozen=True)
class ParamRule:
    pattern: str  # regex, searched in the '/'-joined parameter path
    lr_multiplier: float = 1.0  # factor on the schedule's learning rate; 0 = frozen (no update, no optimizer state)
    weight_decay: bool = True  # apply train.weight_decay (decoupled, AdamW)
    name: str = ""  # shown in the optimizer's table; optimizer-state group name for a lr multiplier ≠ 1
    # a parameter group whose lr multiplier and decay the training config sets (ssmlm.train.optim.GROUPS), over
    # the values above; "" = the rule's own values
    group: str = ""

    def __post_init__(self):
        if not self.lr_multiplier >= 0:  # nan fails too
            raise RecipeError(
                f"parameter rule '{self.pattern}': lr_multiplier = {self.lr_multiplier}: expected at least 0"
            )
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise RecipeError(f"parameter rule '{self.pattern}': not a regular expression ({e})") from None

    def matches(self, path: str) -> bool:
        return re.search(self.pattern, path) is not None

    @property
    def label(self) -> str:
        return self.name or self.pattern


# The recurrence / kernel parameters of an S4D layer (ssmlm.models.bigs.SSM), which lives under an `ssm*`
# module in BiGS (ssm_f, ssm_b) and stack/ssm (route/ssm_f, route/ssm_b).
SSM_PATTERN = r"(^|/)ssm[^/]*/(A_re|A_im|C|D|log_step)$"
# Biases and LayerNorm scales are never decayed (official BiGS and BERT code). gMLP's spatial gate bias is
# named `bias` for this reason.
NO_DECAY_PATTERN = r"(^|/)(bias|scale)$"


def ssm_rule() -> ParamRule:
    """The S4D parameters, in the ``ssm`` group: the recipe's train.ssm_lr_multiplier and train.ssm_weight_decay
    apply to them (S4 practice: lower lr, no decay; official BiGS: neither)."""
    return ParamRule(SSM_PATTERN, name="ssm", group="ssm")


def common_rules() -> list[ParamRule]:
    """What every family ends with: no decay on biases and LayerNorm scales, then everything else."""
    return [
        ParamRule(NO_DECAY_PATTERN, weight_decay=False, name="no_decay"),
        ParamRule(".*", name="default"),
    ]


def path_name(path) -> str:
    """'/'-joined module names of a jax key path (the Variable's own `.value` attribute is not a name)."""
    from jax.tree_util import GetAttrKey

    parts = []
    for k in path:
        if isinstance(k, GetAttrKey):
            continue
        parts.append(str(getattr(k, "key", getattr(k, "idx", k))))
    return "/".join(parts)


def first_match(rules: Sequence[ParamRule], path: str) -> int | None:
    return next((i for i, r in enumerate(rules) if r.matches(path)), None)


@dataclasses.dataclass(frozen=True)
class RuleCount:
    """One row of the optimizer's table: a rule and what it caught."""

    name: str
    pattern: str
    lr_multiplier: float
    weight_decay: bool
    tensors: int
    elements: int


def assign(rules: Sequence[ParamRule], params, family: str = "") -> list[RuleCount]:
    """Check ``rules`` against a parameter tree and count what each rule catches (first match wins).

    Raises a RecipeError for a parameter no rule matches, or a rule that matches no parameter."""
    import jax

    leaves = [(path_name(p), x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]]
    tensors, elements = [0] * len(rules), [0] * len(rules)
    for path, x in leaves:
        i = first_match(rules, path)
        if i is None:
            raise RecipeError(f"parameter '{path}' matches no parameter rule{_of(family)}; add a rule for it")
        tensors[i] += 1
        elements[i] += int(getattr(x, "size", 1))
    for r in rules:
        if not any(r.matches(path) for path, _ in leaves):
            raise RecipeError(f"parameter rule '{r.pattern}' matches no parameter{_of(family)}")
    return [
        RuleCount(r.label, r.pattern, r.lr_multiplier, r.weight_decay, t, e)
        for r, t, e in zip(rules, tensors, elements, strict=True)
    ]


def _of(family: str) -> str:
    return f" of the '{family}' model" if family else ""
