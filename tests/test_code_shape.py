"""The code stays readable in one sitting: no function in ssmlm/ is longer than a page (100 lines)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ssmlm"
LIMIT = 100


def test_no_function_longer_than_a_page():
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > LIMIT:
                    long.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions longer than a page: " + "; ".join(long)
