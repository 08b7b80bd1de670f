"""The import graph of ssmlm/ follows the data flow: lower layers never import higher ones, and there are no
import cycles (imports inside functions count: a lazy import is still a dependency).

A package has one layer, except for modules listed on their own in LAYER: a module-level entry (e.g.
"models.config") overrides its package's layer. That is how the recipe's schema modules — each package's
section dataclasses and field ranges (models.config, data.config, objectives.config, train.config) and the rule
vocabulary they share (schema) — sit low, below recipe and checks, which only load and check them.

Models never see the training config: no module of ssmlm.models imports ssmlm.recipe or ssmlm.train at all,
not even for type hints under ``if TYPE_CHECKING:`` (which the layer rule otherwise skips)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ssmlm"

# package, top-level module or (overriding its package's) module -> layer; an import may only go to the same
# or a lower layer. Laid out by hand (fmt: skip): modules of one layer share a line, so that a line reads as a layer.
LAYER = {
    "errors": 0, "lockfile": 0, "progress": 0, "schema": 0, "yamlfile": 0,  # schema: Rule and the common ranges
    "paths": 0,  # local paths and gs:// URLs told apart, and the bucket operations
    "hosts": 0,  # what the hosts of one run wait on from each other, with deadlines; the shared-disk probe
    "staging": 0,  # a run in a bucket worked on in a local folder: its records staged, its checkpoints not
    "metrics_file": 0,  # a run's metrics.jsonl read back (train writes it, analyze reads it)
    "markdown": 0,  # the markdown tables of the reports and of `evaluate --table`
    "targets": 0,  # the accelerators a user rents, as data (catalogue), and their compile-only devices (compile_only)
    # the recipe's sections, each beside its package: dataclasses and field ranges (they import only schema)
    "models.config": 1, "data.config": 1, "objectives.config": 1, "train.config": 1,
    "models": 2,
    "recipe": 3, "checks": 3, "data": 3,
    "run_recipe": 3,  # a run's recipe.yaml read as plain YAML, for the CLI's checks before jax (runs/ imports it)
    "evaluate": 3,  # evaluate/: metrics, tables and the one eval step and loop (runner), for objectives and train
    "objectives": 4,
    "runs": 5,
    # the decoding evaluations of a language model: they drive a run's generator and score with evaluate's metrics
    "evaluate.phonebook": 5, "evaluate.squad_gen": 5, "evaluate.infilling": 5,
    "train": 6,
    # evaluation of a run's checkpoint (`ssmlm evaluate`): on the held-out batches its training evaluated on, built
    # by train's parts, and through the lm-eval adapter (train.harness); training itself calls only the runner
    "evaluate.run": 7, "evaluate.lm": 7,
    "analyze": 7,
    "experiment": 7,  # arms × seeds of ordinary runs (train's drivers), their intervals and plots (analyze's)
    "cli": 8, "__main__": 8,
}  # fmt: skip

# what no module of ssmlm.models may import, under TYPE_CHECKING included (a module, or a package and its modules)
MODELS_NEVER_IMPORT = ("ssmlm.recipe", "ssmlm.train")


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


def imports(mods: dict[str, Path], type_checking: bool = False) -> dict[str, set[str]]:
    """module -> the ssmlm modules it imports (at run time; with ``type_checking``, under TYPE_CHECKING too)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree) if type_checking else runtime_nodes(tree):
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
    """The layer of the longest entry of LAYER that names ``module`` or a package above it."""
    key = module.removeprefix("ssmlm.")
    while key not in LAYER and "." in key:
        key = key.rpartition(".")[0]
    assert key in LAYER, f"{module}: not in the layer table of tests/test_layering.py"
    return LAYER[key]


def models_importing_training(edges: dict[str, set[str]]) -> list[str]:
    """Imports by modules of ssmlm.models of the recipe module or the training package."""
    return [
        f"{a} -> {b}"
        for a, bs in edges.items()
        if a == "ssmlm.models" or a.startswith("ssmlm.models.")
        for b in bs
        if any(b == x or b.startswith(x + ".") for x in MODELS_NEVER_IMPORT)
    ]


def test_every_package_has_a_layer():
    for m in modules():
        if m != "ssmlm":
            layer(m)


def test_no_import_goes_up():
    edges = imports(modules())
    bad = [f"{a} -> {b}" for a, bs in edges.items() if a != "ssmlm" for b in bs if layer(b) > layer(a)]
    assert not bad, "imports against the layering: " + "; ".join(sorted(bad))


def test_models_never_import_the_training_config():
    """Families declare parameter groups; ssmlm.train.optim gives them the recipe's settings (models/rules.py)."""
    bad = models_importing_training(imports(modules(), type_checking=True))
    assert not bad, "models importing the recipe or training code: " + "; ".join(sorted(bad))


def test_no_import_cycles():
    edges = imports(modules(), type_checking=True)  # a cycle through type hints is still a cycle to a reader
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
    # a module-level entry overrides its package's layer: the schema modules sit below recipe and checks
    assert layer("ssmlm.train.config") < layer("ssmlm.recipe") == layer("ssmlm.checks") < layer("ssmlm.train.optim")
    assert layer("ssmlm.models.config") < layer("ssmlm.models.bigs") and layer("ssmlm.schema") == 0
    # the training loop evaluates through evaluate's runner; evaluating a run's checkpoint sits above training
    assert layer("ssmlm.evaluate.runner") < layer("ssmlm.train.loop") < layer("ssmlm.evaluate.run")
    # the models rule sees type-hint-only imports (the layer rule skips them), `from ssmlm import recipe` included
    mods = {
        "ssmlm.models.y": tmp_path / "y.py",
        "ssmlm.recipe": tmp_path / "recipe.py",
        "ssmlm.train.config": tmp_path / "config.py",
    }
    (tmp_path / "y.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ssmlm.train.config import TrainConfig\n"
        "    from ssmlm import recipe\n"
    )
    (tmp_path / "recipe.py").write_text("")
    (tmp_path / "config.py").write_text("")
    assert imports(mods)["ssmlm.models.y"] == set()
    assert sorted(models_importing_training(imports(mods, type_checking=True))) == [
        "ssmlm.models.y -> ssmlm.recipe",
        "ssmlm.models.y -> ssmlm.train.config",
    ]


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
