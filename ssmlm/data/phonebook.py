"""Multi-number phone-book lookup (Birdie paper §4.3, App. D Fig. 6; birdie_official.md §5.2) and the JSONL
prompt/response format every finetuning file uses.

A book lists ``entries`` realistic, unique "First Last: DDD-DDD-DDDD" lines; the prompt asks for the numbers of
k of them (a random subset in random order) and the response is those k numbers, in question order, joined by
", ". The question-context-question form ("qcq", the paper's) reads::

    What are the phone numbers for Keven Meador, Stacey Krohn, and Wade Anger? Find them in the phonebook below.

    Phonebook:
    Leonardo Rampone: 669-174-4914
    …
    Kathryn Enrile: 472-553-8622

    What are the phone numbers for Keven Meador, Stacey Krohn, and Wade Anger? Find them in the phonebook above.

"qc" keeps only the first question (before the book), "cq" only the second (after it). The paper prints
only k = 32; for fewer names we write the English the template implies: "A and B" for two (no comma), and
for one the singular "What is the phone number for A? Find it in the phonebook below."

Prompt/response JSONL (phone books, and any instruction-tuning data): one JSON object per line with at least
``"prompt"`` and ``"response"`` (strings; the response may not be empty); other fields are kept as they are
(a phone book adds names, numbers, entries, queries, form). Blank lines are skipped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np

from ssmlm.errors import DataError

FORMS = ("qcq", "qc", "cq")
MAX_QUERIES = 32  # the paper asks for 1..32 numbers


@dataclasses.dataclass(frozen=True)
class PhoneBook:
    prompt: str
    response: str
    names: list[str]  # the queried names, in question order
    numbers: list[str]  # their numbers, in the same order (the gold answer)
    entries: int  # lines in the book

    @property
    def queries(self) -> int:
        return len(self.names)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "queries": self.queries}

    @classmethod
    def from_dict(cls, d: dict) -> PhoneBook:
        return cls(d["prompt"], d["response"], list(d["names"]), list(d["numbers"]), int(d["entries"]))


# ----------------------------------------------------------------------------- text


def question(names: list[str], where: str) -> str:
    """The question for ``names``, ending "Find them in the phonebook {where}." (where: below / above)."""
    if len(names) == 1:
        return f"What is the phone number for {names[0]}? Find it in the phonebook {where}."
    listed = f"{names[0]} and {names[1]}" if len(names) == 2 else f"{', '.join(names[:-1])}, and {names[-1]}"
    return f"What are the phone numbers for {listed}? Find them in the phonebook {where}."


def render(book_names: list[str], book_numbers: list[str], asked: list[int], form: str = "qcq") -> PhoneBook:
    """The prompt and response of a book (lines ``book_names[i]: book_numbers[i]``) asking for entries ``asked``
    (indices, in question order)."""
    if form not in FORMS:
        raise ValueError(f"phone-book form {form!r}: expected one of {FORMS}")
    names = [book_names[i] for i in asked]
    numbers = [book_numbers[i] for i in asked]
    book = "Phonebook:\n" + "\n".join(f"{n}: {p}" for n, p in zip(book_names, book_numbers, strict=True))
    parts = {
        "qcq": [question(names, "below"), book, question(names, "above")],
        "qc": [question(names, "below"), book],
        "cq": [book, question(names, "above")],
    }[form]
    return PhoneBook("\n\n".join(parts), ", ".join(numbers), names, numbers, len(book_names))


# ----------------------------------------------------------------------------- random books


@lru_cache(maxsize=1)
def _faker():
    from faker import Faker

    return Faker("en_US")


def _names(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` unique "First Last" names from Faker seeded from ``rng`` (so the same rng state gives the same names)."""
    fake = _faker()
    fake.seed_instance(int(rng.integers(2**63)))
    seen: dict[str, None] = {}
    while len(seen) < n:
        seen.setdefault(f"{fake.first_name()} {fake.last_name()}")
    return list(seen)


def _numbers(rng: np.random.Generator, n: int) -> list[str]:
    """``n`` unique DDD-DDD-DDDD numbers, every digit uniform (the paper's include 090, 012, …)."""
    seen: dict[str, None] = {}
    while len(seen) < n:
        for d in rng.integers(0, 10, size=(n - len(seen), 10)):
            s = "".join(map(str, d))
            seen.setdefault(f"{s[:3]}-{s[3:6]}-{s[6:]}")
    return list(seen)


@dataclasses.dataclass
class _Draw:
    """A book before rendering: every line, and which lines are asked (in question order)."""

    names: list[str]
    numbers: list[str]
    asked: list[int]

    def render(self, form: str) -> PhoneBook:
        return render(self.names, self.numbers, self.asked, form)


def _draw(rng: np.random.Generator, entries: int, queries: int) -> _Draw:
    if not 1 <= queries <= entries:
        raise ValueError(f"phone book: {queries} queries of {entries} entries (expected 1 <= queries <= entries)")
    names, numbers = _names(rng, entries), _numbers(rng, entries)
    asked = rng.choice(entries, size=queries, replace=False)  # a random subset, in random order
    return _Draw(names, numbers, [int(i) for i in asked])


def make_book(rng: np.random.Generator, entries: int, queries: int, form: str = "qcq") -> PhoneBook:
    """One book of ``entries`` lines asking for ``queries`` of them; deterministic for a given ``rng`` state."""
    return _draw(rng, entries, queries).render(form)


def _shrink(d: _Draw, rng: np.random.Generator, keep: int) -> _Draw:
    """The book with ``keep`` lines: every asked line (the first ``keep`` asked when fewer) and a random subset of
    the others, in their book order."""
    asked = d.asked[:keep]
    asked_all = set(d.asked)
    others = [i for i in range(len(d.names)) if i not in asked_all]
    kept = sorted([*asked, *rng.choice(others, size=keep - len(asked), replace=False).tolist()])
    at = {old: new for new, old in enumerate(kept)}
    return _Draw([d.names[i] for i in kept], [d.numbers[i] for i in kept], [at[i] for i in asked])


def books(n: int, seed: int, entries: tuple[int, int] = (8, 800), queries: tuple[int, int] = (1, MAX_QUERIES),
          form: str = "qcq", fit: Callable[[PhoneBook], int] | None = None,
          max_len: int | None = None) -> list[PhoneBook]:  # fmt: skip
    """``n`` books, book i a function of (seed, i) only: entries ~ U{lo..hi}, queries ~ U{qlo..min(qhi, entries)}.

    ``fit`` (with ``max_len``): a book's token count (prompt + response); while ``fit(book) + 3 > max_len`` (3: the
    paradigm token, START, END) lines that are not asked are dropped, then asked ones too (the paper packs its books
    to the sequence length; at short lengths most books shrink). A book that cannot fit with one line is a DataError.
    """
    (lo, hi), (qlo, qhi) = entries, queries
    if not 1 <= lo <= hi or not 1 <= qlo <= qhi:
        raise DataError(f"phone books: entries {entries} / queries {queries}: expected 1 <= lo <= hi ranges")
    if form not in FORMS:
        raise DataError(f"phone-book form {form!r}: expected one of {', '.join(FORMS)}")
    if (fit is None) != (max_len is None):
        raise ValueError("books: give fit and max_len together")
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        m = int(rng.integers(lo, hi + 1))
        k = int(rng.integers(min(qlo, m), min(qhi, m) + 1))
        d = _draw(rng, m, k)
        book = d.render(form)
        while fit is not None and (need := fit(book) + 3) > max_len:
            lines = len(d.names)
            if lines == 1:
                raise DataError(f"phone book {i}: one entry needs {need} tokens, more than max_len {max_len}")
            # proportional guess at the lines that fit, always at least one fewer
            keep = max(1, min(lines - 1, int(lines * max_len / need)))
            d = _shrink(d, rng, keep)
            book = d.render(form)
        out.append(book)
    return out


# ----------------------------------------------------------------------------- JSONL


def write_jsonl(path: str | Path, items) -> Path:
    """Write books (or prompt/response dicts) one JSON object per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = (b.to_dict() if isinstance(b, PhoneBook) else dict(b) for b in items)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def read_prompt_response(path: str | Path) -> list[dict]:
    """Every line of a prompt/response JSONL file as a dict (see the module doc); bad lines raise DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such prompt/response JSONL file")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{n}: expected a JSON object with 'prompt' and 'response'")
        for key in ("prompt", "response"):
            if not isinstance(row.get(key), str):
                raise DataError(f"{path}:{n}: field '{key}' missing or not a string")
        if not row["response"]:
            raise DataError(f"{path}:{n}: empty 'response' (a finetuning target needs at least one token)")
        out.append(row)
    if not out:
        raise DataError(f"{path}: holds no prompt/response lines")
    return out
