"""A name with a leading underscore is its module's own: no module of ssmlm imports one from another module, or
reaches one through an imported module (``plots._plt()``). What other modules use is public, named for what it is."""

from __future__ import annotations

import ast

from tests.test_layering import modules


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")  # dunders (__version__) are public


def private_uses(module: str, tree: ast.AST, mods: set[str]) -> list[str]:
    """The private names ``module`` takes from other ssmlm modules: ``from ssmlm.x import _y`` and ``x._y`` where
    ``x`` is bound to an ssmlm module by an import."""
    found, bound = [], {}  # bound: local name -> the ssmlm module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("ssmlm"):
            for a in node.names:
                if f"{node.module}.{a.name}" in mods:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
                elif private(a.name) and node.module != module:
                    found.append(f"{module}: from {node.module} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("ssmlm.") and a.asname:
                    bound[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and private(node.attr):
            other = bound.get(node.value.id)
            if other and other != module:
                found.append(f"{module}: {node.value.id}.{node.attr} ({other})")
    return found


def test_no_module_uses_another_modules_private_names():
    mods = modules()
    bad = [use for m, p in sorted(mods.items()) for use in private_uses(m, ast.parse(p.read_text()), set(mods))]
    assert not bad, "private names used across modules (make them public): " + "; ".join(bad)


def test_the_rule_catches_a_private_import():
    mods = {"ssmlm.analyze.plots", "ssmlm.analyze.kernels"}
    code = "from ssmlm.analyze.plots import _plt, save\nfrom ssmlm.analyze import plots\ndef f():\n    plots._plt()\n"
    assert private_uses("ssmlm.analyze.kernels", ast.parse(code), mods) == [
        "ssmlm.analyze.kernels: from ssmlm.analyze.plots import _plt",
        "ssmlm.analyze.kernels: plots._plt (ssmlm.analyze.plots)",
    ]
    assert private_uses("ssmlm.analyze.kernels", ast.parse("from ssmlm import __version__\n"), mods) == []
