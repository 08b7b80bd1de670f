"""The `model:` section of a recipe: the fields every family shares, each family's own config class, and
the registry of families. Plain dataclasses (no jax), so that reading and checking a recipe stays instant.

Each family has its own config class (a subclass of ModelConfig with its extra fields, below) and a module
of ssmlm.models with its encoders, its extra FLOPs (``mixing_flops``) and, where the family has
length-dependent parameters, its ``extend_params``. ``model.arch`` picks the family: ``ModelConfig(arch=
"gmlp", sgu=...)`` builds a ``GMLPConfig``, and a recipe naming a field of another family is refused with the
family that has it.

A family is one module plus one registry line in FAMILIES. The module has ``Config`` (its config class, a
ModelConfig subclass), ``MODELS`` (arch -> model class: an encoder, or a language model), ``mixing_flops``
and ``param_rules``, and may declare ``ARCHS`` (arch -> ArchFacts: its name in reports, S4D kernels, its
Table 6 column, padding). The config class declares what recipe checking needs to know without jax (class
variables, below: whether it is a language model, its finetuning pooler, its paper's "arch / route" label,
which of its archs have attention heads). Each Birdie LM block is such a module too, its config class the
shared LMConfig and its ARCHS ssmlm.models.lm.LMBlock declarations. The shipped families' config classes are
also listed here in CONFIGS, so that reading and checking a recipe never imports jax (a test holds CONFIGS to
the modules' own ``Config``); a family not listed there is imported when its arch is first named.

RANGES, at the end, gathers the allowed values each config class declares of its fields (FIELD_RANGES);
ssmlm.checks applies it to a recipe.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import ClassVar, Literal

from ssmlm.schema import POSITIVE, SEQ_LEN, Rule, above, within

# arch -> the module that implements it (imported on use, so one family's module never loads another's)
FAMILIES = {
    "bigs": "ssmlm.models.bigs",  # gated/ssm
    "gated_att": "ssmlm.models.bigs",  # gated/att (BiGS ablation)
    "stack_ssm": "ssmlm.models.stack",  # stack/ssm (BiGS ablation)
    "bert": "ssmlm.models.stack",  # stack/att
    "gmlp": "ssmlm.models.gmlp",  # "Pay Attention to MLPs"
    "amlp": "ssmlm.models.gmlp",  # gMLP + one tiny attention head
    # Birdie's language models: one module per block, each a family module of ssmlm.models.lm's LanguageModel
    "gated_ssm": "ssmlm.models.gated_ssm",  # Birdie: fused Gated SSM (paper §3.4, A.16.1)
    "gated_ssm_plus": "ssmlm.models.gated_ssm",  # Birdie: Gated SSM+ (paper App. E.2: Conv1D, gated z, separate MLP)
    "hawk": "ssmlm.models.hawk",  # Birdie: Hawk / RG-LRU (Griffin)
    "transformer_lm": "ssmlm.models.transformer_lm",  # Birdie: prefix-LM Transformer baseline
}


def family(arch: str) -> ModuleType:
    """The module implementing ``arch`` (KeyError for an unknown arch: callers check names first)."""
    return importlib.import_module(FAMILIES[arch])


def config_class(arch: str) -> type[ModelConfig]:
    module = FAMILIES[arch]
    return CONFIGS[module] if module in CONFIGS else importlib.import_module(module).Config


def is_lm(arch: str) -> bool:
    """A language model (Birdie's families) rather than an encoder: the one place this is decided."""
    return config_class(arch).LANGUAGE_MODEL


@dataclasses.dataclass(frozen=True)
class ArchFacts:
    """What the reports, analyses and task checks ask of one arch, declared by its family module in ``ARCHS``
    (arch -> ArchFacts; ssmlm.models.lm.LMBlock for a Birdie block). An arch its module does not list there
    gets these defaults, named by its arch."""

    name: str  # the family's name in reports ("BiGS", "Hawk (Birdie)")
    ssm_kernels: bool = False  # its layers have S4D kernels (analyze kernels plots them)
    table6: str | None = None  # the BiGS paper's Table 6 column its FLOPs are compared with (analyze flops)
    # its token mixing never sees padding, even with model.mask_padding false (attention masks padded keys)
    pad_blind: bool = False


def facts(arch: str) -> ArchFacts:
    """The declared facts of ``arch`` (imports its family module; an unknown arch gets the defaults)."""
    found = getattr(family(arch), "ARCHS", {}).get(arch) if arch in FAMILIES else None
    return found or ArchFacts(name=arch)


def lm_archs() -> list[str]:
    return [a for a in FAMILIES if is_lm(a)]


def default_pooler(cfg: ModelConfig) -> str:
    """The sequence-classification pooler of ``cfg``: model.pooler if set, else its family's (POOLERS)."""
    return cfg.pooler or type(cfg).POOLERS[cfg.arch]


# model.scan_layers: auto scans stacks of at least this many blocks. benchmarks/compile.py --only auto (BiGS d 128,
# 2026-11-26, 2-core CPU): the scan costs 9-37% of every step at 4, 12 and 24 layers, unrolling ~1 s of compile per
# block (5 / 12 / 28 s against 5 / 5 / 7 scanned); 24 keeps every unrolled compile up to bigs_full's 23 layers under
# ~30 s and scans the deep Table 4 gMLPs (docs/benchmarks.md, "Compile time").
SCAN_LAYERS_FROM = 24


def layers_scanned(cfg: ModelConfig) -> bool:
    """Whether the encoder stack of ``cfg`` runs its blocks under one scan (model.scan_layers, auto resolved)."""
    if cfg.scan_layers == "auto":
        return cfg.num_layers >= SCAN_LAYERS_FROM
    return bool(cfg.scan_layers)


def route_label(arch: str) -> str | None:
    """The BiGS paper's "arch / route" label of an arch (Table 1), if it has one."""
    return config_class(arch).ROUTES.get(arch) if arch in FAMILIES else None


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Fields every encoder family has. Defaults are the BiGS paper's (Section 4 and Table 7) large model.

    ``ModelConfig(arch=..., ...)`` returns an instance of that arch's family config (see FAMILIES)."""

    arch: str = "bigs"  # bigs, gated_att, stack_ssm, bert (BiGS paper), gmlp, amlp ("Pay Attention to MLPs")
    vocab_size: int | None = None  # None: take it from the tokenizer
    hidden_size: int = 1024  # d
    num_layers: int = 23  # blocks (BERT-large has 24 stacked ones; BiGS uses 23 gated ones to match size)
    intermediate_size: int = 3072  # BiGS: width of V and U (3d); stacks: FFN width; gMLP: d_ffn
    max_seq_length: int = 128  # rows of the position table; SSM kernels follow the input length
    type_vocab_size: int = 2
    dropout: float = 0.1  # after the embedding LayerNorm and before classifiers (official code)
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    gelu: Literal["exact", "tanh"] = "exact"  # paper: GELU; official Flax code: tanh approximation
    # Sequence-classification pooler, then Dense + tanh. None = the family's own (ssmlm.models.heads.POOLERS):
    # [CLS] for bert / gmlp / amlp as in their papers, the mean over non-padding tokens for the BiGS family.
    pooler: Literal["non_padding_mean", "mean", "cls"] | None = None
    # LayerNorm after the last block of a pre-norm encoder (BiGS, gated/att, gMLP/aMLP, pre-LN stacks). The
    # official BiGS code has none: its MLM head normalises, so nothing bounds the residual stream, which grows
    # to ~1e3 and saturates the finetuning pooler's tanh (docs/faithfulness.md#bigs-final-norm). false = the
    # official layout.
    final_norm: bool = True
    # Zero padded positions before token mixing (SSM convolutions, gMLP spatial projection), so an example's
    # prediction does not depend on its batch's padding. false = the official BiGS code / gMLP paper.
    mask_padding: bool = True
    remat: bool = False  # rematerialise each block in the backward pass (less memory, more compute)
    # Blocks stacked and run under one scan: compile time independent of depth, same function and initial
    # values, but each step pays for the loop. false = one module per block in a Python loop (also the layout
    # of runs written before this option). auto = scan from SCAN_LAYERS_FROM blocks on (layers_scanned).
    scan_layers: bool | Literal["auto"] = "auto"
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"  # bf16 only pays off on GPU/TPU

    # What a family declares (class variables, not recipe fields):
    LANGUAGE_MODEL: ClassVar[bool] = False  # a causal/prefix LM (objective.kind lm) rather than an encoder
    POOLERS: ClassVar[dict[str, str]] = {}  # arch -> its paper's finetuning pooler (model.pooler: None)
    ROUTES: ClassVar[dict[str, str]] = {}  # arch -> the BiGS paper's "arch / route" label (results tables)
    ATTENTION: ClassVar[frozenset[str]] = frozenset()  # archs whose num_heads must divide hidden_size
    # field -> its allowed values (a schema Rule; ssmlm.checks): a family's class adds each numeric field of its own.
    # Annotated as a plain dict: recipe loading resolves these hints in a plug-in family's own module
    FIELD_RANGES: ClassVar[dict] = {
        "vocab_size": POSITIVE,
        "hidden_size": POSITIVE,
        "num_layers": POSITIVE,
        "intermediate_size": POSITIVE,
        "max_seq_length": SEQ_LEN,
        "type_vocab_size": POSITIVE,
        "dropout": within(0, 1, hi_open=True),
        "layer_norm_eps": above(0),
        "initializer_range": above(0),
    }

    def __new__(cls, *args, **kwargs):
        if cls is ModelConfig:  # dispatch to the family's own class
            arch = kwargs.get("arch", "bigs")
            if arch not in FAMILIES:
                raise ValueError(f"unknown model.arch {arch!r}; expected one of {', '.join(FAMILIES)}")
            cls = config_class(arch)
        return super().__new__(cls)


@dataclasses.dataclass(frozen=True)
class SSMFields:
    """Fields of the families that use S4D kernels (BiGS and stack/ssm; docs/faithfulness.md#bigs-s4d)."""

    num_ssm: int = 64  # N, states per SSM
    a_init: Literal["hippo", "lin", "inv"] = "hippo"  # S4D initialisation of A (official default: hippo)
    ssm_kernels: Literal["shared", "per_channel"] = "shared"  # official BiGS: one kernel for all channels


def fields_of(arch: str) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class(arch))}


def owners(field: str) -> list[str]:
    """The archs whose config has ``field`` (for 'belongs to another family' errors)."""
    return [a for a in FAMILIES if field in fields_of(a)]


def all_config_classes() -> list[type[ModelConfig]]:
    seen: list[type[ModelConfig]] = []
    for arch in FAMILIES:
        c = config_class(arch)
        if c not in seen:
            seen.append(c)
    return seen


@dataclasses.dataclass(frozen=True)
class BiGSConfig(SSMFields, ModelConfig):
    """`model:` fields of the gated family: bigs (gated/ssm) and gated_att (gated/att, an ablation)."""

    arch: Literal["bigs", "gated_att"] = "bigs"
    POOLERS: ClassVar[dict[str, str]] = {"bigs": "non_padding_mean", "gated_att": "non_padding_mean"}
    ROUTES: ClassVar[dict[str, str]] = {"bigs": "gated / ssm", "gated_att": "gated / att"}
    ATTENTION: ClassVar[frozenset[str]] = frozenset({"gated_att"})
    FIELD_RANGES: ClassVar[dict] = {**ModelConfig.FIELD_RANGES, "num_ssm": POSITIVE, "num_heads": POSITIVE}
    # LayerNorm on the gate product U1 ⊗ Flip(U2) before W_u. Off = the paper's (and official) block; on,
    # no layer's branch can grow quadratically and drown the residual stream (docs/faithfulness.md#bigs-gate-norm;
    # on in recipes/default.yaml).
    gate_norm: bool = False
    num_heads: int = 16  # gated_att: attention heads


@dataclasses.dataclass(frozen=True)
class StackConfig(SSMFields, ModelConfig):
    """`model:` fields of the stacked family: bert (stack/att) and stack_ssm."""

    arch: Literal["stack_ssm", "bert"] = "bert"
    POOLERS: ClassVar[dict[str, str]] = {"bert": "cls", "stack_ssm": "non_padding_mean"}
    ROUTES: ClassVar[dict[str, str]] = {"stack_ssm": "stack / ssm", "bert": "stack / att"}
    ATTENTION: ClassVar[frozenset[str]] = frozenset({"bert"})
    FIELD_RANGES: ClassVar[dict] = {**ModelConfig.FIELD_RANGES, "num_ssm": POSITIVE, "num_heads": POSITIVE}
    num_heads: int = 16  # bert: attention heads
    # pre-LN (academic-budget-bert, the controlled setting BiGS Table 1 cites) or BERT's post-LN
    stack_norm: Literal["pre", "post"] = "pre"


@dataclasses.dataclass(frozen=True)
class GMLPConfig(ModelConfig):
    """`model:` fields of gMLP and aMLP."""

    arch: Literal["gmlp", "amlp"] = "gmlp"
    POOLERS: ClassVar[dict[str, str]] = {"gmlp": "cls", "amlp": "cls"}
    FIELD_RANGES: ClassVar[dict] = {**ModelConfig.FIELD_RANGES, "tiny_attention_size": POSITIVE}
    sgu: Literal["split_multiplicative", "multiplicative", "additive", "linear"] = (
        "split_multiplicative"  # gMLP Table 3
    )
    spatial: Literal["toeplitz", "dense"] = "toeplitz"  # spatial weights (Toeplitz for MLM: 2n-1 params)
    tiny_attention_size: int = 64  # aMLP: width of the single-head attention
    causal: bool = False  # causal spatial weights (never look ahead)


@dataclasses.dataclass(frozen=True)
class LMConfig(ModelConfig):
    """`model:` fields of the Birdie language models (paper Table 7; docs/faithfulness.md#birdie-models). The LM fields'
    defaults are the paper's 1.4B Gated SSM (state 2560, …); hidden_size and num_layers keep ModelConfig's, so
    the recipes set them (lm_1b4: 2048 × 48, lm_tiny: 128 × 4). Shared fields: hidden_size = d, num_layers =
    blocks; max_seq_length is only the training length (no position table: the SSMs need none, the Transformer
    uses RoPE)."""

    # any arch whose FAMILIES module is a Birdie block (the recipe checks the name against FAMILIES)
    arch: str = "gated_ssm"
    LANGUAGE_MODEL: ClassVar[bool] = True
    ATTENTION: ClassVar[frozenset[str]] = frozenset({"transformer_lm"})
    FIELD_RANGES: ClassVar[dict] = {
        **ModelConfig.FIELD_RANGES,
        "num_heads": POSITIVE,
        "state_size": POSITIVE,
        "mlp_expansion": above(0),
        "conv_width": POSITIVE,
        "rope_base": above(0),
        "rg_lru_c": above(0),
        "norm_eps": above(0),
    }
    state_size: int = 2560  # N, the recurrence width of the SSMs
    # which layers process the prefix bidirectionally (state split in halves, the second scanned right to
    # left inside the prefix): alternate = bidir, causal, bidir, … (the paper); all; none ("Birdie-Causal").
    # The Transformer's prefix-LM attention is on in every layer unless this is none.
    bidirectional: Literal["alternate", "all", "none"] = "alternate"
    mlp_expansion: float = 8 / 3  # gated MLP width / d (gated_ssm_plus, hawk, transformer_lm)
    conv_width: int = 4  # causal Conv1D before the recurrence (gated_ssm_plus, hawk)
    # gated_ssm_plus: how the E.2 listing's `Conv(features=state_size, kernel_size=4)` on the block input is
    # read: depthwise at width d (the short convolutions of the prior work §3.4 cites; default), or dense
    # d -> N as flax's Conv literally computes (4·d·N parameters).
    plus_conv: Literal["depthwise", "dense"] = "depthwise"
    num_heads: int = 16  # transformer_lm (head size hidden_size / num_heads)
    rope_base: float = 250_000.0  # transformer_lm
    rg_lru_c: float = 8.0  # hawk: a_t = sigma(Lambda)^(c r_t)
    # hawk: initial Λ. paper: a^c (a at r = 1) uniform in [0.9, 0.999], as the Griffin paper's text says;
    # recurrentgemma: DeepMind's code, the base a uniform in ring area on [0.9, 0.999], so a^c spans ~0.43-0.99.
    rg_lru_init: Literal["paper", "recurrentgemma"] = "paper"
    norm_eps: float = 1e-6  # RMSNorm
    tie_embeddings: bool = False
    # The recurrences' time scan (ssmlm.models.scan): associative (log-depth, parallel: GPU/TPU), sequential
    # (one lax.scan step per token: on CPU faster to run and to compile), auto = sequential on CPU only.
    scan_impl: Literal["auto", "associative", "sequential"] = "auto"
    # transformer_lm's attention (ssmlm.models.attention): dense (the full masked L × L matrix), blockwise
    # (skips query/key blocks with no allowed pair: other packed samples, the causal future), cudnn
    # (jax.nn.dot_product_attention's cuDNN kernel, GPU only), splash (the Pallas TPU kernel; causal layers only),
    # auto = for the platform compiled for: blockwise on CPU, cudnn on GPU (with cuDNN), splash on TPU for causal
    # layers, else dense.
    attention: Literal["auto", "dense", "blockwise", "cudnn", "splash"] = "auto"


# family module -> its config class
CONFIGS = {
    "ssmlm.models.bigs": BiGSConfig,
    "ssmlm.models.stack": StackConfig,
    "ssmlm.models.gmlp": GMLPConfig,
    "ssmlm.models.gated_ssm": LMConfig,
    "ssmlm.models.hawk": LMConfig,
    "ssmlm.models.transformer_lm": LMConfig,
}


# model.<field> -> its allowed values, for the fields of every shipped family (ssmlm.checks applies it; a field a
# recipe's family lacks is skipped): each config class's FIELD_RANGES, gathered. None always passes where a field
# allows it.
RANGES: dict[str, Rule] = {k: r for c in (ModelConfig, *CONFIGS.values()) for k, r in c.FIELD_RANGES.items()}
