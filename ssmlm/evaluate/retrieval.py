"""Scoring phone-book lookups (Birdie paper §4.3, Fig. 1; docs/faithfulness.md#birdie-evaluations).

The paper's "accuracy" is not defined precisely, so both readings are reported: per-number accuracy (queried
number j is right when the j-th DDD-DDD-DDDD in the generation, or the j-th run of digits as long as the books'
shorter numbers, equals gold number j) and all-k accuracy (every queried number right). Tables break both down
by the number of queried numbers (1..32, Fig. 1's x-axis) and by the book's entry count.

Beside the scores, the share of replies that are empty and of those that are malformed: a non-empty reply that is
not a comma-separated list of numbers of the books' shape (e.g. "999" for 4-digit numbers, or "34-33"). Such a
reply scores no digit at all, so a digit accuracy near 0 can mean wrong digits or answers of the wrong form; the
malformed share tells which.
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"\d{3}-\d{3}-\d{4}")
# entry-count bins [lo, next lo): powers of two from the paper's smallest training book (8) up to its 800
ENTRY_BINS = (1, 8, 16, 32, 64, 128, 256, 512)


def parse_numbers(text: str, like: str | None = None) -> list[str]:
    """The phone numbers in ``text``, in order: DDD-DDD-DDDD, or (``like`` a number of another shape, e.g. a
    4-digit "0471") runs of exactly that many digits."""
    if like is None or NUMBER.fullmatch(like):
        return NUMBER.findall(text)
    return re.findall(rf"(?<!\d)\d{{{len(like)}}}(?!\d)", text)


def malformed(generated: str, book_numbers: list[str]) -> bool:
    """Whether a non-empty reply is not a list of numbers shaped like ``book_numbers`` joined by commas (spaces
    around each number allowed); an empty reply is empty, not malformed."""
    text = generated.strip()
    if not text or not book_numbers:
        return False
    like = book_numbers[0]
    shape = NUMBER if NUMBER.fullmatch(like) else re.compile(rf"\d{{{len(like)}}}")
    return not all(shape.fullmatch(piece.strip()) for piece in text.split(","))


def score_book(generated: str, book_numbers: list[str]) -> dict:
    """{queries, correct, all_correct, digits, digits_correct, malformed}: queried number j is correct iff the
    j-th number parsed from ``generated`` equals ``book_numbers[j]`` (a missing, extra-early or reordered number
    counts as wrong); its digits are compared position by position with the same j-th number (missing: none
    right); ``malformed``: see ``malformed``."""
    got = parse_numbers(generated, book_numbers[0] if book_numbers else None)
    correct = sum(j < len(got) and got[j] == gold for j, gold in enumerate(book_numbers))
    digits = sum(sum(c.isdigit() for c in gold) for gold in book_numbers)
    digits_correct = sum(
        sum(a == b and a.isdigit() for a, b in zip(got[j], gold, strict=True))
        for j, gold in enumerate(book_numbers)
        if j < len(got)
    )
    return {
        "queries": len(book_numbers),
        "correct": correct,
        "all_correct": correct == len(book_numbers),
        "digits": digits,
        "digits_correct": digits_correct,
        "malformed": malformed(generated, book_numbers),
    }


def entry_bin(entries: int) -> str:
    """The label of the ENTRY_BINS bin holding ``entries`` ("8-15", …, "512+")."""
    lo = max(b for b in ENTRY_BINS if b <= max(entries, ENTRY_BINS[0]))
    i = ENTRY_BINS.index(lo)
    return f"{lo}+" if i == len(ENTRY_BINS) - 1 else f"{lo}-{ENTRY_BINS[i + 1] - 1}"


def _digit_accuracy(records: list[dict]) -> float | None:
    digits = sum(r.get("digits", 0) for r in records)
    return sum(r.get("digits_correct", 0) for r in records) / digits if digits else None


def _table(groups: dict) -> dict:
    return {
        key: {
            "books": len(rs),
            "number_accuracy": sum(r["correct"] for r in rs) / max(1, sum(r["queries"] for r in rs)),
            "all_correct": sum(bool(r["all_correct"]) for r in rs) / len(rs),
            "digit_accuracy": _digit_accuracy(rs),
        }
        for key, rs in groups.items()
    }


def summarize(records: list[dict]) -> dict:
    """Overall per-number and all-k accuracy (fractions in [0, 1]), and the same per number of queries
    ("by_queries", keys "1".."32" ascending) and per entry-count bin ("by_entries", keys in bin order).
    ``records``: dicts with "entries", "queries", "correct", "all_correct" (and "generated": the share of empty
    replies is given too; "malformed": the share of malformed ones)."""
    by_k: dict[str, list] = {}
    by_n: dict[str, list] = {}
    for r in sorted(records, key=lambda r: (r["queries"], r["entries"])):
        by_k.setdefault(str(r["queries"]), []).append(r)
    for r in sorted(records, key=lambda r: r["entries"]):
        by_n.setdefault(entry_bin(r["entries"]), []).append(r)
    queries = sum(r["queries"] for r in records)
    out = {
        "books": len(records),
        "numbers": queries,
        "number_accuracy": sum(r["correct"] for r in records) / max(1, queries),
        "all_correct": sum(bool(r["all_correct"]) for r in records) / max(1, len(records)),
        "digit_accuracy": _digit_accuracy(records),
    }
    if records and all("generated" in r for r in records):
        # a model that ends its reply at once scores below a guesser's chance: say so beside the accuracies
        out["empty_replies"] = sum(not r["generated"].strip() for r in records) / len(records)
    if records and all("malformed" in r for r in records):  # a reply of the wrong form scores no digit
        out["malformed_replies"] = sum(bool(r["malformed"]) for r in records) / len(records)
    return {**out, "by_queries": _table(by_k), "by_entries": _table(by_n)}
