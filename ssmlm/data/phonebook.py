"""Multi-number phone-book lookup (Birdie paper §4.3, App. D Fig. 6; docs/faithfulness.md#birdie-evaluations)
and the JSONL prompt/response format every finetuning file uses.

A book lists ``entries`` realistic, unique "First Last: DDD-DDD-DDDD" lines; the prompt asks for the numbers of
k of them (a random subset in random order) and the response is those k numbers, in question order, joined by
", " and led by a space (" 545-434-3440, 030-774-3676"). The space is there so that every number is written with
the tokens it is read with: in the book a number follows ": ", and a byte-level BPE (GPT-2's pre-tokenizer) joins
a leading space to the digits after it, so " 3433" and "3433" are different tokens; led by a space, the first
number of the reply has the book's tokens, and the later ones follow ", " as the book's follow ": ". The
question-context-question form ("qcq", the paper's) reads::

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
(a phone book adds names, numbers, entries, queries). Blank lines are skipped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np

from ssmlm.errors import DataError, UserError
from ssmlm.progress import progress_bar

FORMS = ("qcq", "qc", "cq")
# `ssmlm evaluate --task phonebook --split S` draws its books from train.seed + SPLIT_SEEDS[S]; finetuning draws
# its training books from train.seed itself and its validation books from train.seed + 1,000,003, so no two sets
# share a seed stream. An experiment selects on validation and reports on test: books nothing was chosen on.
SPLIT_SEEDS = {"validation": 2_000_003, "test": 3_000_017}
MAX_QUERIES = 32  # the paper asks for 1..32 numbers
PAPER_DIGITS = 10  # DDD-DDD-DDDD; other lengths are written as one run of digits (smaller designs, e.g. 4)


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
    return PhoneBook("\n\n".join(parts), answer(numbers), names, numbers, len(book_names))


def answer(numbers: list[str]) -> str:
    """The response for ``numbers``: " N1, N2, …", each number after a space as in the book (see the module doc)."""
    return " " + ", ".join(numbers)


def split_seed(split: str) -> int:
    """What ``split``'s evaluation books add to train.seed (SPLIT_SEEDS); another split is a UserError."""
    if split not in SPLIT_SEEDS:
        raise UserError(f"--split {split!r}: phone books are drawn for {' or '.join(SPLIT_SEEDS)}, not other splits")
    return SPLIT_SEEDS[split]


# ----------------------------------------------------------------------------- random books


@lru_cache(maxsize=1)
def _faker():
    from faker import Faker

    return Faker("en_US")


def _unique(draw, n: int, seen: dict[str, None] | None = None) -> list[str]:
    """The first ``n`` distinct values of the stream ``draw()`` (a prefix of a longer call's result); ``seen``: the
    distinct values drawn so far, when ``draw`` continues the stream that gave them."""
    seen = dict.fromkeys(seen or ())
    while len(seen) < n:
        seen.setdefault(draw())
    return list(seen)


class _Lines:
    """A book's lines as streams: line j = (name j, number j); lines 0..k-1 are the asked ones, in question order,
    and the book shows its lines in a random order (``rank``). Prefixes are stable: the first n lines do not depend
    on how many more are drawn, so a book shrinks to its first n lines (every asked line first, then a random
    subset of the others, in book order) without drawing the rest."""

    def __init__(self, rng: np.random.Generator, entries: int, queries: int, digits: int = PAPER_DIGITS):
        if not 1 <= queries <= entries:
            raise ValueError(f"phone book: {queries} queries of {entries} entries (expected 1 <= queries <= entries)")
        self.entries, self.queries, self.digits = entries, queries, digits
        self.name_seed, self.number_seed = (int(x) for x in rng.integers(2**63, size=2))
        self.rank = rng.permutation(entries)  # rank[j]: where line j stands in the full book
        self.names: list[str] = []
        self.numbers: list[str] = []
        # where the streams stand after the lines drawn so far: fitting a book asks for 1, 2, 4, … lines, and each
        # draw continues the streams instead of drawing the first lines again
        self.name_state = None
        self.number_rng = np.random.default_rng(self.number_seed)

    def _draw(self, n: int) -> None:
        if n <= len(self.names):
            return
        fake = _faker()  # realistic en_US first and last names, seeded per book
        if self.name_state is None:
            fake.seed_instance(self.name_seed)
        else:
            fake.random.setstate(self.name_state)
        self.names = _unique(lambda: f"{fake.first_name()} {fake.last_name()}", n, self.names)
        self.name_state = fake.random.getstate()
        rng = self.number_rng

        def number() -> str:  # every digit uniform (the paper's numbers include 090, 012, …)
            d = "".join(map(str, rng.integers(0, 10, size=self.digits)))
            return f"{d[:3]}-{d[3:6]}-{d[6:]}" if self.digits == PAPER_DIGITS else d

        self.numbers = _unique(number, n, self.numbers)

    def render(self, form: str, lines: int | None = None) -> PhoneBook:
        """The book of the first ``lines`` lines (all by default)."""
        n = self.entries if lines is None else lines
        self._draw(n)
        order = np.argsort(self.rank[:n], kind="stable")  # book position -> line
        at = {int(j): pos for pos, j in enumerate(order)}
        asked = [at[j] for j in range(min(self.queries, n))]
        return render([self.names[j] for j in order], [self.numbers[j] for j in order], asked, form)


def make_book(
    rng: np.random.Generator, entries: int, queries: int, form: str = "qcq", digits: int = PAPER_DIGITS
) -> PhoneBook:
    """One book of ``entries`` lines asking for ``queries`` of them (a random subset in random order);
    deterministic for a given ``rng`` state."""
    return _Lines(rng, entries, queries, digits).render(form)


def books(
    n: int,
    seed: int,
    entries: tuple[int, int] = (8, 800),
    queries: tuple[int, int] = (1, MAX_QUERIES),
    form: str = "qcq",
    fit: Callable[[PhoneBook], int] | None = None,
    max_len: int | None = None,
    progress: str | None = None,
    digits: int = PAPER_DIGITS,
) -> list[PhoneBook]:
    """``n`` books, book i a function of (seed, i) only: entries ~ U{lo..hi}, queries ~ U{qlo..min(qhi, entries)},
    numbers of ``digits`` digits (the paper's 10 as DDD-DDD-DDDD).
    ``progress``: a label for a progress bar (thousands of books take a minute), None for none.

    ``fit`` (with ``max_len``): a book's token count (prompt + response). A book with ``fit(book) + 3 > max_len``
    (3: the paradigm token, START, END) keeps the most lines that fit: its asked lines first (all of them while
    any other line fits), then a random subset of the others (the paper packs its books to the sequence length;
    at short lengths most books shrink). A book that cannot fit one line is a DataError.
    """
    (lo, hi), (qlo, qhi) = entries, queries
    if not 1 <= lo <= hi or not 1 <= qlo <= qhi:
        raise DataError(f"phone books: entries {entries} / queries {queries}: expected 1 <= lo <= hi ranges")
    if form not in FORMS:
        raise DataError(f"phone-book form {form!r}: expected one of {', '.join(FORMS)}")
    if not 1 <= digits <= PAPER_DIGITS or hi > 10**digits // 2:
        raise DataError(
            f"phone books: {digits}-digit numbers for up to {hi} entries: expected 1-10 digits with "
            f"at least twice as many numbers as entries"
        )
    if (fit is None) != (max_len is None):
        raise ValueError("books: give fit and max_len together")
    out = []
    with progress_bar(progress is None) as bar:
        task = bar.add_task(progress or "", total=n)
        for i in range(n):
            rng = np.random.default_rng([seed, i])
            m = int(rng.integers(lo, hi + 1))
            book = _Lines(rng, m, int(rng.integers(min(qlo, m), min(qhi, m) + 1)), digits)
            out.append(book.render(form) if fit is None else _fitted(book, form, fit, max_len, i))
            bar.advance(task)
    return out


def _fitted(book: _Lines, form: str, fit, max_len: int, i: int) -> PhoneBook:
    """The book of the most lines that fit (token counts grow with lines: doubling, then bisection)."""
    fits = lambda n: fit(book.render(form, n)) + 3 <= max_len  # noqa: E731
    if not fits(1):
        need = fit(book.render(form, 1)) + 3
        raise DataError(f"phone book {i}: one entry needs {need} tokens, more than max_len {max_len}")
    good, bad = 1, None
    while bad is None and good < book.entries:
        n = min(2 * good, book.entries)
        good, bad = (n, None) if fits(n) else (good, n)
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return book.render(form, good)


def phonebook_items(
    tokenizer,
    seq_len: int,
    n: int,
    seed: int,
    entries: tuple[int, int] = (8, 800),
    queries: tuple[int, int] = (1, MAX_QUERIES),
    form: str = "qcq",
    progress: str | None = None,
    digits: int = PAPER_DIGITS,
) -> list[PhoneBook]:
    """``n`` books (``books``: book i a function of (seed, i)), each shrunk to fit ``seq_len`` tokens of
    ``tokenizer`` together with the paradigm token, START and END (``progress``: a bar's label, or None)."""

    def count(book: PhoneBook) -> int:
        return sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in (book.prompt, book.response))

    return books(n, seed, entries, queries, form=form, fit=count, max_len=seq_len, progress=progress, digits=digits)


def phonebook_books(
    settings, tokenizer, seq_len: int, n: int, seed: int, progress: str | None = None
) -> list[PhoneBook]:
    """``n`` books drawn as a recipe's ``task.phonebook`` settings say (entries, queries, form), each fitted to
    ``seq_len``: what finetuning trains and validates on and what `ssmlm evaluate --task phonebook` decodes
    (``progress``: a bar's label, or None)."""
    return phonebook_items(
        tokenizer,
        seq_len,
        n,
        seed,
        entries=tuple(settings.entries),
        queries=tuple(settings.queries),
        form=settings.form,
        progress=progress,
        digits=settings.digits,
    )


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
