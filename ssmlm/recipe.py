"""Recipes: YAML files that load into typed, frozen config objects.

A recipe is plain data. Loading goes: safe-load YAML -> merge over its ``base:`` chain -> apply
``--set a.b=value`` overrides -> validate into dataclasses -> check value ranges (ssmlm.checks). Defaults
live in exactly one place, the dataclasses; validation errors name the file, the dotted key and what was
expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from ssmlm.checks import validate
from ssmlm.errors import RecipeError

# ----------------------------------------------------------------------------- sections


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The encoder. Defaults are the BiGS paper's (Section 4 and Table 7) large model."""

    # bigs = gated/ssm; stack_ssm, gated_att and bert (= stack/att) are the BiGS paper's ablations;
    # gmlp / amlp are "Pay Attention to MLPs". Registry: ssmlm.models.ENCODERS.
    arch: Literal["bigs", "stack_ssm", "gated_att", "bert", "gmlp", "amlp"] = "bigs"
    vocab_size: int | None = None  # None: take it from the tokenizer
    hidden_size: int = 1024  # d
    num_layers: int = 23  # gated layers (BERT-large has 24 stacked ones; BiGS uses 23 to match size)
    intermediate_size: int = 3072  # 3d: width of V and U in the gated block
    max_seq_length: int = 128  # rows of the position table; the SSM kernel length follows the input
    num_ssm: int = 64  # N, states per SSM
    type_vocab_size: int = 2
    dropout: float = 0.1  # after the embedding LayerNorm and before classifiers (official code)
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    a_init: Literal["hippo", "lin", "inv"] = "hippo"  # S4D initialisation of A (official default: hippo)
    gelu: Literal["exact", "tanh"] = "exact"  # paper: GELU; official Flax code: tanh approximation
    # Sequence-classification pooler, then Dense + tanh. None = the family's own (ssmlm.models.heads.POOLERS):
    # [CLS] for bert / gmlp / amlp as in their papers, the mean over non-padding tokens for the BiGS family.
    pooler: Literal["non_padding_mean", "mean", "cls"] | None = None
    # LayerNorm after the last block of a pre-norm encoder (BiGS, gated/att, gMLP/aMLP, pre-LN stacks). The
    # official BiGS code has none: its MLM head normalises, so nothing bounds the residual stream, which grows
    # to ~1e3 and saturates the finetuning pooler's tanh (issue 9). false = the official layout.
    final_norm: bool = True
    # BiGS: LayerNorm on the gate product U1 ⊗ Flip(U2) before W_u. Off = the paper's (and official) block; on,
    # no layer's branch can grow quadratically and drown the residual stream (issue 9; recipes/default.yaml).
    gate_norm: bool = False
    # Zero padded positions before token mixing (SSM convolutions, gMLP spatial projection), so an example's
    # prediction does not depend on its batch's padding. false = the official BiGS code / gMLP paper.
    mask_padding: bool = True
    ssm_kernels: Literal["shared", "per_channel"] = "shared"  # official BiGS: one kernel for all channels
    num_heads: int = 16  # attention heads (gated_att, bert)
    # stack_ssm / bert: pre-LN (academic-budget-bert, the controlled setting BiGS Table 1 cites) or BERT's post-LN
    stack_norm: Literal["pre", "post"] = "pre"
    sgu: Literal["split_multiplicative", "multiplicative", "additive", "linear"] = (
        "split_multiplicative"  # gMLP Table 3
    )
    spatial: Literal["toeplitz", "dense"] = "toeplitz"  # gMLP spatial weights (Toeplitz for MLM: 2n-1 params)
    tiny_attention_size: int = 64  # aMLP: width of the single-head attention
    causal: bool = False  # gMLP: causal spatial weights (never look ahead)
    remat: bool = False  # rematerialise each block in the backward pass (less memory, more compute)
    # Blocks stacked and run under one scan: compile time independent of depth, same function and initial
    # values. false = one module per block in a Python loop (the layout of runs written before this option).
    scan_layers: bool = True
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"  # bf16 only pays off on GPU/TPU


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Pretraining corpus, tokenizer and offline masking (Izsak et al. / BiGS shards)."""

    source: str = "builtin"  # builtin | a file, directory or glob (txt/jsonl/csv/parquet) | hub:NAME[:CONFIG]
    text_field: str = "text"  # column holding the text in jsonl/csv/parquet/hub sources
    split: str = "train"  # hub split
    max_documents: int | None = None  # cap on documents read (None: all)
    tokenizer: str = "train"  # 'train' a WordPiece on the corpus, or a vocab.txt / tokenizer.json path
    vocab_size: int = 30522  # when training a tokenizer
    lowercase: bool = True
    max_seq_length: int | None = None  # None: the model's max_seq_length
    masked_lm_prob: float = 0.15
    max_predictions: int | None = None  # None: round(0.15 * max_seq_length); BiGS shards use 20 at 128
    duplicate_factor: int = 10  # differently-masked copies of every sequence
    short_seq_prob: float = 0.1  # chance of a shorter target length, as in BERT data generation
    # how a document's lines become rows (ssmlm.data.masking): fill = cut into rows of exactly the target
    # length, a line's overflow starting the next row (nothing lost); bert = create_pretraining_data: whole
    # lines up to the target, overflow trimmed (discards text); full = fill across documents, [SEP] between
    packing: Literal["fill", "bert", "full"] = "fill"
    validation_fraction: float = 0.01  # documents held out for evaluation
    seed: int = 42


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """A finetuning task: a known name, or local files with named columns."""

    name: str | None = None  # a known task (see `ssmlm finetune --help`), e.g. builtin-order, sst2, mnli
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    data_dir: str | None = None  # directory in the task's file layout (e.g. GLUE TSVs)
    text_fields: list[str] | None = None  # one field (single sentence) or two (sentence pair)
    label_field: str | None = None
    num_labels: int | None = None  # 1 means regression
    max_seq_length: int | None = None  # None: the checkpoint's max_seq_length
    padding: Literal["max_length", "longest"] = "max_length"  # official BiGS: every input padded to the length


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training stage (pretrain, extend-length or finetune). Defaults: BiGS Table 7 pretraining."""

    steps: int = 1_000_000  # optimizer updates (ignored when epochs is set)
    epochs: float | None = None  # finetuning: passes over the training set
    batch_size: int = 760  # global batch (sequences)
    learning_rate: float = 6e-4
    schedule: Literal["cosine", "linear", "constant"] = "linear"
    warmup_steps: int | None = None  # None: warmup_ratio * total steps
    warmup_ratio: float = 0.01
    end_lr_ratio: float = 0.1  # cosine decays to this fraction of the peak (official alpha 0.1)
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    weight_decay: float = 0.05  # never on biases or LayerNorm parameters
    grad_clip: float = 0.0  # global-norm clip; 0 = off (Table 7)
    grad_accum: int = 1  # micro-batches per update (same result, less activation memory)
    ssm_lr_multiplier: float = 1.0  # learning-rate factor for SSM parameters (S4 practice: < 1; official BiGS: 1)
    ssm_weight_decay: bool = True  # decay SSM parameters too (official BiGS: yes; S4 practice: no)
    max_skipped_steps: int = 10  # updates skipped for a non-finite loss/gradient before the run stops
    seed: int = 42
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 20
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2  # the newest N checkpoints are kept
    keep_best: str | None = None  # also keep the best checkpoint by this validation metric (e.g. mlm_loss, accuracy)
    peak_flops: float | None = None  # device peak FLOP/s for the MFU estimate (known GPUs/TPUs are looked up)
    out_dir: str = "runs"
    init_from: str | None = None  # run directory whose weights start this stage (extend-length, finetune)
    position_init: Literal["tile", "random"] = "tile"  # extend-length: how new position rows start


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh: batch over data x fsdp, parameters fully sharded over fsdp and split over tensor."""

    data: int = -1  # -1: every device not used by the other axes
    fsdp: int = 1
    tensor: int = 1


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str = "run"
    description: str = ""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
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
        data = yaml.safe_load(text)
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
        data = _merge(load_raw(base_path, _seen + (path,), path.parent, origins), own)
    _record_origins(own, str(path), origins)  # after the base's, so this file's keys win
    data["name"] = own.get("name") or path.stem  # a variant is named after its own file, not its base
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise RecipeError(f"--set '{text}': expected KEY=VALUE, e.g. model.hidden_size=256")
    key, value = text.split("=", 1)
    try:
        parsed = yaml.safe_load(value) if value != "" else ""
    except yaml.YAMLError:
        parsed = value
    return key.strip().split("."), parsed


def apply_overrides(data: dict, overrides: list[str], origins: dict | None = None) -> dict:
    data = json.loads(json.dumps(data))  # deep copy of plain data
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
    return data


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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in fields:
            hint = difflib.get_close_matches(str(key), list(fields), n=1)
            suggestion = f"; did you mean '{hint[0]}'?" if hint else f"; valid keys: {', '.join(fields)}"
            raise RecipeError(f"{_src(source, dotted)}: unknown key '{dotted}'{suggestion}")
        kwargs[key] = _coerce(hints[key], value, source, dotted)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise RecipeError(f"{where}: {e}") from None


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
