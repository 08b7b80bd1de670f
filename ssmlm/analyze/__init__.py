"""Analyses of trained runs: one module per paper figure or table, each an `ssmlm analyze NAME` command.

The registry is this package: a module that defines ``command`` (a typer command function whose parameters
are its options; its docstring is the help, naming the figure it reproduces; it returns its result, a dict the
CLI prints as tables, or as JSON with ``--json``) is registered under its ``NAME``. Adding an analysis is adding a
file. Shared plotting lives in plots.py. The CLI imports every analysis module to build its commands, so a module
imports numpy, jax or matplotlib inside its functions, never at the top (`ssmlm --help` and recipe errors stay
instant).

May import anything below it (models, data, objectives, runs, train, evaluate); only cli imports it.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def registry() -> dict[str, ModuleType]:
    """NAME -> module, for every analysis module of this package."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if callable(getattr(module, "command", None)):
            found[getattr(module, "NAME", info.name)] = module
    return found
