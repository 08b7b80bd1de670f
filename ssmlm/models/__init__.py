"""The model zoo: encoders by architecture name, and builders that put a task head on them."""

from __future__ import annotations

import dataclasses

from flax import nnx

from ssmlm.models.bigs import BiGSEncoder
from ssmlm.models.heads import MaskedLM, SequenceClassifier
from ssmlm.recipe import ModelConfig

ENCODERS = {"bigs": BiGSEncoder}


def with_vocab(cfg: ModelConfig, vocab_size: int) -> ModelConfig:
    return cfg if cfg.vocab_size == vocab_size else dataclasses.replace(cfg, vocab_size=vocab_size)


def build_mlm(cfg: ModelConfig, seed: int = 0) -> MaskedLM:
    rngs = nnx.Rngs(params=seed)
    return MaskedLM(ENCODERS[cfg.arch](cfg, rngs=rngs), cfg, rngs=rngs)


def build_classifier(cfg: ModelConfig, num_labels: int, seed: int = 0) -> SequenceClassifier:
    rngs = nnx.Rngs(params=seed)
    return SequenceClassifier(ENCODERS[cfg.arch](cfg, rngs=rngs), cfg, num_labels, rngs=rngs)


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in __import__("jax").tree.leaves(nnx.state(model, nnx.Param)))
