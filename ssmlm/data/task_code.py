"""Whether a folder of lm-eval task YAMLs holds code, found by reading the YAML text before lm-eval sees it.

lm-eval runs Python that a task YAML names: a ``!function utils.process_docs`` tag imports ``utils.py`` beside the
YAML (or any importable module) and calls the function, and ``class: !function …`` builds the task from Python
(lm_eval/tasks/_yaml_loader.py). Its Jinja prompt templates render in an unsandboxed ``jinja2.Environment``
(lm_eval/utils.py), where attribute access such as ``{{ x.__class__ }}`` reaches Python's internals; Jinja's own
sandbox refuses exactly those attributes (a name starting with "_", jinja2.sandbox.is_safe_attribute). A task
folder is therefore code unless its YAMLs have none of these, which is checked here on the text of every
``*.yaml`` lm-eval would index under the folder and of every file they ``include:``, so that nothing of the
folder is imported first. Like Hugging Face's ``trust_remote_code``, running it is the user's explicit choice.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ssmlm.errors import UserError

# what lm-eval turns into Python, and why, as the refusal names it
CODE = (
    (re.compile(r"!function\b"), "a !function tag (lm-eval imports and runs the Python it names)"),
    (re.compile(r"!!?python/"), "a python/ YAML tag (it names Python to run)"),
    (
        re.compile(r"(\{\{|\{%)[^}%]*?(\.\s*_|\[\s*['\"]_|\|\s*attr\b)"),
        "a Jinja template reading an attribute starting with _ (lm-eval's Jinja is not sandboxed)",
    ),
)
SKIPPED = {"__pycache__", ".ipynb_checkpoints"}  # folders lm-eval's task index skips


class _Tolerant(yaml.SafeLoader):
    """Reads a task YAML's keys without building what its tags name (to follow ``include:`` only)."""


_Tolerant.add_multi_constructor("", lambda loader, suffix, node: None)


def _includes(path: Path, text: str) -> list[Path]:
    try:
        cfg = yaml.load(text, Loader=_Tolerant)  # noqa: S506 (a SafeLoader whose tags build nothing)
    except yaml.YAMLError:
        return []  # lm-eval skips a YAML it cannot read; its text was scanned all the same
    inc = cfg.get("include") if isinstance(cfg, dict) else None
    names = inc if isinstance(inc, list) else [inc] if inc else []
    return [path.parent / str(n) for n in names if isinstance(n, str)]


def task_code(folder: str | Path) -> tuple[Path, int, str] | None:
    """The first place where the task YAMLs under ``folder`` (or the YAML file ``folder``), and those they include,
    name code to run: (file, line, what); None when they name none."""
    root = Path(folder).expanduser()
    todo = [root] if root.is_file() else sorted(p for p in root.glob("**/*.yaml") if not SKIPPED & set(p.parts))
    seen: set[Path] = set()
    while todo:
        path = todo.pop(0)
        if path.resolve() in seen or not path.is_file():
            continue
        seen.add(path.resolve())
        text = path.read_text(encoding="utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("#"):
                continue
            for pattern, what in CODE:
                if pattern.search(line):
                    return path, n, what
        todo.extend(_includes(path, text))
    return None


def check_task_folder(folder: str | Path | None, trusted: bool, option: str = "--data-dir") -> None:
    """Refuse a task folder (or YAML file) whose YAMLs name code, unless the user said to trust it
    (``--trust-task-code``)."""
    if folder is None or trusted or not Path(folder).expanduser().exists():
        return
    found = task_code(folder)
    if found:
        path, line, what = found
        raise UserError(
            f"{path}: line {line}: {what}; {option} {folder} holds task code, which runs inside ssmlm: read it, "
            "then pass --trust-task-code to run it"
        )
