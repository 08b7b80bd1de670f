"""A new analysis, added as docs/developing.md says: a module in ssmlm/analyze/ with NAME, FIGURE and `command`
(whose docstring names the FIGURE), and nothing else: the package is the registry. Through the package as
shipped (tests/plugins.py) it is an `ssmlm analyze` command, listed by `analyze --help`, its docstring its help,
its result printed as tables or, with --json, as JSON."""

import json

from plugins import plug_in, ssmlm

MODULE = '''
"""`analyze squares`: the squares of 1..N (a toy)."""
from typing import Annotated

import typer

NAME = "squares"
FIGURE = "Toy Table 1"


def command(n: Annotated[int, typer.Option("--n", help="How many squares.")] = 3):
    """The squares of 1..N, as a table (Toy Table 1)."""
    return {"figure": FIGURE, "rows": [{"n": i, "square": i * i} for i in range(1, n + 1)]}
'''


def test_an_analysis_module_is_a_command(tmp_path):
    root = plug_in(tmp_path, {"analyze/squares.py": MODULE}, {})
    assert "squares" in ssmlm(root, "analyze", "--help")
    assert "Toy Table 1" in ssmlm(root, "analyze", "squares", "--help")
    assert "16" in ssmlm(root, "analyze", "squares", "--n", "4")
    result = json.loads(ssmlm(root, "analyze", "squares", "--n", "2", "--json"))
    assert result["rows"] == [{"n": 1, "square": 1}, {"n": 2, "square": 4}]
