"""SQuAD v2 by generation (Birdie §4.4, App. B, Figure 2): answer each answerable question greedily from
"{context}\\n\\n{question}" and score the response by Answer Contains Label and token F1, overall and by context
length.

Decoding follows the paper's text: greedy, at most 64 new tokens (§4.4), no few-shot examples. A response ends
at the END token (a finetuned response's close) or at a blank line.
"""

from __future__ import annotations

from collections.abc import Sequence

from ssmlm.data.qa import prompt
from ssmlm.evaluate.qa_metrics import DEFAULT_BINS, by_length, score, summarize
from ssmlm.progress import progress_bar

STOP = ("\n\n",)


def evaluate_squad(
    generator, items: Sequence[dict], max_new_tokens: int = 64, progress: bool = True, bins=DEFAULT_BINS
) -> dict:
    """Generate an answer to every item (see `ssmlm.data.qa.load_answerable`) and score it.

    ``generator``: a `ssmlm.runs.generate.Generator` (called as ``generator(prompt, Sampling, stop)``; its
    ``tokenizer`` measures context lengths). Returns {"metrics": {contains_label, contains_label_normalized, f1,
    items} (percent), "by_length": `by_length` rows, "records": one per item {id, question, answers, prediction,
    context_tokens, contains, contains_normalized, f1} (scores in [0, 1])}.
    """
    from ssmlm.models.decode import Sampling

    greedy = Sampling(max_new_tokens=max_new_tokens)
    records = []
    with progress_bar(not progress) as bar:
        task = bar.add_task("SQuAD v2", total=len(items))
        for item in items:
            pred = generator(prompt(item), greedy, STOP)
            n_ctx = len(generator.tokenizer.encode(item["context"], add_special_tokens=False).ids)
            records.append(
                {
                    "id": item["id"],
                    "question": item["question"],
                    "answers": list(item["answers"]),
                    "prediction": pred,
                    "context_tokens": n_ctx,
                    **score(pred, item["answers"]),
                }
            )
            bar.advance(task)
    overall = summarize(records)
    metrics = {
        "contains_label": overall["contains"],
        "contains_label_normalized": overall["contains_normalized"],
        "f1": overall["f1"],
        "items": len(records),
    }
    return {"metrics": metrics, "by_length": by_length(records, bins), "records": records}
