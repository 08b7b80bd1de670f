"""The import graph of ssmlm/ follows the data flow: lower layers never import higher ones, and there are no
import cycles (imports inside functions count: a lazy import is still a dependency).

Every package has one layer, and so does every top-level module: LAYER names no module inside a package. So the
graph of packages (each module collapsed to its top-level package under ssmlm/) has no cycles either, which
a package reads whole: what it may import is what sits below it. The recipe's sections are each package's
config.py (models, data, objectives), imported by recipe and checks above them; the ``train:`` and ``mesh:``
sections are train_config.py at the bottom, not in train/, because train/ imports the recipe.

Models never see the training config: no module of ssmlm.models imports ssmlm.recipe, ssmlm.train or
ssmlm.train_config at all, not even for type hints under ``if TYPE_CHECKING:`` (which the layer rule otherwise
skips)."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "ssmlm"

# package or top-level module -> layer; an import may only go to the same or a lower layer. Laid out by hand
# (fmt: skip): one line per layer, or per small group of a layer, so that a line reads as a layer.
LAYER = {
    "errors": 0, "lockfile": 0, "progress": 0, "schema": 0, "yamlfile": 0,  # schema: Rule and the common ranges
    "paths": 0,  # local paths and gs:// URLs told apart, and the bucket operations
    "hosts": 0,  # what the hosts of one run wait on from each other, with deadlines; the shared-disk probe
    "staging": 0,  # a run in a bucket worked on in a local folder: its records staged, its checkpoints not
    "metrics_file": 0,  # a run's metrics.jsonl read back (train writes it, analyze reads it)
    "markdown": 0,  # the markdown tables of the reports and of `evaluate --table`
    "targets": 0,  # the accelerators a user rents, as data (catalogue), and their compile-only devices (compile_only)
    "train_config": 0,  # the recipe's train: and mesh: sections (the other sections are their packages' config.py)
    "models": 1,
    "evaluate": 2,  # metrics, tables and the one eval step and loop (runner), for data, objectives and train
    "data": 3,
    "objectives": 4,
    "recipe": 5, "checks": 5,  # they load and check the sections of models/, data/, objectives/ and train_config
    "run_recipe": 5,  # a run's recipe.yaml read as plain YAML, for the CLI's checks before jax (runs/ imports it)
    "runs": 6,
    "train": 7,
    # evaluation of a run's checkpoint (`ssmlm evaluate`): on the held-out batches train's parts build, by
    # decoding (phone book, SQuAD, infilling) and through the lm-eval adapter; training calls only the runner
    "checkpoint_eval": 8,
    "analyze": 8,
    "display": 8,  # what a command prints when it is done, and how numbers and tables read on a terminal
    "experiment": 9,  # arms × seeds of ordinary runs (train's drivers, `ssmlm evaluate`), intervals, plots
    "cli": 10, "__main__": 10,
}  # fmt: skip

# what no module of ssmlm.models may import, under TYPE_CHECKING included (a module, or a package and its modules)
MODELS_NEVER_IMPORT = ("ssmlm.recipe", "ssmlm.train", "ssmlm.train_config")


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


def node(module: str) -> str:
    """The top-level package of ``module`` under ssmlm/ (or the top-level module): "ssmlm.train.loop" -> "train"."""
    return module.removeprefix("ssmlm.").partition(".")[0]


def layer(module: str) -> int:
    """The layer of the package (or top-level module) that ``module`` is in."""
    key = node(module)
    assert key in LAYER, f"{module}: not in the layer table of tests/test_layering.py"
    return LAYER[key]


def packages(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph with every module collapsed to its top-level package: package -> the packages it imports."""
    out: dict[str, set[str]] = {}
    for a, bs in edges.items():
        if a != "ssmlm":
            out.setdefault(node(a), set()).update(node(b) for b in bs if node(b) != node(a))
    return out


def cycles(edges: dict[str, set[str]]) -> list[str]:
    """The cycles a depth-first walk of ``edges`` closes, each as "a -> b -> a" (none: the graph is acyclic)."""
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        for v in sorted(edges.get(u, ())):
            if state.get(v) == 1:
                found.append(" -> ".join(path[path.index(v) :] + [v]))
            elif v not in state:
                visit(v, path + [v])
        state[u] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    return found


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
    split = [k for k in LAYER if "." in k]
    assert not split, f"a package has one layer; LAYER names modules inside one: {split}"


def test_no_import_goes_up():
    edges = imports(modules())
    bad = [f"{a} -> {b}" for a, bs in edges.items() if a != "ssmlm" for b in bs if layer(b) > layer(a)]
    assert not bad, "imports against the layering: " + "; ".join(sorted(bad))


def test_models_never_import_the_training_config():
    """Families declare parameter groups; ssmlm.train.optim gives them the recipe's settings (models/rules.py)."""
    bad = models_importing_training(imports(modules(), type_checking=True))
    assert not bad, "models importing the recipe or training code: " + "; ".join(sorted(bad))


def test_no_import_cycles():
    found = cycles(imports(modules(), type_checking=True))  # a cycle through type hints is still one to a reader
    assert not found, "import cycles: " + "; ".join(found)


def test_no_package_cycles():
    """Modules collapsed to their top-level packages: no package imports one that imports it back, even through
    others (the module graph can be acyclic while its packages are not). A failure names each cycle and, for each
    of its steps, one module import that makes it."""
    edges = imports(modules(), type_checking=True)
    found = cycles(packages(edges))
    steps = {(node(a), node(b)): f"{a} -> {b}" for a, bs in sorted(edges.items()) for b in sorted(bs)}
    named = [c + " (" + "; ".join(steps[p, q] for p, q in pairwise(c.split(" -> "))) + ")" for c in found]
    assert not found, "package import cycles: " + " | ".join(named)


def test_the_developing_guide_shows_this_table():
    """docs/developing.md's table of layers (a line per layer, top first) names what LAYER does, each at its layer."""
    text = (ROOT.parent / "docs" / "developing.md").read_text()
    table = text.split("layer  imports only from the lines below it (and its own)\n")[1].split("```")[0]
    shown: dict[str, int] = {}
    n = None
    for line in table.splitlines():
        first, _, rest = line.strip().partition(" ")
        if first.isdigit():
            n, line = int(first), rest
        for name in line.split(","):
            if name.strip():
                shown[name.strip().removesuffix("/").removesuffix(".py")] = n
    assert shown == LAYER


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
    assert cycles(edges) == ["ssmlm.models.x -> ssmlm.train.loop -> ssmlm.models.x"]
    # a module's layer is its package's: the sections' schemas sit below recipe and checks, which load them
    assert layer("ssmlm.train_config") < layer("ssmlm.recipe") == layer("ssmlm.checks") < layer("ssmlm.train.optim")
    assert layer("ssmlm.models.config") == layer("ssmlm.models.bigs") < layer("ssmlm.recipe")
    # the training loop evaluates through evaluate's runner; evaluating a run's checkpoint sits above training
    assert layer("ssmlm.evaluate.runner") < layer("ssmlm.train.loop") < layer("ssmlm.checkpoint_eval.run")
    # modules with no cycle among them can still make one among their packages
    package_cycle = {"ssmlm.a.x": {"ssmlm.b.y"}, "ssmlm.b.y": set(), "ssmlm.b.z": {"ssmlm.a.w"}, "ssmlm.a.w": set()}
    assert cycles(package_cycle) == [] and cycles(packages(package_cycle)) == ["a -> b -> a"]
    # the models rule sees type-hint-only imports (the layer rule skips them), `from ssmlm import recipe` included
    mods = {
        "ssmlm.models.y": tmp_path / "y.py",
        "ssmlm.recipe": tmp_path / "recipe.py",
        "ssmlm.train_config": tmp_path / "config.py",
    }
    (tmp_path / "y.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ssmlm.train_config import TrainConfig\n"
        "    from ssmlm import recipe\n"
    )
    (tmp_path / "recipe.py").write_text("")
    (tmp_path / "config.py").write_text("")
    assert imports(mods)["ssmlm.models.y"] == set()
    assert sorted(models_importing_training(imports(mods, type_checking=True))) == [
        "ssmlm.models.y -> ssmlm.recipe",
        "ssmlm.models.y -> ssmlm.train_config",
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
