"""The vocabulary of recipe schemas: a value rule (``Rule``) and the common ranges.

Every package keeps its recipe section beside its code (ssmlm.models.config, ssmlm.data.config,
ssmlm.objectives.config, ssmlm.train_config): the dataclasses, and next to them a table of the allowed values
of their fields, built from the rules here. ssmlm.checks assembles those tables and checks a loaded recipe
against them. This module is the bottom of the stack: it imports the standard library and ssmlm.errors only,
so any schema module can use it.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ssmlm.errors import UserError


@dataclass(frozen=True)
class Rule:
    ok: Callable[[Any], bool]
    expected: str

    def holds(self, value) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False  # nan and inf pass comparisons such as > 0 (or fail them silently)
        return self.ok(value)


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def at_least(n: int) -> Rule:
    return Rule(lambda v: v >= n, f"at least {n}")


def above(x: float) -> Rule:
    return Rule(lambda v: v > x, f"more than {x:g}")


def within(lo: float, hi: float, hi_open: bool = False) -> Rule:
    if hi_open:
        return Rule(lambda v: lo <= v < hi, f"a number in [{lo:g}, {hi:g})")
    return Rule(lambda v: lo <= v <= hi, f"a number in [{lo:g}, {hi:g}]")


POSITIVE = at_least(1)
NON_NEGATIVE = at_least(0)
FRACTION = within(0, 1)
MESH_AXIS = Rule(lambda v: v == -1 or v >= 1, "-1 (every remaining device) or at least 1")
NON_EMPTY = Rule(lambda v: bool(str(v).strip()), "a non-empty string")
# A run name becomes one directory under train.out_dir: '' would be out_dir itself, 'a/b' or '..' another place.
RUN_NAME = Rule(
    lambda v: v.strip() not in ("", ".", "..") and "/" not in v and "\\" not in v,
    "a non-empty name without '/' (it names the run directory)",
)
REGEX = Rule(lambda v: bool(v) and _compiles(v), "a non-empty Python regular expression")
SEQ_LEN = Rule(lambda v: v >= 8, "at least 8 (room for [CLS], [SEP] and some text)")


def check_section(obj, ranges: dict[str, Rule], name: str) -> None:
    """Check a section built in code rather than loaded from a recipe (a recipe's are checked by ssmlm.checks,
    with the file that set each value): its ``Literal`` fields against their choices, then ``ranges`` (field ->
    Rule; None passes). Raises a UserError naming ``name`` and the field."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        choices = typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is Literal else ()
        value = getattr(obj, f.name)
        if choices and value not in choices:
            raise UserError(f"{name} {f.name} = {value!r}: expected one of {', '.join(map(repr, choices))}")
    for key, rule in ranges.items():
        value = getattr(obj, key)
        if value is not None and not rule.holds(value):
            raise UserError(f"{name} {key} = {value!r}: expected {rule.expected}")


def named(ref: str):
    """The object a registry names as "module:name" (its module imported on first use: registries stay light)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)
