"""Losses and evaluation outputs shared by the objectives."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Summed token cross-entropy and summed weights (the caller divides)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    nll = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    return (nll * weights).sum(), weights.sum()


def token_prediction_loss(model, batch, rng):
    """Mean cross-entropy of ``batch.targets`` predicted at ``batch.target_positions`` (MLM, next token)."""
    logits = model(batch.tokens, positions=batch.target_positions, token_type_ids=batch.token_types, rng=rng)
    nll, count = cross_entropy(logits, batch.targets, batch.loss_weights)
    return nll / jnp.maximum(count, 1.0), {"weight": jnp.maximum(count, 1.0)}


def token_prediction_eval(model, batch):
    logits = model(batch.tokens, positions=batch.target_positions, token_type_ids=batch.token_types)
    nll, count = cross_entropy(logits, batch.targets, batch.loss_weights)
    correct = ((logits.argmax(-1) == batch.targets) * batch.loss_weights).sum()
    return {"nll": nll, "count": count, "correct": correct}


def token_prediction_score(prefix: str, count_name: str):
    """(outputs, batches) -> {PREFIX_loss, PREFIX_accuracy, perplexity, COUNT_NAME} over a whole split."""

    def score(outputs, _batches) -> dict[str, float]:
        nll = sum(float(o["nll"]) for o in outputs)
        count = sum(float(o["count"]) for o in outputs)
        loss = nll / max(count, 1.0)
        return {
            f"{prefix}_loss": loss,
            f"{prefix}_accuracy": sum(float(o["correct"]) for o in outputs) / max(count, 1.0),
            "perplexity": float(np.exp(min(loss, 50))),
            count_name: count,
        }

    return score
