"""Value checks: every numeric recipe field's range, the rules that tie fields together, and command-line options.

The loader (ssmlm.recipe) checks types; this module checks values, in one table, before anything is read,
built or written. Messages have the loader's shape, naming where the value came from:

    <recipe file or --set>: '<dotted.key>' = <value>: expected <what>
    --stop-after = -3: expected at least 1

Nothing heavy is imported here, so a mistake is reported at once. The ranges of each section's fields live
beside its dataclasses (ssmlm.models.config, ssmlm.data.config, ssmlm.objectives.config, ssmlm.train_config)
and are assembled into FIELDS here; a new recipe field gets a line in its package's table (or in RELATIONS
here when it depends on another field). The rules themselves (Rule, POSITIVE, …) are ssmlm.schema's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssmlm import paths, staging
from ssmlm.data.config import DATA_RANGES, TASK_RANGES
from ssmlm.errors import CheckpointError, RecipeError, UserError
from ssmlm.models.config import RANGES as MODEL_RANGES
from ssmlm.models.config import is_lm, lm_archs
from ssmlm.objectives.config import OBJECTIVE_RANGES
from ssmlm.schema import (
    FRACTION,
    MESH_AXIS,
    NON_EMPTY,
    NON_NEGATIVE,
    POSITIVE,
    REGEX,
    RUN_NAME,
    SEQ_LEN,
    Rule,
    above,
    at_least,
    within,
)
from ssmlm.train_config import MESH_RANGES, TRAIN_RANGES

# the rules (ssmlm.schema), importable from here as well: checks.POSITIVE, checks.Rule, …
__all__ = [
    "FIELDS",
    "FRACTION",
    "MESH_AXIS",
    "NON_EMPTY",
    "NON_NEGATIVE",
    "POSITIVE",
    "REGEX",
    "RELATIONS",
    "RUN_NAME",
    "SEQ_LEN",
    "Rule",
    "above",
    "at_least",
    "option",
    "checkpoint_step",
    "checkpoint_steps",
    "entries",
    "run_dir",
    "seeds",
    "validate",
    "within",
]

# recipe section -> its package's table of field ranges (keys relative to the section)
SECTIONS: dict[str, dict[str, Rule]] = {
    "model": MODEL_RANGES,
    "data": DATA_RANGES,
    "objective": OBJECTIVE_RANGES,
    "task": TASK_RANGES,
    "train": TRAIN_RANGES,
    "mesh": MESH_RANGES,
}

# dotted field -> allowed values (None always passes where the field allows it: it means "derive it").
# 'list[].field' is a field of every item of a list of sections.
FIELDS: dict[str, Rule] = {
    "name": RUN_NAME,
    **{f"{section}.{key}": rule for section, table in SECTIONS.items() for key, rule in table.items()},
}


@dataclass(frozen=True)
class Relation:
    """A rule over several fields; the message names ``keys[0]`` and says what it should be given the others."""

    keys: tuple[str, ...]
    applies: Callable[[Any], bool]
    ok: Callable[[Any], bool]
    expected: Callable[[Any], str]


LM_MIN_ROW = 8  # tokens per row of a language model, whatever its objective (as SEQ_LEN's 8 for the encoders)
# the row-length fields: checked by SEQ_LEN for the encoders (room for [CLS], [SEP] and text) and by the
# language-model relations in RELATIONS for the language models (room for a packed sample)
ROW_LENGTH = ("model.max_seq_length", "data.max_seq_length")


def _lm_shortest_row(r) -> int:
    return max(LM_MIN_ROW, r.objective.min_sample_space)


def _lm_row_expected(r) -> str:
    """What a language model's row length must be: a row takes a sample only while objective.min_sample_space
    slots are left, so a shorter row never holds one."""
    if r.objective.min_sample_space <= LM_MIN_ROW:
        return f"at least {LM_MIN_ROW} tokens per row"
    return (
        f"at least objective.min_sample_space = {r.objective.min_sample_space} (a row takes a sample only while "
        "that much room is left; lower objective.min_sample_space for shorter rows)"
    )


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
        ("data.split_digits", "data.tokenizer_type"),
        lambda r: r.data.split_digits,
        lambda r: r.data.tokenizer_type == "byte_bpe" and r.data.tokenizer == "train",
        lambda r: "false: it shapes a byte_bpe tokenizer trained on the corpus (data.tokenizer: train)",
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
        lambda r: getattr(r.model, "sgu", None) == "split_multiplicative",  # a family with the field (gMLP's)
        lambda r: r.model.intermediate_size % 2 == 0,
        lambda r: "an even number (model.sgu = 'split_multiplicative' halves it)",
    ),
    Relation(
        ("data.max_seq_length", "model.max_seq_length"),
        lambda r: r.data.max_seq_length is not None,
        lambda r: r.data.max_seq_length <= r.model.max_seq_length,
        lambda r: f"at most model.max_seq_length = {r.model.max_seq_length}",
    ),
    # a language model's row holds packed objective samples, not [CLS] text [SEP]: its row length has its own rule
    Relation(
        ("model.max_seq_length", "objective.min_sample_space"),
        lambda r: is_lm(r.model.arch),
        lambda r: r.model.max_seq_length >= (LM_MIN_ROW if r.data.max_seq_length else _lm_shortest_row(r)),
        lambda r: f"at least {LM_MIN_ROW} tokens per row" if r.data.max_seq_length else _lm_row_expected(r),
    ),
    Relation(
        ("data.max_seq_length", "objective.min_sample_space"),
        lambda r: is_lm(r.model.arch) and r.data.max_seq_length is not None,
        lambda r: r.data.max_seq_length >= _lm_shortest_row(r),
        _lm_row_expected,
    ),
    Relation(
        ("objective.controller.top_n", "objective.controller.proposals"),
        lambda r: True,
        lambda r: r.objective.controller.top_n <= r.objective.controller.proposals,
        lambda r: f"at most objective.controller.proposals = {r.objective.controller.proposals}",
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
    lm = is_lm(recipe.model.arch)
    # a family outside models.config.CONFIGS (its module imported on use) brings the ranges of its own fields
    own = {f"model.{k}": rule for k, rule in type(recipe.model).FIELD_RANGES.items() if f"model.{k}" not in FIELDS}
    for field, rule in {**FIELDS, **own}.items():
        if lm and field in ROW_LENGTH:
            continue  # the language-model relations below say it in a language model's terms
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


def entries(text: str | None) -> tuple[int, int] | None:
    """``--entries N`` or ``LO-HI``: phone books of N entries, or of LO to HI."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split("-")]
    if len(parts) <= 2 and all(p.isdigit() for p in parts) and 1 <= int(parts[0]) <= int(parts[-1]):
        return int(parts[0]), int(parts[-1])
    raise UserError(f"--entries = {text!r}: expected N or LO-HI with 1 <= LO <= HI, e.g. 4 or 2-8")


def run_dir(path: str | Path, opt: str) -> None:
    """A run directory given on the command line exists (checked before the slow imports); a gs:// one is
    reachable, and its records are fetched (ssmlm.staging)."""
    if paths.is_remote(path):
        paths.check_url(str(path), opt)
    d = staging.records(path)
    if not (d / "run.json").is_file() or not (d / "recipe.yaml").is_file():
        raise CheckpointError(f"{opt} {path}: not an ssmlm run directory (expected run.json and recipe.yaml)")


def checkpoint_steps(path: str | Path) -> list[int]:
    """The steps a run holds checkpoints of, from the directory names alone (RUN/checkpoints/<step>; a save
    still being written is <step>.orbax-checkpoint-tmp…, a name that is not a number): no jax, no Orbax. In a
    bucket, where Orbax marks a finished save with a file rather than a rename, the steps that have that file."""
    if paths.is_remote(path):
        done = paths.glob(paths.join(str(path), "checkpoints", "*", "commit_success.txt"))
        return sorted(int(u.rsplit("/", 2)[1]) for u in done if u.rsplit("/", 2)[1].isdigit())
    d = Path(path).expanduser() / "checkpoints"
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())


def checkpoint_step(path: str | Path, step: int | None, opt: str) -> None:
    """A run given with a step to start from holds a checkpoint at that step (checked before the slow imports)."""
    if step is None:
        return
    option(opt, step, POSITIVE)
    steps = checkpoint_steps(path)
    if not steps:
        raise CheckpointError(f"{opt} {step}: {path} has no checkpoints")
    if step not in steps:
        have = (
            f"checkpoints at steps {', '.join(map(str, steps))}"
            if len(steps) > 1
            else f"a checkpoint at step {steps[0]}"
        )
        raise CheckpointError(f"{opt} {step}: {path} has {have} (pretraining with train.keep_steps keeps others)")


# ----------------------------------------------------------------------------- output paths


def output_dir(path: str | Path, where: str, given: str | Path | None = None) -> None:
    """A directory the command will write can be written: not a file, and creatable and writable by this user,
    which is only certain once tried. So a probe file is written in it and removed again, with every directory
    the probe created: the file system is left as it was, whether the check passes or fails. ``given``: the path
    to name in the message, when it is not ``path`` (a file in it). A gs:// URL: its bucket can be reached."""
    if paths.is_remote(path):
        paths.check_url(str(path), where)
        return
    d = Path(path).expanduser()
    given = path if given is None else given
    if d.exists() and not d.is_dir():
        what = "is a file" if Path(given).expanduser() == d else f"'{d}' is a file"
        raise UserError(f"{where} '{given}': {what}; expected a directory to write into")
    made: list[Path] = []
    try:
        # the hosts of a run on a shared disk check the same folder at once: one may make a directory another
        # is about to make, or remove the one it made while another writes its probe there; each then tries again
        for attempt in range(3):
            try:
                for parent in reversed([d, *d.parents]):
                    if not parent.exists():
                        try:
                            parent.mkdir()
                        except FileExistsError:
                            continue
                        made.append(parent)
                probe = d / f".ssmlm-write-check-{os.getpid()}"
                probe.write_bytes(b"")
                probe.unlink()
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
    except OSError as e:
        why = e.strerror or str(e)
        inside = "" if Path(given).expanduser() == d else f" in '{d}'"
        raise UserError(f"{where} '{given}': cannot write{inside} ({why}); expected a writable directory") from None
    finally:
        for p in reversed(made):
            try:
                p.rmdir()
            except OSError:
                pass


def output_file(path: str | Path, where: str) -> None:
    """A file the command will write: not a directory, and its directory writable (see output_dir)."""
    if paths.is_remote(path):
        paths.check_url(str(path), where)
        return
    p = Path(path).expanduser()
    if p.is_dir():
        raise UserError(f"{where} '{path}': is a directory; expected a file path")
    output_dir(p.parent, where, given=path)
