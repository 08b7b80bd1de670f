"""Plain-text books as pretraining documents: Project Gutenberg's header and licence cut away, and a book in one
file cut into documents of a few pages at paragraph breaks.

A whole book as one document would leave the validation split all or nothing (documents are held out whole), and
Gutenberg's boilerplate (the same licence in every file) would be learnt as if it were the author's text.
"""

from __future__ import annotations

import re

DOCUMENT_CHARS = 10_000  # a document cut from a long file: a few pages, about a chapter (~2,500 tokens)
SPLIT_ABOVE = 3 * DOCUMENT_CHARS  # longer files are cut into documents; shorter ones stay one document each

# The line after which a Project Gutenberg text begins, in every form the files have had: "*** START OF THE
# PROJECT GUTENBERG EBOOK X ***", "***START OF THIS PROJECT GUTENBERG EBOOK X***", and the 1990s
# "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*" that closed the licence at the top.
_START = re.compile(r"^\W*(start\W+of\W+(the\W+|this\W+)?project\W+gutenberg|end\W*the\W+small\W+print)", re.I)
# The line at which its end matter begins: "*** END OF THE PROJECT GUTENBERG EBOOK X ***", "End of the Project
# Gutenberg EBook of X", "End of Project Gutenberg's X" (the first of them: the older ones come in pairs).
_END = re.compile(r"^\W*end\W+of\W+(the\W+|this\W+)?project\W+gutenberg", re.I)
# A transcriber's credit right after the start marker ("Produced by ...") is Gutenberg's too.
_CREDIT = re.compile(r"^(produced|prepared|transcribed|e-?text prepared)\b.*\bby\b|^this e-?book was produced", re.I)


def strip_gutenberg(text: str) -> str | None:
    """``text`` without Project Gutenberg's header (licence, credits) and footer, or None when it has no marker of
    either (then it is not a Gutenberg file, or was stripped already)."""
    if not re.search("gutenberg|small print", text, re.I):  # the common case, without splitting lines
        return None
    lines = text.splitlines()
    end = next((i for i, ln in enumerate(lines) if _END.match(ln)), None)
    head = lines[:end]
    start = max((i for i, ln in enumerate(head) if _START.match(ln)), default=None)
    if start is None and end is None:
        return None
    body = head[start + 1 :] if start is not None else head
    first = next((i for i, ln in enumerate(body) if ln.strip()), len(body))
    if start is not None and first < len(body) and _CREDIT.match(body[first].strip()):
        while first < len(body) and body[first].strip():  # the credit's paragraph
            first += 1
    return "\n".join(body[first:])


def paragraphs(text: str) -> list[list[str]]:
    """The text's paragraphs (runs of lines between blank lines), each a list of its stripped lines."""
    out, para = [], []
    for raw in text.splitlines():
        line = raw.strip()
        if line:
            para.append(line)
        elif para:
            out.append(para)
            para = []
    if para:
        out.append(para)
    return out


def _cut_line(line: str, size: int) -> list[str]:
    """A line of more than twice ``size`` characters (a file without line breaks) cut at spaces into ~``size``."""
    out = []
    while len(line) > 2 * size:
        cut = line.find(" ", size)
        cut = cut if 0 < cut <= 2 * size else size  # no space near: cut the word
        out.append(line[:cut].strip())
        line = line[cut:].strip()
    return [*out, line] if line else out


def _units(paras: list[list[str]], size: int):
    """What a document may be cut between: paragraphs; a paragraph over twice ``size`` (a text without blank lines)
    line by line; a line over twice ``size`` at spaces."""
    for para in paras:
        if sum(map(len, para)) <= 2 * size:
            yield para
            continue
        for line in para:
            yield from ([piece] for piece in _cut_line(line, size))


def split_book(text: str, size: int = DOCUMENT_CHARS) -> list[list[str]]:
    """Documents (lists of lines) of about ``size`` characters, cut at paragraph breaks (where the text has no
    blank lines, at line ends); a short tail joins the document before it."""
    docs: list[list[str]] = []
    doc, chars = [], 0
    for unit in _units(paragraphs(text), size):
        doc.extend(unit)
        chars += sum(map(len, unit))
        if chars >= size:
            docs.append(doc)
            doc, chars = [], 0
    if doc:
        if docs and chars < size // 2:
            docs[-1].extend(doc)
        else:
            docs.append(doc)
    return docs
