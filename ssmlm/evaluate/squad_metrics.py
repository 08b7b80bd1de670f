"""SQuAD v1.1 / v2.0 scores as the official evaluation scripts define them (percentages).

Answers are compared after normalisation (lowercase, no punctuation, no articles a/an/the, single
spaces); EM and token-overlap F1 take the best over the gold answers. In v2.0 an unanswerable
question has no gold answer and only the empty prediction scores on it.
"""

from __future__ import annotations

import re
import string
from collections import Counter

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, version_2: bool = True) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version_2 and (not pred or not ref):
        return float(pred == ref)  # v2.0: an empty answer matches only an empty answer
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def _golds(example: dict, version_2: bool) -> list[str]:
    answers = example["answers"]
    texts = answers["text"] if isinstance(answers, dict) else [a["text"] for a in answers]
    if version_2:
        # The v2.0 script drops golds that normalise to nothing; none left means "no answer".
        texts = [t for t in texts if normalize_answer(t)] or [""]
    return list(texts)


def _has_answer(example: dict) -> bool:
    answers = example["answers"]
    return bool(answers["text"] if isinstance(answers, dict) else answers)


def squad_scores(predictions: dict[str, str], examples: list[dict], version_2: bool | None = None) -> dict[str, float]:
    """EM and F1 in percent over ``examples`` (flat SQuAD rows); a missing prediction scores 0.

    ``version_2`` None: SQuAD 2.0 when any example has no answer. 2.0 adds HasAns_*/NoAns_* splits.
    """
    if version_2 is None:
        version_2 = any(not _has_answer(ex) for ex in examples)
    em, f, has = [], [], []
    for ex in examples:
        golds = _golds(ex, version_2)
        pred = predictions.get(ex["id"])
        if pred is None:
            em.append(0.0)
            f.append(0.0)
        else:
            em.append(max(exact_match(pred, g) for g in golds))
            f.append(max(f1(pred, g, version_2) for g in golds))
        has.append(_has_answer(ex))
    out = _percent("", em, f)
    if version_2:
        out.update(
            _percent(
                "HasAns_",
                [e for e, h in zip(em, has, strict=True) if h],
                [x for x, h in zip(f, has, strict=True) if h],
            )
        )
        out.update(
            _percent(
                "NoAns_",
                [e for e, h in zip(em, has, strict=True) if not h],
                [x for x, h in zip(f, has, strict=True) if not h],
            )
        )
    return out


def _percent(prefix: str, em: list[float], f: list[float]) -> dict[str, float]:
    n = len(em)
    if prefix and n == 0:
        return {f"{prefix}total": 0}
    return {
        f"{prefix}exact_match": 100.0 * sum(em) / max(n, 1),
        f"{prefix}f1": 100.0 * sum(f) / max(n, 1),
        f"{prefix}total": n,
    }
