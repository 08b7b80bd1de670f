"""Value checks: every numeric recipe field's range, the rules that tie fields together, and command-line options.

The loader (ssmlm.recipe) checks types; this module checks values, in one table, before anything is read,
built or written. Messages have the loader's shape, naming where the value came from:

    <recipe file or --set>: '<dotted.key>' = <value>: expected <what>
    --stop-after = -3: expected at least 1

Nothing heavy is imported here, so a mistake is reported at once. A new recipe field gets a line in FIELDS
(or in RELATIONS when it depends on another field).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssmlm.errors import CheckpointError, RecipeError, UserError
from ssmlm.models.config import is_lm, lm_archs


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
RUN_NAME = Rule(lambda v: v.strip() not in ("", ".", "..") and "/" not in v and "\\" not in v,
                "a non-empty name without '/' (it names the run directory)")  # fmt: skip
REGEX = Rule(lambda v: bool(v) and _compiles(v), "a non-empty Python regular expression")
SEQ_LEN = Rule(lambda v: v >= 8, "at least 8 (room for [CLS], [SEP] and some text)")

# dotted field -> allowed values (None always passes where the field allows it: it means "derive it").
# 'list[].field' is a field of every item of a list of sections.
FIELDS: dict[str, Rule] = {
    "name": RUN_NAME,
    "model.vocab_size": POSITIVE,
    "model.hidden_size": POSITIVE,
    "model.num_layers": POSITIVE,
    "model.intermediate_size": POSITIVE,
    "model.max_seq_length": SEQ_LEN,
    "model.num_ssm": POSITIVE,
    "model.type_vocab_size": POSITIVE,
    "model.dropout": within(0, 1, hi_open=True),
    "model.layer_norm_eps": above(0),
    "model.initializer_range": above(0),
    "model.num_heads": POSITIVE,
    "model.tiny_attention_size": POSITIVE,
    "data.source": NON_EMPTY,
    "data.text_field": NON_EMPTY,
    "data.max_documents": POSITIVE,
    "data.tokenizer": NON_EMPTY,
    "data.vocab_size": POSITIVE,
    "data.max_seq_length": SEQ_LEN,
    "data.short_seq_prob": FRACTION,
    "data.validation_fraction": within(0, 1, hi_open=True),
    "data.seed": NON_NEGATIVE,
    "objective.masked_lm_prob": Rule(lambda v: 0 < v <= 1, "a probability in (0, 1]"),
    "objective.max_predictions": POSITIVE,
    "objective.duplicate_factor": POSITIVE,
    "objective.seed": NON_NEGATIVE,
    "objective.spacing": NON_NEGATIVE,
    "objective.min_sample_space": POSITIVE,
    "objective.controller.eval_scale": above(0),
    "objective.controller.validation_rows": POSITIVE,
    "objective.controller.proposals": POSITIVE,
    "objective.controller.top_n": POSITIVE,
    "objective.controller.grok_iterations": NON_NEGATIVE,
    "objective.controller.learning_rate": above(0),
    "objective.controller.weight_decay": at_least(0),
    "objective.controller.noise": within(0, 1, hi_open=True),
    "objective.controller.width": Rule(lambda v: v >= 2 and v % 2 == 0, "an even number >= 2 (RMS_split halves it)"),
    "objective.controller.state_size": POSITIVE,
    "objective.controller.layers": POSITIVE,
    "objective.controller.max_history": at_least(2),
    "model.state_size": POSITIVE,
    "model.mlp_expansion": above(0),
    "model.conv_width": POSITIVE,
    "model.rope_base": above(0),
    "model.rg_lru_c": above(0),
    "model.norm_eps": above(0),
    "task.num_labels": POSITIVE,
    "task.phonebook.train_books": POSITIVE,
    "task.phonebook.validation_books": POSITIVE,
    "task.phonebook.entries": Rule(lambda v: len(v) == 2 and 1 <= v[0] <= v[1], "[lo, hi] with 1 <= lo <= hi"),
    "task.phonebook.queries": Rule(lambda v: len(v) == 2 and 1 <= v[0] <= v[1], "[lo, hi] with 1 <= lo <= hi"),
    "task.validation_examples": NON_NEGATIVE,
    "task.max_seq_length": SEQ_LEN,
    "task.text_fields": Rule(lambda v: 1 <= len(v) <= 2, "one or two column names"),
    "train.steps": POSITIVE,
    "train.epochs": above(0),
    "train.batch_size": POSITIVE,
    "train.learning_rate": above(0),
    "train.warmup_steps": NON_NEGATIVE,
    "train.warmup_ratio": FRACTION,
    "train.end_lr_ratio": FRACTION,
    "train.beta1": within(0, 1, hi_open=True),
    "train.beta2": within(0, 1, hi_open=True),
    "train.eps": above(0),
    "train.weight_decay": Rule(lambda v: v >= 0, "at least 0"),
    "train.grad_clip": Rule(lambda v: v >= 0, "at least 0 (0 = off)"),
    "train.grad_accum": POSITIVE,
    "train.ssm_lr_multiplier": Rule(lambda v: v >= 0, "at least 0"),
    "train.param_rules[].pattern": REGEX,
    "train.param_rules[].lr_multiplier": Rule(lambda v: v >= 0, "at least 0 (0 = frozen)"),
    "train.max_skipped_steps": NON_NEGATIVE,
    "train.seed": NON_NEGATIVE,
    "train.log_every": POSITIVE,
    "train.eval_every": Rule(lambda v: v >= 0, "at least 0 (0 = only at the end)"),
    "train.eval_batches": Rule(lambda v: v >= 0, "at least 0 (0 = the whole validation split)"),
    "train.checkpoint_every": Rule(lambda v: v >= 0, "at least 0 (0 = only at the end)"),
    "train.keep_checkpoints": POSITIVE,
    "train.peak_flops": above(0),
    "train.out_dir": NON_EMPTY,
    "mesh.data": MESH_AXIS,
    "mesh.fsdp": MESH_AXIS,
    "mesh.tensor": MESH_AXIS,
}


@dataclass(frozen=True)
class Relation:
    """A rule over several fields; the message names ``keys[0]`` and says what it should be given the others."""

    keys: tuple[str, ...]
    applies: Callable[[Any], bool]
    ok: Callable[[Any], bool]
    expected: Callable[[Any], str]


def _micro_ways(r) -> int:
    """Ways the micro-batch is split over fixed mesh axes (-1 axes are only known once devices are)."""
    return max(r.mesh.data, 1) * max(r.mesh.fsdp, 1)


RELATIONS: list[Relation] = [
    Relation(
        ("objective.kind", "model.arch"),
        lambda r: True,
        lambda r: (r.objective.kind == "lm") == is_lm(r.model.arch),
        lambda r: (
            f"'lm' for the language model model.arch = '{r.model.arch}'"
            if is_lm(r.model.arch)
            else f"'mlm' or 'next_token' for the encoder model.arch = '{r.model.arch}' "
            f"('lm' needs one of {', '.join(lm_archs())})"
        ),
    ),
    Relation(
        ("data.tokenizer_type", "objective.kind"),
        lambda r: True,
        lambda r: (r.data.tokenizer_type == "byte_bpe") == (r.objective.kind == "lm"),
        lambda r: (
            "'byte_bpe' (a lossless tokenizer) for objective.kind = 'lm'"
            if r.objective.kind == "lm"
            else f"'wordpiece' for objective.kind = '{r.objective.kind}'"
        ),
    ),
    Relation(
        ("data.lowercase", "data.tokenizer_type"),
        lambda r: r.data.tokenizer_type == "byte_bpe",
        lambda r: not r.data.lowercase,
        lambda r: "false: a byte-level BPE decodes back to the exact text, which lowercasing would change",
    ),
    Relation(
        ("model.state_size", "model.bidirectional"),
        # the recurrent language models (attention has no state to split)
        lambda r: is_lm(r.model.arch) and r.model.arch not in r.model.ATTENTION and r.model.bidirectional != "none",
        lambda r: r.model.state_size % 2 == 0,
        lambda r: "an even number (a bidirectional layer splits the state in halves)",
    ),
    Relation(
        ("model.num_heads", "model.hidden_size"),
        lambda r: r.model.arch in r.model.ATTENTION,
        lambda r: r.model.hidden_size % r.model.num_heads == 0,
        lambda r: f"a divisor of model.hidden_size = {r.model.hidden_size}",
    ),
    Relation(
        ("model.intermediate_size", "model.sgu"),
        lambda r: r.model.arch in ("gmlp", "amlp") and r.model.sgu == "split_multiplicative",
        lambda r: r.model.intermediate_size % 2 == 0,
        lambda r: "an even number (model.sgu = 'split_multiplicative' halves it)",
    ),
    Relation(
        ("data.max_seq_length", "model.max_seq_length"),
        lambda r: r.data.max_seq_length is not None,
        lambda r: r.data.max_seq_length <= r.model.max_seq_length,
        lambda r: f"at most model.max_seq_length = {r.model.max_seq_length}",
    ),
    Relation(
        ("train.batch_size", "train.grad_accum"),
        lambda r: True,
        lambda r: r.train.batch_size % r.train.grad_accum == 0,
        lambda r: f"a multiple of train.grad_accum = {r.train.grad_accum}",
    ),
    Relation(
        ("train.batch_size", "train.grad_accum", "mesh.data", "mesh.fsdp"),
        lambda r: r.train.batch_size % r.train.grad_accum == 0,
        lambda r: (r.train.batch_size // r.train.grad_accum) % _micro_ways(r) == 0,
        lambda r: f"a multiple of train.grad_accum x mesh.data x mesh.fsdp = {r.train.grad_accum * _micro_ways(r)}",
    ),
    Relation(
        ("mesh.data", "mesh.fsdp", "mesh.tensor"),
        lambda r: True,
        lambda r: [r.mesh.data, r.mesh.fsdp, r.mesh.tensor].count(-1) <= 1,
        lambda r: (
            f"at most one axis to be -1 (mesh.data = {r.mesh.data}, mesh.fsdp = {r.mesh.fsdp}, "
            f"mesh.tensor = {r.mesh.tensor})"
        ),
    ),
]


def _get(obj, dotted: str):
    """The value at ``dotted``; None where the section has no such field (another model family's)."""
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj


def _items(recipe, key: str):
    """(dotted key, value) of a FIELDS key; 'a.list[].x' gives one per item, as 'a.list[i].x'."""
    if "[]." not in key:
        yield key, _get(recipe, key)
        return
    outer, inner = key.split("[].", 1)
    for i, item in enumerate(_get(recipe, outer) or []):
        yield f"{outer}[{i}].{inner}", _get(item, inner)


def _where(source, dotted: str) -> str:
    return source.of(dotted) if hasattr(source, "of") else str(source)


def validate(recipe, source: str = "recipe") -> None:
    """Raise a RecipeError for the first field outside its range or relation that does not hold.
    ``source`` is the recipe file, or the loader's Origins (which file or --set set each key)."""
    for field, rule in FIELDS.items():
        for key, value in _items(recipe, field):
            if value is not None and not rule.holds(value):
                raise RecipeError(f"{_where(source, key)}: '{key}' = {value!r}: expected {rule.expected}")
    for rel in RELATIONS:
        if rel.applies(recipe) and not rel.ok(recipe):
            # Point at the command line if one of the fields was set there (that is what the user just
            # changed), else at the file that set the rule's main field.
            where = next((w for k in rel.keys if (w := _where(source, k)) == "--set"), _where(source, rel.keys[0]))
            key = rel.keys[0]
            raise RecipeError(f"{where}: '{key}' = {_get(recipe, key)!r}: expected {rel.expected(recipe)}")


# ----------------------------------------------------------------------------- command-line options


def option(name: str, value, rule: Rule) -> None:
    """Check one command-line option (None: not given)."""
    if value is not None and not rule.holds(value):
        raise UserError(f"{name} = {value!r}: expected {rule.expected}")


def seeds(text: str | None) -> list[int] | None:
    """``--seeds 1,2,3``: distinct non-negative integers."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UserError(f"--seeds = {text!r}: expected comma-separated non-negative integers, e.g. 1,2,3")
    values = [int(p) for p in parts]
    if len(set(values)) != len(values):
        raise UserError(f"--seeds = {text!r}: expected distinct seeds (each gets its own run)")
    return values


def run_dir(path: str | Path, opt: str) -> None:
    """A run directory given on the command line exists (checked before the slow imports)."""
    d = Path(path).expanduser()
    if not (d / "run.json").is_file() or not (d / "recipe.yaml").is_file():
        raise CheckpointError(f"{opt} {path}: not an ssmlm run directory (expected run.json and recipe.yaml)")


def inputs(recipe, data: bool = True, tokenizer: bool = True) -> None:
    """Local files the recipe names exist (the rest of data checking needs the data itself). ``data`` /
    ``tokenizer``: whether this command reads the recipe's corpus / tokenizer (finetuning uses the source run's)."""
    from ssmlm.data.sources import check_source

    if data:
        check_source(recipe.data.source)
    tok = recipe.data.tokenizer
    if data and tokenizer and tok != "train" and not Path(tok).expanduser().exists():
        raise UserError(f"data.tokenizer '{tok}': no such file (expected 'train', a vocab.txt or tokenizer.json)")
    for key in ("train_file", "validation_file", "test_file", "data_dir"):
        path = getattr(recipe.task, key)
        if path and not Path(path).expanduser().exists():
            raise UserError(f"task.{key} '{path}': no such {'directory' if key == 'data_dir' else 'file'}")
