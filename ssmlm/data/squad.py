"""SQuAD v1.1 / v2.0: reading, windowed features for span extraction, and decoding logits to answers.

Examples are flat dicts {id, title, question, context, answers: {text: [...], answer_start: [...]}}
(the hub `rajpurkar/squad` / `rajpurkar/squad_v2` rows); v2.0 unanswerable questions have no answers.

A feature is one window of the context: [CLS] question [SEP] context[window] [SEP], padded with 0.
Windows start every ``doc_stride`` context tokens (BERT's run_squad.py convention; the HF scripts'
``stride`` is the overlap instead) until the end of the context is covered.
"""

from __future__ import annotations

import json
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ssmlm.errors import DataError

# What the span model and its loss read; offsets / example_index stay on the host for decoding.
MODEL_KEYS = (
    "input_ids",
    "token_type_ids",
    "attention_mask",
    "start_positions",
    "end_positions",
    "example_weight",
)


def read_squad_json(path: str | Path) -> list[dict]:
    """The official train-v1.1.json / dev-v2.0.json layout (data → paragraphs → qas), flattened."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"SQuAD file '{path}': no such file")
    try:
        articles = json.loads(p.read_text(encoding="utf-8"))["data"]
    except (ValueError, KeyError, TypeError) as e:
        raise DataError(f"{p}: not a SQuAD JSON file ({type(e).__name__}: {e})") from None
    rows = []
    for article in articles:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                # v2.0 unanswerable questions keep only `plausible_answers`, which are not golds.
                answers = [] if qa.get("is_impossible") else qa["answers"]
                rows.append(
                    {
                        "id": qa["id"],
                        "title": article.get("title", ""),
                        "question": qa["question"],
                        "context": para["context"],
                        "answers": {
                            "text": [a["text"] for a in answers],
                            "answer_start": [a["answer_start"] for a in answers],
                        },
                    }
                )
    return rows


def squad_from_hub(version_2: bool, split: str) -> list[dict]:
    """rajpurkar/squad(_v2) from the hub (or its local cache); a one-line DataError when unavailable."""
    from ssmlm.data.hub import offline_reason
    from ssmlm.data.sources import quiet_datasets

    name = "rajpurkar/squad_v2" if version_2 else "rajpurkar/squad"
    offline = offline_reason()  # offline, datasets only looks in its cache: no retries
    with quiet_datasets() as datasets:
        try:
            return datasets.load_dataset(name, split=split).to_list()
        except Exception as e:
            why = offline or str(e).splitlines()[0][:120]
            raise DataError(
                f"could not load {name} ({split}) from the hub ({why}); pass the official JSON file instead"
            ) from None


@contextmanager
def untruncated(tokenizer):
    """Encode without the tokenizer's own truncation/padding (we window by hand), then restore them."""
    trunc, pad = tokenizer.truncation, tokenizer.padding
    tokenizer.no_truncation()
    tokenizer.no_padding()
    try:
        yield tokenizer
    finally:
        if trunc:
            tokenizer.enable_truncation(**trunc)
        if pad:
            tokenizer.enable_padding(**pad)


def _windows(n: int, room: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of context windows covering n tokens, each at most ``room`` long."""
    out, start = [], 0
    while True:
        length = min(room, n - start)
        out.append((start, length))
        if start + length >= n:
            return out
        start += min(length, stride)


def _max_context(windows: list[tuple[int, int]], n: int) -> np.ndarray:
    """Index of each context token's max-context window (BERT's rule for overlapping windows).

    A token's score in a window holding it is min(tokens left of it, tokens right of it in the window)
    + 0.01 × window length: the window where it sits most centrally, the length term favouring longer
    windows (e.g. over the shorter last one). Exact ties go to the earlier window. A span may only start
    at a token in its max-context window, so each answer is judged where the model saw the most text
    around it.
    """
    score = np.full((len(windows), n), -np.inf)
    for w, (start, length) in enumerate(windows):
        j = np.arange(start, start + length)
        score[w, j] = np.minimum(j - start, start + length - 1 - j) + 0.01 * length
    return score.argmax(0)  # the first maximum: the earlier window on an exact tie


def _answer_tokens(offsets: list[tuple[int, int]], example: dict) -> tuple[int, int] | None:
    """Context-token span covering the first gold answer's characters; None when there is no answer."""
    texts, starts = example["answers"]["text"], example["answers"]["answer_start"]
    if not texts:
        return None
    c0, c1 = starts[0], starts[0] + len(texts[0])
    first = [j for j, (s, e) in enumerate(offsets) if e > c0]
    last = [j for j, (s, e) in enumerate(offsets) if s < c1]
    if not first or not last or first[0] > last[-1]:
        return None  # the answer lies outside the tokenised text (e.g. only whitespace)
    return first[0], last[-1]


def build_squad_features(
    examples: list[dict], tokenizer, max_len: int = 384, doc_stride: int = 128, max_query_len: int = 64
) -> dict[str, np.ndarray]:
    """Windowed features for every example.

    Arrays: input_ids / token_type_ids / attention_mask (F, L); start_positions / end_positions (F,)
    (0 = [CLS] when the answer is not inside the window or there is none); offsets (F, L, 2) character
    spans in the context, -1 outside it; token_is_max_context (F, L) bool, True where the feature is
    that context token's max-context window (see `_max_context`; every context token is True in exactly
    one feature, decoding only starts spans there); example_index (F,) into ``examples``; example_weight
    (F,). Only the `MODEL_KEYS` arrays are model inputs; the rest stay on the host for decoding.
    """
    if not examples:
        raise DataError("SQuAD: no examples to build features from")
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    with untruncated(tokenizer):
        encs = tokenizer.encode_batch([(ex["question"], ex["context"]) for ex in examples])
    cols = defaultdict(list)
    for i, (ex, enc) in enumerate(zip(examples, encs, strict=True)):
        seq = enc.sequence_ids
        q_ids = [t for t, s in zip(enc.ids, seq, strict=True) if s == 0][:max_query_len]
        ctx = [k for k, s in enumerate(seq) if s == 1]
        c_ids, c_off = [enc.ids[k] for k in ctx], [enc.offsets[k] for k in ctx]
        room = max_len - len(q_ids) - 3
        if room <= 0:
            raise DataError(
                f"SQuAD: max_len {max_len} leaves no room for the context after a {len(q_ids)}-token question"
            )
        answer = _answer_tokens(c_off, ex)
        base = len(q_ids) + 2  # position of the first context token in a feature
        windows = _windows(len(c_ids), room, doc_stride)
        owner = _max_context(windows, len(c_ids))
        for w, (start, length) in enumerate(windows):
            ids = [cls, *q_ids, sep, *c_ids[start : start + length], sep]
            pad = max_len - len(ids)
            cols["input_ids"].append(ids + [0] * pad)
            cols["token_type_ids"].append([0] * base + [1] * (length + 1) + [0] * pad)
            cols["attention_mask"].append([1] * len(ids) + [0] * pad)
            off = np.full((max_len, 2), -1, dtype=np.int32)
            if length:
                off[base : base + length] = c_off[start : start + length]
            cols["offsets"].append(off)
            is_max = np.zeros(max_len, dtype=bool)
            is_max[base : base + length] = owner[start : start + length] == w
            cols["token_is_max_context"].append(is_max)
            inside = answer is not None and start <= answer[0] and answer[1] < start + length
            cols["start_positions"].append(base + answer[0] - start if inside else 0)
            cols["end_positions"].append(base + answer[1] - start if inside else 0)
            cols["example_index"].append(i)
    out = {k: np.asarray(v, dtype=bool if k == "token_is_max_context" else np.int32) for k, v in cols.items()}
    out["example_weight"] = np.ones(len(out["input_ids"]), dtype=np.float32)
    return out


def decode_spans(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    features: dict[str, np.ndarray],
    examples: list[dict],
    n_best: int = 20,
    max_answer_len: int = 30,
    version_2: bool = False,
    null_threshold: float = 0.0,
) -> dict[str, str]:
    """Answer text per example id: the best-scoring context span (start + end logit) over its windows.

    Only the ``n_best`` highest start and end positions of each window are paired (end >= start, at
    most ``max_answer_len`` tokens). A span starts only at a token whose max-context window this is
    (``token_is_max_context``; any context token when the features lack it), so a token at the edge of
    one window is judged in the overlapping window that sees more text around it. SQuAD 2.0: predict ""
    when the lowest null score over the windows (start[0] + end[0], the [CLS] position) exceeds the best
    span score by more than ``null_threshold``.
    Logit rows beyond the number of features (batch padding) are ignored.
    """
    n_feat = len(features["example_index"])
    if len(start_logits) < n_feat or len(end_logits) < n_feat:
        raise ValueError(f"{len(start_logits)} rows of logits for {n_feat} features: evaluate every feature")
    start_logits, end_logits = np.asarray(start_logits)[:n_feat], np.asarray(end_logits)[:n_feat]
    by_example = defaultdict(list)
    for f, i in enumerate(features["example_index"]):
        by_example[int(i)].append(f)
    max_context = features.get("token_is_max_context")
    preds = {}
    for i, ex in enumerate(examples):
        best_score, best_text, null = -np.inf, "", np.inf
        for f in by_example.get(i, []):
            s, e, off = start_logits[f], end_logits[f], features["offsets"][f]
            null = min(null, float(s[0] + e[0]))
            in_context = off[:, 0] >= 0
            valid = np.flatnonzero(in_context)
            starts = np.flatnonzero(in_context & max_context[f]) if max_context is not None else valid
            if starts.size == 0:
                continue
            top_s = starts[np.argsort(-s[starts], kind="stable")[:n_best]]
            top_e = valid[np.argsort(-e[valid], kind="stable")[:n_best]]
            scores = s[top_s][:, None] + e[top_e][None, :]
            width = top_e[None, :] - top_s[:, None]
            scores = np.where((width >= 0) & (width < max_answer_len), scores, -np.inf)
            a, b = np.unravel_index(np.argmax(scores), scores.shape)
            if scores[a, b] > best_score:
                best_score = float(scores[a, b])
                best_text = ex["context"][off[top_s[a], 0] : off[top_e[b], 1]]
        if version_2 and (best_score == -np.inf or null - best_score > null_threshold):
            best_text = ""
        preds[ex["id"]] = best_text
    return preds
