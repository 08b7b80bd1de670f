"""Recipes: YAML files that load into typed, frozen config objects.

A recipe is plain data. Loading goes: safe-load YAML -> merge over its ``base:`` chain -> apply
``--set a.b=value`` overrides -> validate into dataclasses -> check value ranges (ssmlm.checks). Defaults
live in exactly one place, the dataclasses; validation errors name the file, the dotted key and what was
expected.

This module only loads, merges and dispatches. The sections' dataclasses and the ranges of their fields
belong to the packages that read them: ``model:`` ssmlm.models.config, ``data:`` and ``task:``
ssmlm.data.config, ``objective:`` ssmlm.objectives.config, ``train:`` and ``mesh:`` ssmlm.train_config.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from ssmlm import yamlfile
from ssmlm.checks import validate
from ssmlm.data.config import DataConfig, PhonebookSettings, TaskConfig
from ssmlm.errors import RecipeError
from ssmlm.models.config import FAMILIES, ModelConfig, config_class, owners
from ssmlm.objectives.config import ControllerSettings, ObjectiveConfig
from ssmlm.train_config import MeshConfig, ParamRuleConfig, TrainConfig

__all__ = [
    "ControllerSettings",
    "DataConfig",
    "MeshConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "ParamRuleConfig",
    "Origins",
    "PhonebookSettings",
    "Recipe",
    "TaskConfig",
    "TrainConfig",
    "apply_overrides",
    "builtin_recipes",
    "from_dict",
    "load_raw",
    "load_recipe",
    "parse_override",
    "resolve_path",
]

# ----------------------------------------------------------------------------- sections
# Each section's dataclasses and the ranges of their fields live beside the package that reads them; they are
# re-exported here, so ``from ssmlm.recipe import TrainConfig`` works as before.


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str = "run"
    description: str = ""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    objective: ObjectiveConfig = dataclasses.field(default_factory=ObjectiveConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def fingerprint(self, *sections: str) -> str:
        d = self.to_dict()
        if sections:
            d = {k: d[k] for k in sections}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def seq_len(self) -> int:
        return self.data.max_seq_length or self.model.max_seq_length


# ----------------------------------------------------------------------------- loading

RECIPE_DIRS = [
    Path(__file__).resolve().parent.parent / "recipes",  # a source checkout / editable install
    Path(__file__).resolve().parent / "_recipes",  # inside the wheel
]


def builtin_recipes() -> dict[str, Path]:
    """Recipes shipped with ssmlm, by stem name."""
    found: dict[str, Path] = {}
    for d in RECIPE_DIRS:
        if d.is_dir():
            for p in sorted(d.glob("*.yaml")):
                found.setdefault(p.stem, p)
    return found


def resolve_path(ref: str, relative_to: Path | None = None) -> Path:
    """A recipe reference: a path (absolute, or relative to the cwd / the including recipe) or a bare name."""
    cands = [Path(ref)]
    if relative_to is not None:
        cands.insert(0, relative_to / ref)
    for c in cands:
        if c.is_file():
            return c.resolve()
    stem = Path(ref).name.removesuffix(".yaml").removesuffix(".yml")
    shipped = builtin_recipes()
    if stem in shipped:
        return shipped[stem]
    hint = difflib.get_close_matches(stem, list(shipped), n=1)
    extra = f"; did you mean '{hint[0]}'?" if hint else f"; shipped recipes: {', '.join(shipped) or 'none'}"
    raise RecipeError(f"recipe not found: '{ref}'{extra}")


def _read_yaml(path: Path) -> dict[str, Any]:
    text = path.read_text()
    try:
        data = yamlfile.load(text)
    except yamlfile.DuplicateKeyError as e:
        raise RecipeError(f"{path}: {e}; the second would silently replace the first: keep one") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{path}: not valid YAML{_yaml_where(e, text)}: {getattr(e, 'problem', e)}") from None
    if data is None:  # an empty file would otherwise silently be the paper's full-size configuration
        raise RecipeError(f"{path}: the recipe is empty; start one with e.g. 'base: default'")
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    return data


def _yaml_where(e: yaml.YAMLError, text: str) -> str:
    """The line of a YAML error. PyYAML marks where it noticed the problem; at the end of the file (an
    unclosed bracket or quote) that is past the last line, and the opening (context_mark) is the useful one."""
    problem, context = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
    if problem is None:
        return ""
    last = max(len(text.splitlines()), 1)
    if problem.line + 1 > last or problem.index >= len(text.rstrip()):
        if context is not None:
            return f" (line {context.line + 1}, left open)"
        return f" (line {last})"
    return f" (line {problem.line + 1})"


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _record_origins(data: dict, file: str, origins: dict[str, str], prefix: str = "") -> None:
    for k, v in data.items():
        origins[prefix + str(k)] = file
        if isinstance(v, dict):
            _record_origins(v, file, origins, f"{prefix}{k}.")


def load_raw(
    ref: str | Path, _seen: tuple[Path, ...] = (), relative_to: Path | None = None, origins: dict | None = None
) -> dict:
    """The merged plain data of a recipe and its ``base:`` chain. ``origins`` (if given) receives, for
    every dotted key, the file that set it last — so errors point at the file that holds the mistake."""
    path = resolve_path(str(ref), relative_to)
    if path in _seen:
        raise RecipeError(f"{path}: 'base:' chain loops back to itself")
    own = _read_yaml(path)
    base = own.pop("base", None)
    origins = origins if origins is not None else {}
    data = own
    if base is not None:
        if not isinstance(base, str):
            raise RecipeError(f"{path}: 'base' must be a recipe name or path, got {base!r}")
        try:
            base_path = resolve_path(base, path.parent)
        except RecipeError as e:  # name the recipe holding the 'base:' line, not only the missing file
            raise RecipeError(f"{path}: base: {e}") from None
        inherited = load_raw(base_path, _seen + (path,), path.parent, origins)
        if isinstance(own.get("model"), dict) and "arch" in own["model"]:
            inherited = _for_family(inherited, own["model"]["arch"])
        data = _merge(inherited, own)
    _record_origins(own, str(path), origins)  # after the base's, so this file's keys win
    data["name"] = own.get("name") or path.stem  # a variant is named after its own file, not its base
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise RecipeError(f"--set '{text}': expected KEY=VALUE, e.g. model.hidden_size=256")
    key, value = text.split("=", 1)
    try:
        parsed = yamlfile.load(value) if value != "" else ""
    except yamlfile.DuplicateKeyError as e:
        raise RecipeError(f"--set '{text}': {e}; keep one") from None
    except yaml.YAMLError:
        parsed = value
    return key.strip().split("."), parsed


def apply_overrides(data: dict, overrides: list[str], origins: dict | None = None) -> dict:
    data = json.loads(json.dumps(data))  # deep copy of plain data
    overridden: set[str] = set()
    for text in overrides:
        keys, value = parse_override(text)
        if origins is not None:
            origins[".".join(keys)] = "--set"
        node = data
        for i, k in enumerate(keys[:-1]):
            if origins is not None and k not in node:  # a section no file mentions: the mistake is on the command line
                origins[".".join(keys[: i + 1])] = "--set"
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise RecipeError(f"--set '{text}': '{k}' is not a section")
        node[keys[-1]] = value
        if keys == ["model", "arch"]:
            data = _for_family(data, value, keep=overridden)
        overridden.add(".".join(keys))
    return data


def _for_family(data: dict, arch, keep: set[str] = frozenset()) -> dict:
    """``data`` without the model fields that ``arch``'s family lacks: a recipe (or --set) that changes the
    arch of its base keeps the base's shared fields and drops the old family's own (e.g. gate_norm when a
    gMLP recipe builds on the BiGS default). Keys in ``keep`` (set explicitly) stay, to be reported."""
    model = data.get("model")
    if not isinstance(model, dict) or arch not in FAMILIES:
        return data  # an unknown arch is reported when the section is validated
    allowed = {f.name for f in dataclasses.fields(config_class(arch))}
    model = {k: v for k, v in model.items() if k in allowed or f"model.{k}" in keep}
    return {**data, "model": model}


def load_recipe(ref: str | Path | None, overrides: list[str] | None = None, default: str = "default") -> Recipe:
    """Load a recipe by path or shipped name (None: the shipped ``default``), apply overrides, validate."""
    ref = ref if ref is not None else default
    origins: dict[str, str] = {}
    raw = apply_overrides(load_raw(ref, origins=origins), overrides or [], origins)
    source = Origins(str(resolve_path(str(ref))), origins)
    recipe = from_dict(Recipe, raw, source)
    validate(recipe, source)  # ranges and cross-field rules (ssmlm.checks), before anything is read or written
    return recipe


class Origins(str):
    """The recipe file, plus which file (or --set) set each dotted key, for error messages."""

    def __new__(cls, file: str, by_key: dict[str, str]):
        obj = super().__new__(cls, file)
        obj.by_key = by_key
        return obj

    def of(self, dotted: str) -> str:
        """The file that set ``dotted`` or, failing that, its nearest enclosing section."""
        key = dotted.split("[")[0]
        while key:
            if key in self.by_key:
                return self.by_key[key]
            key = key.rpartition(".")[0]
        return str(self)


def _src(source: str, dotted: str) -> str:
    return source.of(dotted) if isinstance(source, Origins) else source


def from_dict(cls, data: Any, source: str, path: str = ""):
    """Validate plain data into dataclass ``cls``; errors name the source file and dotted key."""
    where = f"{_src(source, path)}: {path or '(top level)'}"
    if not isinstance(data, dict):
        raise RecipeError(f"{where}: expected a mapping, got {data!r}")
    if cls is ModelConfig:
        cls = _family_config(data, source, path)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls, vars(importlib.import_module(cls.__module__)))
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if dotted in MOVED:
            raise RecipeError(f"{_src(source, dotted)}: '{dotted}' has moved to '{MOVED[dotted]}'")
        if key not in fields and issubclass(cls, ModelConfig) and (have := owners(str(key))):
            raise RecipeError(
                f"{_src(source, dotted)}: '{dotted}' is not an option of model.arch {data.get('arch', cls.arch)!r}; "
                f"it belongs to {', '.join(have)}"
            )
        if key not in fields:
            hint = difflib.get_close_matches(str(key), list(fields), n=1)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else f"; valid keys: {', '.join(fields)}"
            raise RecipeError(f"{_src(source, dotted)}: unknown key '{dotted}'{suggestion}")
        kwargs[key] = _coerce(hints[key], value, source, dotted)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise RecipeError(f"{where}: {e}") from None


# keys that moved to another section: their new place, for a one-line error
MOVED = {f"data.{k}": f"objective.{k}" for k in ("masked_lm_prob", "max_predictions", "duplicate_factor")}


def _family_config(data: dict, source: str, path: str) -> type[ModelConfig]:
    arch = data.get("arch", ModelConfig.arch)
    if arch not in FAMILIES:
        dotted = f"{path}.arch"
        hint = difflib.get_close_matches(str(arch), list(FAMILIES), n=1)
        raise RecipeError(
            f"{_src(source, dotted)}: '{dotted}' = {arch!r}: expected one of {', '.join(map(repr, FAMILIES))}"
            + (f"; did you mean '{hint[0]}'?" if hint else "")
        )
    return config_class(arch)


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _coerce(tp, value, source: str, dotted: str):
    origin = typing.get_origin(tp)
    bad = RecipeError(f"{_src(source, dotted)}: '{dotted}' = {value!r}: expected {_type_name(tp)}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, source, dotted)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, source, dotted)
            except RecipeError:
                continue
        raise bad
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        hint = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(tp)], n=1)
        raise RecipeError(
            f"{_src(source, dotted)}: '{dotted}' = {value!r}: expected {_type_name(tp)}"
            + (f"; did you mean '{hint[0]}'?" if hint else "")
        )
    if origin is list:
        if not isinstance(value, list):
            raise bad
        (item,) = typing.get_args(tp)
        return [_coerce(item, v, source, f"{dotted}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    if tp is Any:
        return value
    raise bad
