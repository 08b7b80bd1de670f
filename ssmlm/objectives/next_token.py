"""Predict the next token at every position of a row: the smallest non-MLM objective, here to show that the
loop and the batch do not assume masking. With a bidirectional encoder the answer is visible, so
it is a plumbing check, not a language model (the Birdie language models train on objective.kind lm, whose
next-token configuration is ssmlm.objectives.birdie).

Targets: row[t+1] predicted at position t, for every real token that has a successor (weight 0 elsewhere).
"""

from __future__ import annotations

import numpy as np

from ssmlm.objectives.batch import Batch, make_batch
from ssmlm.objectives.losses import token_prediction_eval, token_prediction_loss, token_prediction_score


class NextToken:
    name = "next_token"

    def __init__(self, cfg, special_ids: dict[str, int], vocab_size: int, seq_len: int, seed: int):
        self.predictions = seq_len - 1

    def train_examples(self, rows):
        return rows

    def train_batch(self, rows: dict, step: int, state=None) -> Batch:
        return self.eval_batch(rows)

    def eval_batch(self, rows: dict) -> Batch:
        tokens = np.asarray(rows["tokens"])
        n, length = tokens.shape
        targets = tokens[:, 1:]
        weights = (tokens[:, :-1] != 0) & (targets != 0)
        positions = np.broadcast_to(np.arange(length - 1, dtype=np.int32), (n, length - 1))
        return make_batch(tokens, targets, weights, target_positions=positions)

    loss = staticmethod(token_prediction_loss)
    eval = staticmethod(token_prediction_eval)
    score = staticmethod(token_prediction_score("lm", "predicted_tokens"))
