"""The documentation: the site's generated references (docs/hooks/gen_reference.py) cover the code — every typer
command with every option, every field of the recipe's config dataclasses with its range — and the README's links
resolve. The generator is called directly; mkdocs itself is not needed (.ci/run builds the site with --strict)."""

import dataclasses
import importlib.util
import re
import typing
from pathlib import Path

import pytest
import typer
from conftest import invoke

from ssmlm.checks import FIELDS
from ssmlm.cli import app
from ssmlm.models.config import FAMILIES, config_class
from ssmlm.recipe import Recipe

HOOK = Path(__file__).resolve().parent.parent / "docs" / "hooks" / "gen_reference.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_reference", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(cmd, path="ssmlm"):
    """(full name, command) of the app and every command and group below it."""
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}")


def test_cli_reference_lists_every_command_and_option(gen):
    page = gen.cli_reference()
    commands = list(_commands(typer.main.get_command(app)))
    assert len(commands) > 20  # the walk found the analyze group's commands too
    for path, cmd in commands:
        assert f"## `{path}`\n" in page, f"{path} missing from the CLI reference"
        section = page.split(f"## `{path}`\n", 1)[1].split("\n## ", 1)[0]
        names = [row.split("|")[1] for row in section.splitlines() if row.startswith("| `")]  # the tables' names
        for param in cmd.params:
            for opt in [*param.opts, *param.secondary_opts]:
                if opt != "--help":
                    assert any(opt in n for n in names), f"{path}: {opt} missing from its table in the CLI reference"


def _dataclass_fields(cls, prefix: str):
    """Dotted keys of every field of ``cls`` and of the sections (and lists of sections) it holds."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is list and typing.get_args(tp) else None
        if dataclasses.is_dataclass(tp):
            yield from _dataclass_fields(tp, key)
        elif item is not None and dataclasses.is_dataclass(item):
            yield key
            yield from _dataclass_fields(item, key + "[]")
        else:
            yield key


def test_recipe_reference_lists_every_field_with_its_range(gen):
    page = gen.recipe_reference()
    keys = set(_dataclass_fields(Recipe, ""))
    for arch in FAMILIES:  # each family's own model fields
        keys |= set(_dataclass_fields(config_class(arch), "model"))
    assert {"train.steps", "model.state_size", "objective.controller.top_n", "train.param_rules[].pattern"} <= keys
    assert keys == set(gen.recipe_fields())
    for key in keys:
        assert "{#" + key.replace("[]", "") + "}" in page, f"{key} missing from the recipe reference"
    for key, rule in FIELDS.items():  # every range a recipe is checked against is stated
        row = next(ln for ln in page.splitlines() if "{#" + key.replace("[]", "") + "}" in ln)
        assert gen._cell(gen._escape(rule.expected)) in row, f"{key}: its range is not in its row"


def _anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown file's headings (GitHub's and mkdocs' slug for the headings used here)."""
    anchors = set()
    for heading in re.findall(r"^#+ (.*)$", markdown, re.M):
        heading = re.sub(r"\{#.*\}", "", heading).replace("`", "")
        anchors.add(re.sub(r"[^\w\s-]", "", heading).strip().lower().replace(" ", "-"))
    return anchors


def test_readme_links_resolve():
    """The README is not part of the site's strict build: its relative links and anchors are checked here."""
    root = HOOK.parent.parent.parent
    readme = (root / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert len(links) > 10
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = root / (path or "README.md")
        assert target.exists(), f"README links to {link}: no such file"
        if anchor:
            assert anchor in _anchors(target.read_text()), f"README links to {link}: no such heading"


def test_the_finetuning_guides_experiment_file_loads_as_written(tmp_path, monkeypatch):
    """The guide's local-task experiment file, copied as a user would, is a valid experiment (every arm's recipes
    loaded with their overrides) once its files exist."""

    from ssmlm.experiment.spec import load_experiment

    guide = (HOOK.parent.parent / "guides" / "finetuning.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", guide, re.S) if b.startswith("# polarity.yaml"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "book.txt").write_text("It was a truth universally acknowledged.\n")
    for split in ("train", "test"):
        (tmp_path / f"polarity-{split}.csv").write_text("sentence,label\na fine day,1\na dull day,-1\n")
    (tmp_path / "polarity.yaml").write_text(block)
    exp = load_experiment(tmp_path / "polarity.yaml")
    assert exp.reference == "random" and exp.arms["random"]["finetune"].init == "random"
    assert exp.arms["pretrained"]["finetune"].task == "polarity"
    r = invoke("experiment", "polarity.yaml", "--dry-run", code=None)
    assert r.exit_code == 0 and "random" in r.output, r.output


def test_help_keeps_square_brackets_that_rich_would_read_as_styles(gen):
    """Rich markup reads `[tpu]` as a style tag and drops it, so `pip install 'ssmlm[tpu]'` printed as
    'ssmlm'. Every bracketed span in any help text is shown as written at 80 columns, and the CLI reference
    (docs) shows it without rich's escape."""
    seen = set()
    for path, cmd in _commands(typer.main.get_command(app)):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        spans = {m.group().replace("\\[", "[") for t in texts for m in re.finditer(r"\\?\[[^\]\s]*\]", t)}
        if not spans:
            continue
        out = invoke(*path.split()[1:], "--help", env={"COLUMNS": "80"}).output
        for span in spans:
            assert span in out, (path, span, out)
        seen |= spans
    assert {"[tpu]", "[gpu-aot]"} <= seen  # the walk reached the --target help
    out = invoke("pretrain", "--help", env={"COLUMNS": "80"}).output
    assert "'ssmlm[tpu]'" in out and "'ssmlm[gpu-aot]'" in out, out
    assert "ssmlm\\[tpu\\]" in gen.cli_reference()  # Markdown's escape only
