"""Task heads shared by every encoder (the official BiGS code, docs/faithfulness.md#bigs-heads).

MLM head: transform = Dense(d→d) → exact GELU → LayerNorm, then logits = h · E_wordᵀ + b (tied decoder).
Pooler: the first ([CLS]) token, or the mean over non-padding positions (or over all), then Dense(d→d), tanh;
each family's default is its paper's (its config class's POOLERS).
Classifier: dropout → Dense(d→k); k = 1 is regression.

Every head takes ``intermediates=True`` and then returns ``(output, aux)``: the encoder's named
intermediates (ssmlm.models.layers.Encoder), each with a leading layer axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models.config import ModelConfig, default_pooler
from ssmlm.models.layers import dense, dropout, layer_norm

LECUN = nnx.initializers.lecun_normal()


class MLMHead(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.transform = dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs, init=LECUN)
        self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
        self.bias = nnx.Param(jnp.zeros((cfg.vocab_size,)))

    def __call__(self, h: jax.Array, word_embeddings: jax.Array) -> jax.Array:
        h = self.norm(jax.nn.gelu(self.transform(h), approximate=False))
        return (h @ word_embeddings.T.astype(h.dtype)).astype(jnp.float32) + self.bias[...]


class MaskedLM(nnx.Module):
    """Encoder + tied MLM head. ``positions`` selects where logits are needed (the masked slots)."""

    def __init__(self, encoder: nnx.Module, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.encoder = encoder
        self.mlm_head = MLMHead(cfg, rngs=rngs)

    def __call__(self, input_ids, positions=None, token_type_ids=None, *, rng=None, intermediates=False):
        # [PAD] is id 0 in every ssmlm dataset; attention encoders mask it, SSM/gMLP ones ignore the mask.
        mask = (input_ids != 0).astype(jnp.int32)
        h, aux = _encode(self.encoder, input_ids, token_type_ids, mask, enc_rng=rng, intermediates=intermediates)
        if positions is not None:
            # Only masked slots carry a loss; gathering them first gives the same loss as the official
            # all-position logits at a fraction of the vocabulary matmul.
            h = jnp.take_along_axis(h, positions[..., None], axis=1)
        logits = self.mlm_head(h, self.encoder.word_embeddings())
        return (logits, aux) if intermediates else logits


def _encode(encoder, input_ids, token_type_ids, attention_mask, *, enc_rng, intermediates):
    """(h, aux) with aux None unless ``intermediates``: one call site shape for every head."""
    out = encoder(input_ids, token_type_ids, attention_mask, rng=enc_rng, intermediates=intermediates)
    return out if intermediates else (out, None)


# Each family's pooler as its paper finetunes it is declared by its config class (ModelConfig.POOLERS): BERT and
# gMLP/aMLP read the first ([CLS]) token (Devlin et al.; Liu et al. follow BERT's finetuning); BiGS averages the
# non-padding tokens (official code). The BiGS ablations (stack/ssm, gated/att) were finetuned with BiGS's code,
# so they keep its pooler: Table 1 then differs between rows only in the architecture.
pooler_kind = default_pooler


class Pooler(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.dense = dense(cfg, cfg.hidden_size, cfg.hidden_size, rngs)
        self.kind = pooler_kind(cfg)

    def __call__(self, h: jax.Array, attention_mask: jax.Array) -> jax.Array:
        if self.kind == "cls":
            pooled = h[:, 0]
        elif self.kind == "mean":
            pooled = h.mean(axis=1)
        else:
            m = attention_mask[..., None].astype(h.dtype)
            pooled = (h * m).sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)
        return jnp.tanh(self.dense(pooled))


class SequenceClassifier(nnx.Module):
    """Encoder + pooler + classifier; num_labels = 1 gives a regression score."""

    def __init__(self, encoder: nnx.Module, cfg: ModelConfig, num_labels: int, *, rngs: nnx.Rngs):
        self.encoder = encoder
        self.pooler = Pooler(cfg, rngs=rngs)
        self.classifier = dense(cfg, cfg.hidden_size, num_labels, rngs, init=LECUN)
        self.rate = cfg.dropout

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *, rng=None, intermediates=False):
        enc_rng, head_rng = jax.random.split(rng) if rng is not None else (None, None)
        h, aux = _encode(
            self.encoder, input_ids, token_type_ids, attention_mask, enc_rng=enc_rng, intermediates=intermediates
        )
        pooled = dropout(self.pooler(h, attention_mask), self.rate, head_rng)
        logits = self.classifier(pooled).astype(jnp.float32)
        return (logits, aux) if intermediates else logits


class SpanExtractor(nnx.Module):
    """Extractive QA (SQuAD): a start and an end logit for every position; padding gets -inf."""

    def __init__(self, encoder: nnx.Module, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.encoder = encoder
        self.qa_outputs = dense(cfg, cfg.hidden_size, 2, rngs, init=LECUN)

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *, rng=None, intermediates=False):
        h, aux = _encode(
            self.encoder, input_ids, token_type_ids, attention_mask, enc_rng=rng, intermediates=intermediates
        )
        logits = self.qa_outputs(h).astype(jnp.float32)
        logits = jnp.where(attention_mask[..., None] > 0, logits, -1e9)
        span = (logits[..., 0], logits[..., 1])
        return (span, aux) if intermediates else span


class MultipleChoice(nnx.Module):
    """Each (context, choice) pair is encoded separately, pooled and scored; softmax over choices.

    Inputs are (B, C, L): B questions with C choices each. Returns (B, C) logits; intermediates are those
    of the B·C encoded pairs.
    """

    def __init__(self, encoder: nnx.Module, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.encoder = encoder
        self.pooler = Pooler(cfg, rngs=rngs)
        self.classifier = dense(cfg, cfg.hidden_size, 1, rngs, init=LECUN)
        self.rate = cfg.dropout

    def __call__(self, input_ids, attention_mask, token_type_ids=None, *, rng=None, intermediates=False):
        b, c, n = input_ids.shape
        flat = lambda x: None if x is None else x.reshape(b * c, n)  # noqa: E731
        enc_rng, head_rng = jax.random.split(rng) if rng is not None else (None, None)
        h, aux = _encode(
            self.encoder,
            flat(input_ids),
            flat(token_type_ids),
            flat(attention_mask),
            enc_rng=enc_rng,
            intermediates=intermediates,
        )
        pooled = dropout(self.pooler(h, flat(attention_mask)), self.rate, head_rng)
        logits = self.classifier(pooled).astype(jnp.float32).reshape(b, c)
        return (logits, aux) if intermediates else logits
