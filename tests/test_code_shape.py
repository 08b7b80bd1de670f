"""The code stays readable in one sitting: no function in ssmlm/ is longer than a page (100 lines), and its
comments cite only what its reader has (the papers, public code at a commit, docs/faithfulness.md), each cited
anchor of that page existing."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ssmlm"
LIMIT = 100
# working notes that were never part of the repository, and issue numbers (the git log holds those)
UNREADABLE = re.compile(r"_official\.md|notes §|[Ii]ssue #?[0-9]|shared/reference")
ANCHOR = re.compile(r"faithfulness\.md#([a-z0-9-]+)|(?<![\w/.])#((?:bigs|birdie)-[a-z0-9-]+)")


def test_no_function_longer_than_a_page():
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > LIMIT:
                    long.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "functions longer than a page: " + "; ".join(long)


def test_code_cites_only_what_its_reader_has():
    hits = []
    for path in sorted(ROOT.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if UNREADABLE.search(line):
                hits.append(f"{path.relative_to(ROOT.parent)}:{n}: {line.strip()}")
    assert not hits, "cites working notes or issue numbers:\n" + "\n".join(hits)


def _anchors(page: str) -> set[str]:
    """A markdown page's anchors: explicit {#id} ones and python-markdown's heading slugs."""
    found = set(re.findall(r"\{#([a-z0-9-]+)\}", page))
    for heading in re.findall(r"^#+ (.+?)(?: \{#[a-z0-9-]+\})?$", page, re.M):
        found.add(re.sub(r"[\s-]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower()))
    return found


def test_cited_faithfulness_anchors_exist():
    top = ROOT.parent
    anchors = _anchors((top / "docs" / "faithfulness.md").read_text())
    missing = []
    for path in sorted([*ROOT.rglob("*.py"), *(top / "tests").glob("*.py"), *(top / "benchmarks").glob("*.py")]):
        for match in ANCHOR.finditer(path.read_text()):
            if (name := match[1] or match[2]) not in anchors:
                missing.append(f"{path.relative_to(top)}: #{name}")
    assert not missing, "anchors not on docs/faithfulness.md: " + ", ".join(missing)
