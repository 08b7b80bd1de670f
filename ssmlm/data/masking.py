"""Static MLM masking as in BERT / Izsak et al. (the data the BiGS models were trained on).

Per sequence: candidates are all real tokens except [CLS] and [SEP] (and never padding); the number
masked is min(max_predictions, max(1, round(masked_lm_prob · n_tokens))); each chosen token becomes
[MASK] with probability 0.8, stays with 0.1, or becomes a uniformly random vocabulary entry with 0.1.
Token-level, not whole-word. Positions are stored sorted, 0-padded (position 0 is always [CLS], so 0
is an unambiguous "unused" marker).
"""

from __future__ import annotations

import numpy as np


def pack_document(doc: list[list[int]], max_tokens: int, short_seq_prob: float, rng: np.random.Generator):
    """Greedily pack a document's lines (token lists) into chunks of at most ``max_tokens``.

    With probability ``short_seq_prob`` a chunk's target length is drawn uniformly from [2, max_tokens],
    as BERT's data generation does. A line longer than the space left starts a new chunk; a line
    longer than a whole chunk is split rather than thrown away.
    """

    def new_target():
        return int(rng.integers(2, max_tokens + 1)) if rng.random() < short_seq_prob else max_tokens

    chunks, buf, target = [], [], new_target()
    for line in doc:
        while line:
            space = target - len(buf)
            if len(line) <= space:
                buf, line = buf + line, []
            elif buf:
                chunks.append(buf)
                buf, target = [], new_target()
            else:
                chunks.append(line[:space])
                line, target = line[space:], new_target()
        if len(buf) >= target:
            chunks.append(buf)
            buf, target = [], new_target()
    if buf:
        chunks.append(buf)
    return chunks


def mask_batch(
    input_ids: np.ndarray,
    special_ids: set[int] | list[int],
    vocab_size: int,
    mask_id: int,
    masked_lm_prob: float,
    max_predictions: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Mask a (n, L) int array of sequences (padded with a special id). Vectorised over rows."""
    n, length = input_ids.shape
    candidate = ~np.isin(input_ids, list(special_ids))
    n_tokens = (input_ids != 0).sum(1) if 0 in special_ids else np.full(n, length)
    # number of real (non-pad) tokens counts [CLS]/[SEP] too, as BERT's len(tokens) does
    k = np.minimum(max_predictions, np.maximum(1, np.rint(masked_lm_prob * n_tokens).astype(int)))
    k = np.minimum(k, candidate.sum(1))
    scores = np.where(candidate, rng.random((n, length)), np.inf)
    order = np.argsort(scores, axis=1)[:, :max_predictions]
    if order.shape[1] < max_predictions:  # more prediction slots than tokens: pad the slots
        order = np.pad(order, ((0, 0), (0, max_predictions - order.shape[1])))
    chosen = np.arange(max_predictions)[None, :] < k[:, None]
    # unused slots sort to the end as `length`, then become 0
    positions = np.sort(np.where(chosen, order, length), axis=1)
    positions = np.where(positions == length, 0, positions).astype(np.int32)
    used = positions > 0
    rows = np.arange(n)[:, None]
    labels = np.where(used, input_ids[rows, positions], 0).astype(np.int32)

    r = rng.random((n, max_predictions))
    replacement = np.where(
        r < 0.8, mask_id, np.where(r < 0.9, labels, rng.integers(0, vocab_size, (n, max_predictions)))
    )
    masked = input_ids.copy()
    rr, cc = np.nonzero(used)
    masked[rr, positions[rr, cc]] = replacement[rr, cc]
    return {"input_ids": masked.astype(np.int32), "masked_lm_positions": positions, "masked_lm_ids": labels}
