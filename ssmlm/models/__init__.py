"""The model zoo: encoder families by architecture name (`model.arch`), and builders that put a head on them.

What lives here: model configs (config.py), the families (bigs, stack, gmlp), shared layers, heads, S4D,
parameter/FLOP counts, and reading released weights (convert.py). It may import ssmlm.errors and ssmlm.schema
and nothing else of ssmlm: no recipe, data, objectives, train or analyze code (not even the training config:
families declare parameter groups, ssmlm.train.optim gives them the recipe's settings).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ssmlm.models.config import ModelConfig, family, is_lm
from ssmlm.models.rules import ParamRule

if TYPE_CHECKING:  # the builders import flax when called, so importing ssmlm.models stays instant
    from flax import nnx

    from ssmlm.models.heads import MaskedLM, MultipleChoice, SequenceClassifier, SpanExtractor


def model_class(arch: str):
    """The model class of an arch (an encoder, or a language model for an LM arch): its family's ``MODELS``."""
    return family(arch).MODELS[arch]


def extend_hook(arch: str):
    """The family's ``extend_params`` (length-dependent parameters other than the position table), if any."""
    return getattr(family(arch), "extend_params", None)


def family_rules(cfg: ModelConfig) -> list[ParamRule]:
    """The family's own parameter rules for this model (its module's ``param_rules``, ending with a catch-all;
    some name a parameter group). The training package puts the recipe's rules before them and gives the groups
    their settings (ssmlm.train.optim.param_rules). First match wins; see ssmlm.models.rules."""
    return family(cfg.arch).param_rules(cfg)


def build_pretraining_model(cfg: ModelConfig, seed: int = 0):
    """What pretraining trains: an encoder with its MLM head, or a language model."""
    return build_lm(cfg, seed) if is_lm(cfg.arch) else build_mlm(cfg, seed)


def with_vocab(cfg: ModelConfig, vocab_size: int) -> ModelConfig:
    return cfg if cfg.vocab_size == vocab_size else dataclasses.replace(cfg, vocab_size=vocab_size)


def build_mlm(cfg: ModelConfig, seed: int = 0) -> MaskedLM:
    from flax import nnx

    from ssmlm.models.heads import MaskedLM

    rngs = nnx.Rngs(params=seed)
    return MaskedLM(model_class(cfg.arch)(cfg, rngs=rngs), cfg, rngs=rngs)


def build_classifier(cfg: ModelConfig, num_labels: int, seed: int = 0) -> SequenceClassifier:
    from flax import nnx

    from ssmlm.models.heads import SequenceClassifier

    rngs = nnx.Rngs(params=seed)
    return SequenceClassifier(model_class(cfg.arch)(cfg, rngs=rngs), cfg, num_labels, rngs=rngs)


def build_span(cfg: ModelConfig, seed: int = 0) -> SpanExtractor:
    from flax import nnx

    from ssmlm.models.heads import SpanExtractor

    rngs = nnx.Rngs(params=seed)
    return SpanExtractor(model_class(cfg.arch)(cfg, rngs=rngs), cfg, rngs=rngs)


def build_multiple_choice(cfg: ModelConfig, seed: int = 0) -> MultipleChoice:
    from flax import nnx

    from ssmlm.models.heads import MultipleChoice

    rngs = nnx.Rngs(params=seed)
    return MultipleChoice(model_class(cfg.arch)(cfg, rngs=rngs), cfg, rngs=rngs)


def build_lm(cfg: ModelConfig, seed: int = 0) -> nnx.Module:
    """A language model of an LM arch (its family's model class, e.g. ssmlm.models.lm.LanguageModel)."""
    from flax import nnx

    return model_class(cfg.arch)(cfg, rngs=nnx.Rngs(params=seed))


def count_params(model: nnx.Module) -> int:
    """Parameters of a model (works on an abstract one from nnx.eval_shape: nothing is allocated)."""
    import jax
    from flax import nnx

    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
