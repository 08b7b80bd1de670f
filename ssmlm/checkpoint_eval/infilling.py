"""Story infilling accuracy (Birdie paper §4.5, App. C).

Each choice is scored as a continuation of the item's prompt: the context is the prompt (ssmlm.data.infilling
.prompt, ending with the question) and a newline, the continuation is the choice spelled as the paper's
label spells the answer, "(D) The letter leads her to an uncharted island." (App. C, Figures 4-5). The
model picks the choice with the lowest loss normalised by the continuation's token count (Table 8: "Losses
are normalized by target token length"), i.e. the highest mean log-likelihood per token:

    chosen = argmax_i  log p(option_i | prompt) / |option_i|

The context goes where the run's generator puts a prompt: in the bidirectional prefix for a Birdie run,
after START for a causal one (ssmlm.runs.generate).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ssmlm.data.infilling import InfillingItem, option, prompt
from ssmlm.runs.scoring import continuation_logprobs, prompt_requests


def choose(scores: Sequence[tuple[float, int, bool]]) -> tuple[int, list[float]]:
    """The chosen choice and every choice's mean log-likelihood per token (continuation_logprobs' output)."""
    per_token = [lp / max(n, 1) for lp, n, _ in scores]
    return int(np.argmax(per_token)), per_token


def evaluate_infilling(generator, items: Sequence[InfillingItem], batch_size: int = 8, quiet: bool = False) -> dict:
    """{"metrics": {"accuracy", "items"}, "records": one per item: index, answer, chosen, correct and the four
    normalised log-likelihoods}."""
    pairs = [(prompt(item) + "\n", option(item, i)) for item in items for i in range(len(item.choices))]
    scores = continuation_logprobs(
        generator.model,
        prompt_requests(generator, pairs),
        batch_size=batch_size,
        desc=None if quiet else "story infilling",
    )
    records, at = [], 0
    for k, item in enumerate(items):
        chosen, per_token = choose(scores[at : at + len(item.choices)])
        at += len(item.choices)
        records.append(
            {"index": k, "answer": item.answer, "chosen": chosen, "correct": chosen == item.answer, "scores": per_token}
        )
    accuracy = float(np.mean([r["correct"] for r in records])) if records else 0.0
    return {"metrics": {"accuracy": accuracy, "items": len(records)}, "records": records}
