"""GitHub markdown tables, as the reports and `evaluate --table` write them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]], align: str = "", pad: bool = False) -> list[str]:
    """The table's lines: the header, the rule, a line per row. ``align``: a letter per column, "r" to align it right
    (numbers) or "l" (the default, for columns past its end too). ``pad``: cells padded to their column's width, so
    that the text lines up as well as the rendered table."""
    body = [list(map(str, r)) for r in rows]
    right = [i < len(align) and align[i] == "r" for i in range(len(head))]
    if not pad:
        rule = "|" + "".join("---:|" if r else "---|" for r in right)
        return [_line(head), rule, *map(_line, body)]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]

    def padded(cells: Sequence[str]) -> str:
        cells = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if r else "-") for w, r in zip(widths, right, strict=True)) + "|"
    return [padded(head), rule, *map(padded, body)]


def _line(cells: Sequence[str]) -> str:
    """``| a | b |``, an empty cell as ``| |``."""
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"
