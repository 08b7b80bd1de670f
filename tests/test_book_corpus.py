"""A book in one .txt file as a pretraining corpus: cut into documents (so the validation split works), without
Project Gutenberg's header and licence, in a cache directory named after the files rather than the glob."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import english_lines, invoke, tiny_recipe

from ssmlm.data.books import DOCUMENT_CHARS, SPLIT_ABOVE, split_book, strip_gutenberg
from ssmlm.data.shards import TokenRows
from ssmlm.data.sources import corpus_fingerprint, corpus_name, load_corpus
from ssmlm.data.tokenizer import load_tokenizer

HEADER = """The Project Gutenberg eBook of A Garden Book, by Test Author

This eBook is for the use of anyone anywhere in the United States and
most other parts of the world at no cost and with almost no restrictions
whatsoever. You may copy it, give it away or re-use it under the terms
of the Project Gutenberg License included with this eBook or online at
www.gutenberg.org.

Title: A Garden Book

Author: Test Author

*** START OF THE PROJECT GUTENBERG EBOOK A GARDEN BOOK ***
Produced by Some Kind Volunteers
and the Online Distributed Proofreading Team


"""
FOOTER = """

*** END OF THE PROJECT GUTENBERG EBOOK A GARDEN BOOK ***

Updated editions will replace the previous one--the old editions will
be renamed.

START: FULL LICENSE
THE FULL PROJECT GUTENBERG LICENSE
"""
BOILERPLATE = ("gutenberg", "license", "produced by", "title:", "updated editions")


def book_body(paragraphs: int, seed: int = 0) -> str:
    """A novel's text: a title, chapters, and paragraphs of 6 hard-wrapped sentences between blank lines."""
    lines = english_lines(paragraphs * 6, seed)
    parts = ["A GARDEN BOOK"]
    for p in range(paragraphs):
        if p % 40 == 0:
            parts.append(f"CHAPTER {p // 40 + 1}")
        parts.append("\n".join(" ".join(lines[i : i + 2]) for i in range(p * 6, p * 6 + 6, 2)))
    parts.append("THE END")
    return "\n\n".join(parts)


def gutenberg_book(path: Path, paragraphs: int = 300) -> Path:
    """A Project Gutenberg file of about 300 * 260 characters: several documents' worth."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + book_body(paragraphs) + FOOTER)
    return path


def text_of(docs) -> str:
    return "\n".join(line for d in docs for line in d).lower()


# ----------------------------------------------------------------------------- Project Gutenberg's boilerplate


def test_gutenberg_header_and_footer_are_cut_in_every_form():
    body = book_body(3)
    current = strip_gutenberg(HEADER + body + FOOTER)
    assert current.strip() == body.strip()  # the credit right after the start marker went too
    this_form = (
        "Project Gutenberg's A Garden Book, by Test Author\n\nSome licence text.\n\n"
        "***START OF THIS PROJECT GUTENBERG EBOOK A GARDEN BOOK***\n\n\n" + body + "\n\n\n"
        "End of Project Gutenberg's A Garden Book, by Test Author\n\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK A GARDEN BOOK ***\n\nMore licence.\n"
    )
    assert strip_gutenberg(this_form).strip() == body.strip()
    old_form = (
        "The Project Gutenberg Etext of A Garden Book\n**Details Below**\n\n"
        '***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN ETEXTS**START***\nWhy is this "Small Print!" for?\n'
        "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n" + body + "\n\n"
        "End of the Project Gutenberg Etext of A Garden Book\n"
    )
    assert strip_gutenberg(old_form).strip() == body.strip()
    assert strip_gutenberg(body) is None  # no markers: not a Gutenberg file (or stripped already)
    mention = body + "\n\nShe read a Project Gutenberg book in the garden.\n"
    assert strip_gutenberg(mention) is None  # a mention is not a marker


def test_strip_gutenberg_field_keeps_the_boilerplate_when_off(tmp_path):
    gutenberg_book(tmp_path / "book.txt")
    said = []
    stripped = load_corpus(str(tmp_path / "book.txt"), say=said.append)
    assert not [w for w in BOILERPLATE if w in text_of(stripped.documents)]
    assert stripped.documents[0][0] == "A GARDEN BOOK" and stripped.documents[-1][-1] == "THE END"
    assert any("Project Gutenberg header and licence removed" in s for s in said), said
    kept = load_corpus(str(tmp_path / "book.txt"), strip_gutenberg=False)
    assert all(w in text_of(kept.documents) for w in BOILERPLATE)
    assert kept.fingerprint != stripped.fingerprint  # the cache tells them apart


# ----------------------------------------------------------------------------- a book cut into documents


def test_a_book_is_cut_into_documents_at_paragraph_breaks():
    body = book_body(300)
    docs = split_book(body)
    assert len(body) > SPLIT_ABOVE and len(docs) == pytest.approx(len(body) / DOCUMENT_CHARS, abs=2)
    assert all(DOCUMENT_CHARS // 2 <= sum(map(len, d)) < 2 * DOCUMENT_CHARS for d in docs)
    paragraphs = [p.replace("\n", " ") for p in body.split("\n\n")]
    for d in docs:  # every document is whole paragraphs: it begins where one begins
        assert any(p.startswith(d[0]) for p in paragraphs)
    assert [line for d in docs for line in d] == [ln for ln in body.splitlines() if ln.strip()]  # nothing lost


def test_text_without_blank_lines_or_line_breaks_is_cut_to_size():
    body = book_body(300)
    lines = split_book(body.replace("\n\n", "\n"))  # hard-wrapped, no blank lines: cut at line ends
    one_line = split_book(body.replace("\n\n", " ").replace("\n", " "))  # no line breaks at all: at spaces
    for docs in (lines, one_line):
        assert len(docs) > 3 and all(sum(map(len, d)) < 2 * DOCUMENT_CHARS for d in docs)
    assert " ".join(line for d in one_line for line in d).split() == body.split()  # no word cut or lost


def test_short_files_stay_one_document_and_many_long_files_are_said_in_one_line(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "chapter.txt").write_text(book_body(20))  # a chapter: one document, as before
    for i in range(5):
        (d / f"book{i}.txt").write_text(book_body(200, seed=i))
    said = []
    docs = load_corpus(str(d / "*.txt"), say=said.append).documents
    assert len(docs) > 6 and [ln.strip() for ln in book_body(20).splitlines() if ln.strip()] in docs
    assert len(said) == 4 and said[-1].startswith("… and 2 more long files, split into"), said
    assert re.match(
        r".*book0\.txt: one file, split into \d+ documents of ~[\d,]+ characters \(~\d+ paragraphs\)$", said[0]
    ), said


# ----------------------------------------------------------------------------- preprocessing, as a user runs it


def data_dirs(home: Path) -> list[Path]:
    return sorted(p for p in (home / "data").iterdir() if p.is_dir())


def test_one_gutenberg_book_preprocesses_without_a_hand_split(tmp_path, monkeypatch):
    monkeypatch.setenv("SSMLM_HOME", str(tmp_path / "home"))
    gutenberg_book(tmp_path / "my books" / "garden.txt")
    source = str(tmp_path / "my books" / "*.txt")
    recipe = tiny_recipe(tmp_path / "r.yaml", source, data={"validation_fraction": 0.2})
    result = invoke("preprocess", recipe)
    assert "garden.txt: Project Gutenberg header and licence removed" in result.output
    assert re.search(r"garden\.txt: one file, split into \d+ documents", result.output), result.output
    n = len(load_corpus(source).documents)
    assert f"tokenizer: training a WordPiece of up to 150 tokens on your corpus ({n} documents)…" in result.output

    [out] = data_dirs(tmp_path / "home")
    assert out.name.startswith("garden-L32-") and not set("*?[]{} ") & set(out.name), out.name  # not '*-L32-…'
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["documents"] == n > 5
    assert meta["splits"]["train"]["sequences"] and meta["splits"]["validation"]["sequences"]
    tok = load_tokenizer(out / "tokenizer.json")
    text = " ".join(tok.decode(row.tolist()) for row in TokenRows(out, "train")[:]["tokens"])
    assert "garden book" in text and "gutenberg" not in text and "license" not in text

    kept = invoke("preprocess", recipe, "--set", "data.strip_gutenberg=false", code=None)  # a dataset of its own
    assert kept.exit_code == 0 and "header and licence removed" not in kept.output, kept.output
    new = [p for p in data_dirs(tmp_path / "home") if p != out]
    assert len(new) == 1
    tok = load_tokenizer(new[0] / "tokenizer.json")
    rows = [*TokenRows(new[0], "train")[:]["tokens"], *TokenRows(new[0], "validation")[:]["tokens"]]
    assert "gutenberg" in " ".join(tok.decode(row.tolist()) for row in rows)


def test_a_single_short_file_all_held_out_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("SSMLM_HOME", str(tmp_path / "home"))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "note.txt").write_text(book_body(10))  # under SPLIT_ABOVE: one document
    recipe = tiny_recipe(tmp_path / "r.yaml", tmp_path / "c" / "*.txt", data={"validation_fraction": 0.9999})
    result = invoke("preprocess", recipe, code=None)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and "no training text left" in line, line
    assert "held out its only document" in line and "lower data.validation_fraction" in line, line
    assert "tokenizer:" not in result.output  # refused before the tokenizer is trained
    assert not (tmp_path / "home" / "data").is_dir() or not data_dirs(tmp_path / "home")  # nothing half-written


def test_a_split_that_holds_nothing_out_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("SSMLM_HOME", str(tmp_path / "home"))
    gutenberg_book(tmp_path / "c" / "garden.txt")
    recipe = tiny_recipe(tmp_path / "r.yaml", tmp_path / "c", data={"validation_fraction": 1e-6})
    result = invoke("preprocess", recipe)
    n = len(load_corpus(str(tmp_path / "c")).documents)
    assert f"no validation: data.validation_fraction = 1e-06 of {n} documents held none out" in result.output


def test_the_cache_name_and_fingerprint_follow_the_resolved_files(tmp_path):
    d = tmp_path / "c"
    gutenberg_book(d / "a.txt", 20)
    (d / "b.jsonl").write_text(json.dumps({"text": "one row"}) + "\n")
    glob = str(d / "*.txt")
    before = corpus_fingerprint(glob)
    gutenberg_book(d / "a.txt", 21)  # edited: a new size
    assert corpus_fingerprint(glob) != before
    gutenberg_book(d / "b.txt", 20)  # another file now matches
    assert corpus_fingerprint(glob) not in (before, corpus_fingerprint(str(d / "a.txt")))
    assert corpus_name(glob) == "c" and corpus_name(str(d / "a.*")) == "a"  # the files' directory, or the one file
    odd = tmp_path / "my books (draft)"
    gutenberg_book(odd / "x.txt", 20)
    gutenberg_book(odd / "y.txt", 20)
    assert corpus_name(str(odd / "*.txt")) == corpus_name(str(odd)) == "my_books_draft"
    jsonl = str(d / "b.jsonl")  # stripping concerns .txt files only: other corpora keep their caches
    assert corpus_fingerprint(jsonl, strip_gutenberg=False) == corpus_fingerprint(jsonl)
