"""Masked language modelling (BERT; the BiGS and gMLP papers' pretraining objective), applied to token rows
on the fly.

Per row: candidates are all real tokens except the special ones ([CLS], [SEP], never padding); the number
masked is min(max_predictions, max(1, round(masked_lm_prob · n_tokens))) with n_tokens counting [CLS]/[SEP]
as BERT's len(tokens) does; each chosen token becomes [MASK] with probability 0.8, stays with 0.1, or
becomes a uniformly random non-special vocabulary entry with 0.1 (a random [PAD] would read as padding).
Token-level, not whole-word. Targets are the original ids at the chosen positions, sorted; unused slots
have weight 0.

Masking (``objective.masking``):
  static   every row has ``duplicate_factor`` fixed masked copies (Izsak et al.'s offline masking, the data
           the official BiGS models were trained on): the training set is rows × copies, and copy c of row r
           is masked by a function of (seed, r, c) alone, whatever the step that draws it.
  dynamic  a fresh mask each time a row is drawn (RoBERTa): a function of (seed, step, r).
Validation rows are masked once, by (seed, r), so every evaluation scores the same masks.

The randomness is counter-based (a hash of the key and the column), so a row's mask needs nothing but its
key: no generator state to checkpoint, and any batch can be rebuilt from (seed, step) alone.
"""

from __future__ import annotations

import numpy as np

from ssmlm.objectives.batch import Batch, make_batch
from ssmlm.objectives.losses import token_prediction_eval, token_prediction_loss, token_prediction_score

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective scramble of uint64 (wrapping arithmetic is intended)."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def row_keys(*parts) -> np.ndarray:
    """One uint64 key per row from integers/arrays (e.g. seed, a domain tag, row ids, copy or step)."""
    key = np.uint64(0)
    with np.errstate(over="ignore"):
        for p in parts:
            key = _mix(key * _GOLDEN + np.asarray(p).astype(np.uint64))
    return np.atleast_1d(key)


class RowRandom:
    """numpy-Generator-like draws (``random``, ``integers``) where row i's numbers depend only on keys[i]
    and on how many draws came before: a batch's rows are reproducible one by one."""

    def __init__(self, keys: np.ndarray):
        self.keys = np.asarray(keys, np.uint64)
        self.stream = 0

    def _bits(self, shape) -> np.ndarray:
        n, w = shape
        assert n == len(self.keys), (n, len(self.keys))
        self.stream += 1
        col = np.arange(w, dtype=np.uint64)[None, :] + np.uint64(self.stream << 32)
        with np.errstate(over="ignore"):
            return _mix(_mix(self.keys[:, None] ^ (col * _GOLDEN)) + self.keys[:, None])

    def random(self, shape) -> np.ndarray:
        return (self._bits(shape) >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def integers(self, low: int, high: int, shape) -> np.ndarray:
        return low + np.floor(self.random(shape) * (high - low)).astype(np.int64)


def mask_batch(
    input_ids: np.ndarray,
    special_ids: set[int] | list[int],
    vocab_size: int,
    mask_id: int,
    masked_lm_prob: float,
    max_predictions: int,
    rng,
    random_ids: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Mask a (n, L) int array of rows (padded with id 0), vectorised over rows. ``rng``: a numpy Generator
    or a RowRandom. Random replacements are drawn from ``random_ids`` (default: the whole vocabulary)."""
    n, length = input_ids.shape
    candidate = ~np.isin(input_ids, list(special_ids))
    n_tokens = (input_ids != 0).sum(1) if 0 in special_ids else np.full(n, length)
    k = np.minimum(max_predictions, np.maximum(1, np.rint(masked_lm_prob * n_tokens).astype(int)))
    k = np.minimum(k, candidate.sum(1))
    scores = np.where(candidate, rng.random((n, length)), np.inf)
    order = np.argsort(scores, axis=1, kind="stable")[:, :max_predictions]
    if order.shape[1] < max_predictions:  # more prediction slots than tokens: pad the slots
        order = np.pad(order, ((0, 0), (0, max_predictions - order.shape[1])))
    chosen = np.arange(max_predictions)[None, :] < k[:, None]
    # unused slots sort to the end as `length`, then become 0 (position 0 is [CLS], never a target)
    positions = np.sort(np.where(chosen, order, length), axis=1)
    positions = np.where(positions == length, 0, positions).astype(np.int32)
    used = positions > 0
    rows = np.arange(n)[:, None]
    labels = np.where(used, input_ids[rows, positions], 0).astype(np.int32)

    r = rng.random((n, max_predictions))
    if random_ids is None:
        random_token = rng.integers(0, vocab_size, (n, max_predictions))
    else:
        random_token = np.asarray(random_ids)[rng.integers(0, len(random_ids), (n, max_predictions))]
    replacement = np.where(r < 0.8, mask_id, np.where(r < 0.9, labels, random_token))
    masked = input_ids.copy()
    rr, cc = np.nonzero(used)
    masked[rr, positions[rr, cc]] = replacement[rr, cc]
    return {"input_ids": masked.astype(np.int32), "masked_lm_positions": positions, "masked_lm_ids": labels}


def max_predictions(masked_lm_prob: float, limit: int | None, seq_len: int) -> int:
    """Prediction slots per row: ``limit`` if given, else round(masked_lm_prob · seq_len)."""
    return limit if limit is not None else max(1, round(masked_lm_prob * seq_len))


class Repeated:
    """A row table seen as ``copies`` × its rows (static masking's duplicates): example e is row e mod n,
    copy e div n, as offline masking wrote them (all rows' first copies, then the second, …)."""

    def __init__(self, table, copies: int):
        self.table, self.copies, self.n = table, copies, len(table)

    def __len__(self) -> int:
        return self.n * self.copies

    def with_format(self, _):
        return self

    def __getitem__(self, idx):
        idx = np.asarray(idx)
        out = dict(self.table[idx % self.n])
        out["copy"] = idx // self.n
        return out


# key domains, so a static copy, a dynamic step and a validation row never share a mask by accident
_STATIC, _DYNAMIC, _VALIDATION = 1, 2, 3


class MLM:
    """The MLM objective over token rows ``{"tokens": (B, L), "row": (B,)}`` of a preprocessed dataset."""

    name = "mlm"

    def __init__(self, cfg, special_ids: dict[str, int], vocab_size: int, seq_len: int, seed: int):
        self.cfg = cfg
        self.seed = seed
        self.ids = special_ids
        self.vocab_size = vocab_size
        self.predictions = max_predictions(cfg.masked_lm_prob, cfg.max_predictions, seq_len)
        self.specials = {0, *special_ids.values()}
        # no special token as a random replacement (fairseq's RoBERTa does the same)
        self.random_ids = np.setdiff1d(np.arange(vocab_size), sorted(self.specials))

    # -- examples
    def train_examples(self, rows):
        return Repeated(rows, self.cfg.duplicate_factor) if self.cfg.masking == "static" else rows

    def train_batch(self, rows: dict, step: int, state=None) -> Batch:
        if self.cfg.masking == "static":
            keys = row_keys(self.seed, _STATIC, rows["row"], rows["copy"])
        else:
            keys = row_keys(self.seed, _DYNAMIC, step, rows["row"])
        return self._masked(rows["tokens"], keys)

    def eval_batch(self, rows: dict) -> Batch:
        return self._masked(rows["tokens"], row_keys(self.seed, _VALIDATION, rows["row"]))

    def _masked(self, tokens: np.ndarray, keys: np.ndarray) -> Batch:
        m = mask_batch(
            tokens,
            self.specials,
            self.vocab_size,
            self.ids["mask"],
            self.cfg.masked_lm_prob,
            self.predictions,
            RowRandom(keys),
            self.random_ids,
        )
        positions = m["masked_lm_positions"]
        return make_batch(
            m["input_ids"], m["masked_lm_ids"], positions > 0, target_positions=positions, segment_ids=(tokens != 0)
        )

    # -- loss and evaluation
    loss = staticmethod(token_prediction_loss)
    eval = staticmethod(token_prediction_eval)
    score = staticmethod(token_prediction_score("mlm", "masked_tokens"))
