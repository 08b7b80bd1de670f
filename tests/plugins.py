"""A plug-in added the way docs/developing.md says, through the registries as shipped: a copy of the package
ssmlm (and the shipped recipes) with the plug-in's module written into it and its registration line added to
the registry, run as `python -m ssmlm` in a subprocess whose PYTHONPATH puts the copy first."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ssmlm"


def plug_in(tmp_path: Path, files: dict[str, str], lines: dict[str, tuple[str, str]]) -> Path:
    """A copy of ssmlm under tmp_path/pkg with ``files`` (path in the package -> text) written and, per
    ``lines`` (path in the package -> (the line opening a registry, the entry)), the entry added as that
    registry's first. Returns the folder to put on PYTHONPATH."""
    root = tmp_path / "pkg"
    shutil.copytree(PACKAGE, root / "ssmlm")
    shutil.copytree(PACKAGE.parent / "recipes", root / "recipes")  # the shipped recipes, beside the package
    for path, text in files.items():
        (root / "ssmlm" / path).write_text(textwrap.dedent(text))
    for path, (opening, entry) in lines.items():
        module = root / "ssmlm" / path
        source = module.read_text()
        assert source.count(f"\n{opening}\n") == 1, (path, opening)
        module.write_text(source.replace(f"\n{opening}\n", f"\n{opening}\n    {entry}\n"))
    return root


def ssmlm(root: Path, *args, code: int | None = 0, env: dict | None = None, cwd: Path | None = None) -> str:
    """`python -m ssmlm ARGS` with the copy at ``root`` first on the path; its output (stdout, then stderr),
    after checking the exit status is ``code`` (None: any)."""
    return python(root, "-m", "ssmlm", *args, code=code, env=env, cwd=cwd)


def python(root: Path, *args, code: int | None = 0, env: dict | None = None, cwd: Path | None = None) -> str:
    """`python ARGS` with the copy at ``root`` first on the path, in ``cwd`` (default: the folder above ``root``;
    never the repository, whose ssmlm `python -m` would put first)."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200", **(env or {})}
    cwd = cwd or root.parent
    done = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd)
    out = done.stdout + done.stderr
    if code is not None:
        assert done.returncode == code, f"{' '.join(map(str, args))} exited {done.returncode}:\n{out}"
    return out
