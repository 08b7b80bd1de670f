"""The import graph of ssmlm/ follows the data flow: lower layers never import higher ones, and there are no
import cycles (imports inside functions count: a lazy import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ssmlm"

# package (or top-level module) -> layer; an import may only go to the same or a lower layer
LAYER = {
    "errors": 0, "progress": 0,
    "models": 1,
    "recipe": 2, "checks": 2, "data": 2, "evaluate": 2,  # evaluate/: metrics and tables (no training code)
    "objectives": 3,
    "runs": 4,
    "train": 5,
    "analyze": 6,
    "cli": 7, "__main__": 7,
}  # fmt: skip


def modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:` (type hints only: not a run-time dependency)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in runtime_nodes(ast.parse(p.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                # `from ssmlm import objectives` imports the module ssmlm.objectives
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for t in names:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m and t != "ssmlm":
                    edges[m].add(t)
    return edges


def layer(module: str) -> int:
    key = module.split(".")[1] if "." in module else module
    assert key in LAYER, f"{module}: not in the layer table of tests/test_layering.py"
    return LAYER[key]


def test_every_package_has_a_layer():
    for m in modules():
        if m != "ssmlm":
            layer(m)


def test_no_import_goes_up():
    edges = imports(modules())
    bad = [f"{a} -> {b}" for a, bs in edges.items() if a != "ssmlm" for b in bs if layer(b) > layer(a)]
    assert not bad, "imports against the layering: " + "; ".join(sorted(bad))


def test_no_import_cycles():
    edges = imports(modules())
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        for v in sorted(edges.get(u, ())):
            if state.get(v) == 1:
                cycles.append(" -> ".join(path[path.index(v) :] + [v]))
            elif v not in state:
                visit(v, path + [v])
        state[u] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(cycles)


def test_the_rules_catch_a_violation(tmp_path):
    """The walker sees lazy imports and `from ssmlm import x` forms (else the tests above could not fail)."""
    mods = {"ssmlm.models.x": tmp_path / "x.py", "ssmlm.train.loop": tmp_path / "loop.py"}
    (tmp_path / "x.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ssmlm.cli\n"
        "def f():\n    from ssmlm.train import loop\n"
    )
    (tmp_path / "loop.py").write_text("import ssmlm.models.x\n")
    edges = imports(mods)
    assert edges["ssmlm.models.x"] == {"ssmlm.train.loop"} and edges["ssmlm.train.loop"] == {"ssmlm.models.x"}
    assert layer("ssmlm.train.loop") > layer("ssmlm.models.x")


def test_analyses_registry_finds_every_analysis_module():
    """Adding an analysis is adding a file: every module of ssmlm.analyze with a `command` is registered,
    and its help says which figure or table it reproduces."""
    from typer.testing import CliRunner

    from ssmlm.analyze import registry
    from ssmlm.cli import app

    found = registry()
    assert "kernels" in found
    for name, module in found.items():
        assert module.FIGURE and module.FIGURE in module.command.__doc__, name
    out = CliRunner().invoke(app, ["analyze", "--help"]).output
    assert all(name in out for name in found)
