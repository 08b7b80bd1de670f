"""Language-model pre-training on packed Birdie objective rows (birdie_official.md §1, §3).

``LMObjective`` builds every row on the fly from a document split (``ssmlm.data.shards.TokenDocuments`` or
anything with ``len`` and ``docs[i] -> int array``) with ``birdie.pipeline.make_row``. Row r of step s is a
pure function of (seed, s, r) (``mlm.row_keys``) and of the mixture's probabilities, so a resumed run sees
the same batches; validation row i is a function of (seed, VALIDATION, i), drawn from the mixture's initial
probabilities (a fixed set whatever a controller does).

Batch: tokens, segment_ids, positions, token_types (1 prefix, 3 START + target, 0 padding) and
targets (B, L) = the next label at each slot with loss_weights 1 on the target part; target_positions None.
The model is called as ``model(tokens, segment_ids=, token_types=, positions=, rng=)`` -> logits (B, L, V).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ssmlm.objectives.batch import Batch, make_batch
from ssmlm.objectives.birdie.functions import Ids
from ssmlm.objectives.birdie.mixtures import mixture as named_mixture
from ssmlm.objectives.birdie.pipeline import make_batch_rows
from ssmlm.objectives.losses import cross_entropy, token_prediction_score
from ssmlm.objectives.mlm import row_keys

_TRAIN, _VALIDATION = 4, 5  # key domains (mlm.py uses 1-3)


class LMObjective:
    """Packed-row LM objective over a named mixture (``birdie.mixtures.MIXTURES``).

    ``LMObjective(cfg, reserved, docs_train, docs_val, seq_len, seed, mixture=None, paradigm=None,
    spacing=None, batch_size=None, min_space=None)``: ``reserved`` is the {token string: id} dict of
    ``ssmlm.data.reserved.reserved_ids``; each of mixture ("birdie"), paradigm ("start"), spacing (0),
    batch_size (8) and min_space (32) falls back to the same-named attribute of ``cfg`` (may be None), then
    to the default in brackets.
    """

    name = "lm"

    def __init__(self, cfg, reserved: dict[str, int], docs_train, docs_val, seq_len: int, seed: int,
                 mixture: str | None = None, paradigm: str | None = None, spacing: int | None = None,
                 batch_size: int | None = None, min_space: int | None = None,
                 rows: tuple[int, int] | None = None):  # fmt: skip
        def pick(value, field, default):
            return value if value is not None else getattr(cfg, field, None) or default

        self.cfg, self.seed, self.seq_len = cfg, seed, seq_len
        self.ids = Ids.from_reserved(reserved)
        self.docs_train, self.docs_val = docs_train, docs_val
        self.mixture = pick(mixture, "mixture", "birdie")
        self.paradigm = pick(paradigm, "paradigm", "start")
        self.spacing = int(pick(spacing, "spacing", 0))
        self.batch_size = int(pick(batch_size, "batch_size", 8))
        self.min_space = int(pick(min_space, "min_space", 32))
        self.configs, self.probs = named_mixture(self.mixture)
        # which rows of every global batch this process builds (multi-host: each process its own share)
        self.rows = np.arange(*(rows or (0, self.batch_size)))

    # -- rows and batches
    def _rows(self, docs, keys, probs) -> dict:
        return make_batch_rows(docs, self.configs, probs, self.seq_len, keys, self.ids, self.paradigm,
                               self.spacing, self.min_space)  # fmt: skip

    def train_rows(self, step: int, state=None) -> dict:
        """The step's rows as ``make_batch_rows`` arrays (with ``config``/``sample_configs``). ``state``: an
        optional probability vector over ``self.configs`` replacing the mixture's."""
        probs = self.probs if state is None else np.asarray(state, float)
        if probs.shape != self.probs.shape:
            raise ValueError(f"state: {probs.shape} probabilities for {len(self.configs)} configurations")
        keys = row_keys(self.seed, _TRAIN, step, self.rows)
        return self._rows(self.docs_train, keys, probs)

    def train_batch(self, step: int, state=None) -> Batch:
        return to_batch(self.train_rows(step, state))

    def eval_rows(self, i: int) -> dict:
        keys = row_keys(self.seed, _VALIDATION, i * self.batch_size + np.arange(self.batch_size))
        return self._rows(self.docs_val, keys, self.probs)

    def eval_batches(self, n_batches: int) -> list[Batch]:
        """The fixed validation set: batches 0..n_batches-1."""
        return [to_batch(self.eval_rows(i)) for i in range(n_batches)]

    # -- loss and evaluation
    @staticmethod
    def loss(model, batch: Batch, rng):
        logits = _logits(model, batch, rng)
        nll, count = cross_entropy(logits, batch.targets, batch.loss_weights)
        count = jnp.maximum(count, 1.0)
        return nll / count, {"weight": count}

    @staticmethod
    def eval(model, batch: Batch):
        logits = _logits(model, batch, None)
        nll, count = cross_entropy(logits, batch.targets, batch.loss_weights)
        correct = ((logits.argmax(-1) == batch.targets) * batch.loss_weights).sum()
        return {"nll": nll, "count": count, "correct": correct}

    score = staticmethod(token_prediction_score("lm", "target_tokens"))


def _logits(model, batch: Batch, rng):
    return model(batch.tokens, segment_ids=batch.segment_ids, token_types=batch.token_types,
                 positions=batch.positions, rng=rng)  # fmt: skip


def to_batch(rows: dict) -> Batch:
    return make_batch(rows["tokens"], rows["targets"], rows["loss_weights"], segment_ids=rows["segment_ids"],
                      positions=rows["positions"], token_types=rows["token_types"])  # fmt: skip
