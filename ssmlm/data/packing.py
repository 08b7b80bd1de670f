"""Packing documents into fixed-length rows (what preprocessing writes). Masking those rows for MLM is an
objective's job, done on the fly: ssmlm.objectives.mlm.

Packing (``data.packing``) turns a split's documents, each a list of lines (token lists), into rows of
at most ``max_tokens`` (= L - 2, room for [CLS] and [SEP]). Every mode draws a row's target length as
BERT does: ``max_tokens``, or with probability ``short_seq_prob`` uniformly from [2, max_tokens].
  fill  a document's tokens are cut into rows of exactly their target length; a line that does not
        fit continues at the start of the next row of the same document. Nothing is lost; only a
        document's last row is shorter than its target. (BERT's lines were sentences; ours are often
        paragraphs, so closing rows at line ends leaves much of each row empty.)
  bert  create_pretraining_data --no_nsp: whole lines are accumulated until the target is reached,
        and the overflow beyond ``max_tokens`` is trimmed token by token from a random end. The target
        is drawn once per document, as there. Discards text: with paragraph lines, a lot of it.
  full  RoBERTa's FULL-SENTENCES: like fill, but over the concatenation of all documents with a [SEP]
        between two documents, so only the split's last row is short. A separator that would open or
        close a row is left out, the row's own [CLS]/[SEP] marking the boundary.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

PACKING_MODES = ("fill", "bert", "full")


def _target_block(rng: np.random.Generator, max_tokens: int, short_seq_prob: float, n: int) -> np.ndarray:
    short = rng.random(n) < short_seq_prob
    return np.where(short, rng.integers(2, max_tokens + 1, n), max_tokens)


def _targets(rng: np.random.Generator, max_tokens: int, short_seq_prob: float) -> Iterator[int]:
    # drawn in blocks: one numpy call per row would dominate packing time
    while True:
        yield from _target_block(rng, max_tokens, short_seq_prob, 4096).tolist()


def pack(
    tokens: np.ndarray,
    line_lengths: Sequence[int],
    doc_lines: Sequence[int],
    max_tokens: int,
    short_seq_prob: float,
    rng: np.random.Generator,
    mode: str = "fill",
    sep_id: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pack documents into rows of at most ``max_tokens`` tokens (see the module docstring for ``mode``).

    The documents come flat: ``tokens`` is every line of every document in order, ``line_lengths`` the
    tokens per line and ``doc_lines`` the lines per document. Returns ``(row_tokens, row_lengths)``: the
    rows' tokens back to back, and the tokens per row. ``sep_id`` (mode ``full``) separates documents.
    """
    if mode not in PACKING_MODES:
        raise ValueError(f"packing mode {mode!r}: expected one of {PACKING_MODES}")
    tokens = np.asarray(tokens, np.int32)
    line_lengths = np.asarray(line_lengths, np.int64)
    doc_lines = np.asarray(doc_lines, np.int64)
    if line_lengths.sum() != len(tokens) or doc_lines.sum() != len(line_lengths):
        raise ValueError("pack: tokens, line_lengths and doc_lines disagree")
    line_end = np.cumsum(line_lengths)
    doc_end = np.concatenate([[0], line_end])[np.cumsum(doc_lines)]
    doc_tokens = np.diff(doc_end, prepend=0)
    if mode == "fill":
        return tokens, _fill_lengths(doc_tokens, _targets(rng, max_tokens, short_seq_prob))
    if mode == "bert":
        return _bert_rows(tokens, line_lengths, doc_lines, max_tokens, short_seq_prob, rng)
    if sep_id is None:
        raise ValueError("pack: mode 'full' needs sep_id")
    return _full_rows(tokens, doc_end[doc_tokens > 0], max_tokens, short_seq_prob, rng, sep_id)


def _fill_lengths(doc_tokens: np.ndarray, targets: Iterator[int]) -> np.ndarray:
    lengths = []
    for n in doc_tokens.tolist():
        while n > 0:
            t = next(targets)
            lengths.append(min(t, n))
            n -= t
    return np.array(lengths, np.int64)


def _bert_rows(tokens, line_lengths, doc_lines, max_tokens, short_seq_prob, rng):
    targets = _targets(rng, max_tokens, short_seq_prob)
    starts, lengths = [], []
    pos, lines = 0, iter(line_lengths.tolist())
    for n_lines in doc_lines.tolist():
        target, chunk = next(targets), 0  # one target per document, as create_pretraining_data
        for k in range(n_lines):
            chunk += next(lines)
            if chunk and (chunk >= target or k == n_lines - 1):
                starts.append(pos)
                lengths.append(chunk)
                pos, chunk = pos + chunk, 0
    starts, lengths = np.array(starts, np.int64), np.array(lengths, np.int64)
    # create_pretraining_data's truncate drops one token at a time from the front or the back with a
    # fair coin, so the number dropped from the front is Binomial(overflow, 1/2)
    overflow = np.maximum(lengths - max_tokens, 0)
    starts += rng.binomial(overflow, 0.5)
    lengths -= overflow
    return tokens[_gather_index(starts, lengths)], lengths


def _full_rows(tokens, doc_end, max_tokens, short_seq_prob, rng, sep_id):
    # a [SEP] before every non-empty document but the first
    stream = np.insert(tokens, doc_end[:-1], sep_id)
    is_sep = np.zeros(len(stream), bool)
    is_sep[doc_end[:-1] + np.arange(len(doc_end) - 1)] = True
    blocks, total = [], 0
    while total < len(stream):
        blocks.append(_target_block(rng, max_tokens, short_seq_prob, max(16, 2 * (len(stream) - total) // max_tokens)))
        total += int(blocks[-1].sum())
    ends = np.cumsum(np.concatenate(blocks)) if blocks else np.zeros(0, np.int64)
    ends = ends[: np.searchsorted(ends, len(stream)) + 1]
    if len(ends):
        ends[-1] = len(stream)
    starts = ends - np.diff(ends, prepend=0)
    # separators at a row's edge are redundant with the row's [CLS]/[SEP]
    drop = np.zeros(len(stream), bool)
    drop[starts] = is_sep[starts]
    drop[ends - 1] |= is_sep[ends - 1]
    return stream[~drop], np.diff(np.cumsum(~drop)[ends - 1], prepend=0).astype(np.int64)


def _gather_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices of the slices [start, start + length) back to back."""
    offsets = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) + np.repeat(starts - offsets, lengths)


def rows_to_array(row_tokens: np.ndarray, row_lengths: np.ndarray, seq_len: int, cls_id: int, sep_id: int):
    """Rows (as ``pack`` returns them) as an (n, seq_len) int32 array: [CLS] row [SEP], then 0 padding."""
    n = len(row_lengths)
    if n and row_lengths.max() > seq_len - 2:
        raise ValueError(f"a row of {row_lengths.max()} tokens does not fit in {seq_len} with [CLS]/[SEP]")
    base = np.zeros((n, seq_len), np.int32)
    base[:, 0] = cls_id
    # row-major order of the text cells is the order of row_tokens
    base[:, 1:][np.arange(seq_len - 1) < row_lengths[:, None]] = row_tokens
    base[np.arange(n), row_lengths + 1] = sep_id
    return base


def pack_document(
    doc: list[list[int]], max_tokens: int, short_seq_prob: float, rng: np.random.Generator, mode: str = "fill"
) -> list[list[int]]:
    """One document's lines (token lists) packed as ``pack`` does, as lists of tokens ('full' is 'fill'
    for a single document)."""
    lengths = [len(line) for line in doc]
    flat = np.fromiter((t for line in doc for t in line), np.int32, sum(lengths))
    row_tokens, row_lengths = pack(
        flat, lengths, [len(doc)] if doc else [], max_tokens, short_seq_prob, rng, "fill" if mode == "full" else mode
    )
    return [r.tolist() for r in np.split(row_tokens, np.cumsum(row_lengths)[:-1])] if len(row_lengths) else []
