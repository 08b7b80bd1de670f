"""The model zoo: encoders by architecture name, and builders that put a task head on them."""

from __future__ import annotations

import dataclasses
import importlib

from flax import nnx

from ssmlm.models.heads import MaskedLM, MultipleChoice, SequenceClassifier, SpanExtractor
from ssmlm.models.rules import ParamRule, user_rules
from ssmlm.recipe import ModelConfig, TrainConfig

# arch name -> "module:Class" (imported on use, so one family's module never loads another's)
ENCODERS = {
    "bigs": "ssmlm.models.bigs:BiGSEncoder",
    "stack_ssm": "ssmlm.models.stack:StackSSMEncoder",
    "gated_att": "ssmlm.models.bigs:GatedAttentionEncoder",
    "bert": "ssmlm.models.stack:BertEncoder",
    "gmlp": "ssmlm.models.gmlp:GMLPEncoder",
    "amlp": "ssmlm.models.gmlp:GMLPEncoder",
}


def encoder_class(arch: str):
    module, name = ENCODERS[arch].split(":")
    return getattr(importlib.import_module(module), name)


def param_rules(cfg: ModelConfig, train: TrainConfig) -> list[ParamRule]:
    """The optimizer's parameter rules for this model: the recipe's train.param_rules, then the family's own
    (each family module's ``param_rules``, ending with a catch-all). First match wins; see ssmlm.models.rules."""
    family = importlib.import_module(ENCODERS[cfg.arch].split(":")[0])
    return user_rules(train) + family.param_rules(cfg, train)


def with_vocab(cfg: ModelConfig, vocab_size: int) -> ModelConfig:
    return cfg if cfg.vocab_size == vocab_size else dataclasses.replace(cfg, vocab_size=vocab_size)


def build_mlm(cfg: ModelConfig, seed: int = 0) -> MaskedLM:
    rngs = nnx.Rngs(params=seed)
    return MaskedLM(encoder_class(cfg.arch)(cfg, rngs=rngs), cfg, rngs=rngs)


def build_classifier(cfg: ModelConfig, num_labels: int, seed: int = 0) -> SequenceClassifier:
    rngs = nnx.Rngs(params=seed)
    return SequenceClassifier(encoder_class(cfg.arch)(cfg, rngs=rngs), cfg, num_labels, rngs=rngs)


def build_span(cfg: ModelConfig, seed: int = 0) -> SpanExtractor:
    rngs = nnx.Rngs(params=seed)
    return SpanExtractor(encoder_class(cfg.arch)(cfg, rngs=rngs), cfg, rngs=rngs)


def build_multiple_choice(cfg: ModelConfig, seed: int = 0) -> MultipleChoice:
    rngs = nnx.Rngs(params=seed)
    return MultipleChoice(encoder_class(cfg.arch)(cfg, rngs=rngs), cfg, rngs=rngs)


def count_params(model: nnx.Module) -> int:
    """Parameters of a model (works on an abstract one from nnx.eval_shape: nothing is allocated)."""
    import jax

    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
