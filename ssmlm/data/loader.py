"""Deterministic batches: batch ``step`` is a pure function of (seed, step), so resuming needs no replay.

Each epoch is a fresh permutation seeded by (seed, epoch); the incomplete last batch of an epoch is
dropped (as the official loaders do). The checkpointed data position is simply the step.

Why not Grain: what Grain offers here (deterministic, resumable, sharded index sampling) is these few
lines once the data is memory-mapped .npy shards of fixed-length rows; owning them keeps the data
position a plain integer in the checkpoint manifest and avoids another checkpoint handler. Reading
ahead is a one-thread prefetch in the training loop.

Pretraining data is ``TokenRows`` (ssmlm.data.shards): the preprocessed shards memory-mapped, read a batch
of rows at a time.
"""

from __future__ import annotations

import numpy as np

from ssmlm.data.shards import TokenDocuments, TokenRows
from ssmlm.errors import DataError

__all__ = ["ArrayTable", "Batches", "TokenDocuments", "TokenRows", "eval_batches"]


class ArrayTable:
    """A dict of equal-length numpy arrays with the two operations the loader needs."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def __getitem__(self, idx):
        return {k: v[idx] for k, v in self.arrays.items()}

    def with_format(self, _):
        return self


class Batches:
    """Training batches from ``TokenRows`` (memory-mapped shards; only a batch is read), a saved
    ``datasets`` split or an ArrayTable."""

    def __init__(self, dataset, batch_size: int, seed: int, shard: tuple[int, int] = (0, 1)):
        """``shard`` = (process index, process count): each process reads only its rows of a batch."""
        self.ds = dataset.with_format("numpy")
        self.shard = shard
        self.n = len(self.ds)
        self.batch_size = batch_size
        self.seed = seed
        if self.n < batch_size:
            raise DataError(f"train.batch_size = {batch_size} exceeds the {self.n} training examples")
        self.steps_per_epoch = self.n // batch_size
        self._perm_epoch, self._perm = -1, None

    def indices(self, step: int) -> np.ndarray:
        epoch, i = divmod(step, self.steps_per_epoch)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
            self._perm_epoch = epoch
        return np.sort(self._perm[i * self.batch_size : (i + 1) * self.batch_size])

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        index, count = self.shard
        rows = np.array_split(self.indices(step), count)[index]
        return {k: np.asarray(v) for k, v in self.ds[rows].items()}


def eval_batches(dataset, batch_size: int, max_batches: int | None = None, pad_row: dict | None = None):
    """The split in order, in batches; the last one is padded with ``pad_row`` copies (weight 0)."""
    ds = dataset.with_format("numpy")
    n = len(ds) if not max_batches else min(len(ds), max_batches * batch_size)
    for start in range(0, n, batch_size):
        rows = {k: np.asarray(v) for k, v in ds[start : min(start + batch_size, n)].items()}
        short = batch_size - len(next(iter(rows.values())))
        if short and pad_row is not None:
            rows = {k: np.concatenate([v, np.repeat(np.asarray(pad_row[k])[None], short, 0)]) for k, v in rows.items()}
        yield rows
