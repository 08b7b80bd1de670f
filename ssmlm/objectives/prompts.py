"""Finetuning on prompt/response pairs (phone books, instruction data), packed in the START layout.

A pair becomes one prefix-LM sample (Birdie A.4, docs/faithfulness.md#birdie-layout): prefix = [paradigm token of
the prefix-LM class] + prompt, target = response + [END], so the prompt is read bidirectionally, START predicts
the response's first token and the last target is END (what stops generation). Samples are packed greedily into
rows of ``seq_len`` (``birdie.packing.pack``): several short pairs share a row, each its own segment.

Training order: epoch e visits every pair once, shuffled from (seed, e); the epoch's rows are a pure function of
(seed, e), and the row stream is epoch 0's rows, then epoch 1's, …, so step s is rows [s·B, s·B + B) of that
stream whatever happened before (resuming gives the same batches). Validation pairs are packed once, in order.

Evaluation adds per-sample exact match under teacher forcing: a sample is exact when the argmax at every one of
its target slots is its target, i.e. greedy decoding would generate the response (and END) exactly.
"""

from __future__ import annotations

import bisect

import jax
import jax.numpy as jnp
import numpy as np

from ssmlm.data.reserved import END, PARADIGMS, START, reserved_ids
from ssmlm.errors import DataError, UserError
from ssmlm.objectives.batch import Batch
from ssmlm.objectives.birdie.packing import empty_row, pack
from ssmlm.objectives.lm import LMObjective, lm_logits, to_batch
from ssmlm.objectives.losses import cross_entropy

PARADIGM_CHOICES = ("start", "none")


def encode_pair(tokenizer, prompt: str, response: str, ids: dict[str, int], paradigm: str = "start"):
    """(prefix ids, target ids): prefix = [prefix-LM paradigm token unless paradigm "none"] + prompt ids,
    target = response ids + [END]. ``ids``: {reserved token string: id}, END included."""
    if paradigm not in PARADIGM_CHOICES:
        raise ValueError(f"paradigm {paradigm!r}: expected one of {PARADIGM_CHOICES}")
    lead = [] if paradigm == "none" else [ids[PARADIGMS["prefix_lm"]]]
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    response_ids = tokenizer.encode(response, add_special_tokens=False).ids
    return np.array([*lead, *prompt_ids], np.int32), np.array([*response_ids, ids[END]], np.int32)


def pack_greedy(samples, length: int) -> list[list[int]]:
    """Indices of ``samples`` ([(prefix, target)]) per row: in order, a row is closed when the next sample does
    not fit in what is left of it."""
    rows, row, used = [], [], 0
    for i, (p, t) in enumerate(samples):
        size = len(p) + len(t)
        if row and used + size > length:
            rows.append(row)
            row, used = [], 0
        row.append(i)
        used += size
    if row:
        rows.append(row)
    return rows


def segment_exact(wrong, weights, segment_ids):
    """Per row, per segment: (samples with at least one target slot, those with no wrong target slot), summed.

    ``wrong``/``weights``: (B, L) 1 where the argmax misses the target / where a target is scored;
    ``segment_ids``: (B, L), 0 = padding. A segment sum over each row (B·L work, any number of segments)."""
    n = segment_ids.shape[1] + 1

    def per_row(w, m, s):
        misses = jax.ops.segment_sum(w * m, s, num_segments=n)
        scored = jax.ops.segment_sum(m, s, num_segments=n) > 0
        scored = scored.at[0].set(False)  # padding is no sample
        return scored.sum(), (scored & (misses == 0)).sum()

    samples, exact = jax.vmap(per_row)(wrong.astype(jnp.float32), weights.astype(jnp.float32), segment_ids)
    return samples.sum(), exact.sum()


class PromptResponseObjective:
    """Packed prompt/response finetuning (see the module doc).

    ``pairs_*``: dicts with "prompt" and "response" (``ssmlm.data.phonebook.read_prompt_response``); a pair longer
    than ``seq_len`` is a DataError unless ``truncate`` (then the prompt loses tokens from its left, after the
    paradigm token). ``rows=(lo, hi)``: the rows of every global batch this process builds.
    """

    name = "prompts"

    def __init__(
        self,
        pairs_train,
        pairs_val,
        tokenizer,
        seq_len: int,
        batch_size: int,
        seed: int,
        paradigm: str = "start",
        rows: tuple[int, int] | None = None,
        truncate: bool = False,
    ):
        if paradigm not in PARADIGM_CHOICES:
            raise UserError(
                f"objective.paradigm = {paradigm!r}: prompt/response finetuning takes one of {PARADIGM_CHOICES}"
            )
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.ids = reserved_ids(tokenizer.token_to_id)
        self.start = self.ids[START]
        self.paradigm, self.truncate = paradigm, truncate
        self.train = [self._encode(tokenizer, p, i, "train") for i, p in enumerate(pairs_train)]
        self.val = [self._encode(tokenizer, p, i, "validation") for i, p in enumerate(pairs_val or [])]
        if not self.train:
            raise DataError("prompt/response finetuning: no training pairs")
        self.rows = np.arange(*(rows or (0, batch_size)))
        self._epochs: dict[int, list[list[int]]] = {}  # epoch -> its rows as pair indices (a few kept)
        self._ends: list[int] = []  # cumulative row counts of epochs 0, 1, … (where each ends in the stream)

    def _encode(self, tokenizer, pair: dict, i: int, split: str):
        prefix, target = encode_pair(tokenizer, pair["prompt"], pair["response"], self.ids, self.paradigm)
        size = len(prefix) + len(target)
        if size <= self.seq_len:
            return prefix, target
        lead = 0 if self.paradigm == "none" else 1
        room = self.seq_len - len(target) - lead
        if not self.truncate or room < 1:
            raise DataError(
                f"{split} pair {i}: {size} tokens (prompt {len(prefix)} + response {len(target)}) exceed seq_len "
                f"{self.seq_len}" + ("" if self.truncate else "; pass truncate to cut the prompt's left")
            )
        return np.concatenate([prefix[:lead], prefix[-room:]]), target

    # -- the training stream
    def epoch_rows(self, epoch: int) -> list[list[int]]:
        """Epoch ``epoch``'s rows as indices into the training pairs (a pure function of (seed, epoch))."""
        if epoch not in self._epochs:
            if len(self._epochs) > 2:
                self._epochs.pop(min(self._epochs))
            order = np.random.default_rng([self.seed, 7, epoch]).permutation(len(self.train))
            rows = pack_greedy([self.train[i] for i in order], self.seq_len)
            self._epochs[epoch] = [[int(order[j]) for j in row] for row in rows]
        return self._epochs[epoch]

    @property
    def steps_per_epoch(self) -> int:
        """Whole batches in epoch 0 (at least 1); later epochs pack to about as many rows."""
        return max(1, len(self.epoch_rows(0)) // self.batch_size)

    def stream_row(self, r: int) -> list[int]:
        """Row ``r`` of the stream: epoch 0's rows, then epoch 1's, …"""
        while not self._ends or self._ends[-1] <= r:
            self._ends.append((self._ends[-1] if self._ends else 0) + len(self.epoch_rows(len(self._ends))))
        epoch = bisect.bisect_right(self._ends, r)
        return self.epoch_rows(epoch)[r - (self._ends[epoch - 1] if epoch else 0)]

    def _row(self, pairs, indices) -> dict:
        return pack([pairs[i] for i in indices], self.seq_len, self.start)

    def train_rows(self, step: int) -> dict:
        rows = [self._row(self.train, self.stream_row(step * self.batch_size + int(j))) for j in self.rows]
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    def train_batch(self, step: int, state=None) -> Batch:
        return to_batch(self.train_rows(step))

    def eval_batches(self, n_batches: int | None = None) -> list[Batch]:
        """The validation pairs packed once in order; the last batch padded with empty rows. ``n_batches``: at most
        that many (None: all)."""
        packed = [self._row(self.val, row) for row in pack_greedy(self.val, self.seq_len)]
        out = []
        for b in range(0, len(packed), self.batch_size):
            rows = packed[b : b + self.batch_size]
            rows += [empty_row(self.seq_len) for _ in range(self.batch_size - len(rows))]
            out.append(to_batch({k: np.stack([r[k] for r in rows]) for k in rows[0]}))
        return out if n_batches is None else out[:n_batches]

    # -- loss and evaluation
    loss = staticmethod(LMObjective.loss)

    @staticmethod
    def eval(model, batch: Batch):
        logits = lm_logits(model, batch, None)
        nll, count = cross_entropy(logits, batch.targets, batch.loss_weights)
        hit = logits.argmax(-1) == batch.targets
        samples, exact = segment_exact(~hit, batch.loss_weights, batch.segment_ids)
        correct = (hit * batch.loss_weights).sum()
        return {"nll": nll, "count": count, "correct": correct, "samples": samples, "exact": exact}

    @staticmethod
    def score(outputs, _batches=None) -> dict[str, float]:
        total = lambda k: sum(float(o[k]) for o in outputs)  # noqa: E731
        count, samples = total("count"), total("samples")
        return {
            "loss": total("nll") / max(count, 1.0),
            "token_accuracy": total("correct") / max(count, 1.0),
            "exact_match": total("exact") / max(samples, 1.0),
            "samples": samples,
            "target_tokens": count,  # loss * target_tokens / samples: the nats of a whole response
        }
