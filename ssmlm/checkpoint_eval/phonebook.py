"""Run a language model on phone books (Birdie paper §4.3): greedy decoding per book, scored per number.

The model reads each book's prompt as a prefix-LM sample, as it was finetuned (``Generator`` lays it out), and
generates until END or a newline (a response is one line); ``ssmlm.evaluate.retrieval`` scores the text.
"""

from __future__ import annotations

from ssmlm.data.phonebook import PhoneBook, phonebook_items  # noqa: F401 (phonebook_items: importable from here)
from ssmlm.evaluate.retrieval import score_book, summarize
from ssmlm.progress import progress_bar

SLACK_TOKENS = 8  # generated beyond the gold response's length, so a slightly longer answer is not cut off


def evaluate_phonebook(
    generator, books: list[PhoneBook], max_new_tokens: int | None = None, progress: bool = True
) -> dict:
    """{"metrics": summarize(records), "records": [...]}: one record per book with its size, gold numbers, the
    generated text and its score. ``max_new_tokens`` (default: the gold response's token count + SLACK_TOKENS)."""
    from ssmlm.models.decode import Sampling

    tok = generator.tokenizer
    records = []
    with progress_bar(not progress) as bar:
        task = bar.add_task("phone books", total=len(books))
        for i, book in enumerate(books):
            budget = max_new_tokens or len(tok.encode(book.response, add_special_tokens=False).ids) + SLACK_TOKENS
            text = generator(book.prompt, Sampling(max_new_tokens=budget), stop=("\n",))
            records.append(
                {
                    "index": i,
                    "entries": book.entries,
                    **score_book(text, book.numbers),
                    "numbers": book.numbers,
                    "generated": text,
                }
            )
            bar.advance(task)
    return {"metrics": summarize(records), "records": records}
