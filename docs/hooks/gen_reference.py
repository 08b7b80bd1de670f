"""mkdocs hook: the CLI reference and the recipe-field reference, generated from the code at every build.

The CLI page walks the typer app of ssmlm.cli through Click's own introspection (each command's help, usage
and options, as `ssmlm COMMAND --help` prints them). The recipe page walks the config dataclasses that
ssmlm.recipe re-exports: each field's type, default and allowed values (Literal choices, and the range tables
that ssmlm.checks assembles), and its documentation, taken from the comments beside the field in its config.py.
In the repository each page is a placeholder that says how to read it (docs/reference/*.md); ``on_files`` puts
the generated page in its place at every build, so the site's pages cannot drift from the code.

tests/test_docs.py calls cli_reference() and recipe_reference() directly (no mkdocs needed).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import re
import textwrap
import tokenize
import types
import typing
from typing import Any, Literal

CLI_PAGE = "reference/cli.md"
RECIPE_PAGE = "reference/recipe.md"


def on_files(files, config):
    """Replace the placeholder pages (docs/reference/*.md, which say how to read the generated ones) with the
    generated pages."""
    from mkdocs.structure.files import File

    for uri, make in ((CLI_PAGE, cli_reference), (RECIPE_PAGE, recipe_reference)):
        if (placeholder := files.get_file_from_path(uri)) is not None:
            files.remove(placeholder)
        files.append(File.generated(config, uri, content=make()))
    return files


# ----------------------------------------------------------------------------- markdown helpers


def _escape(text: str) -> str:
    """Plain text as Markdown: characters Markdown would read as markup are escaped, code spans kept."""
    text = text.replace("\\[", "[")  # rich's escape in help text (see ssmlm/cli.py), not the reader's
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a code span, as written
            out.append(part)
        else:
            part = re.sub(r"([\\*_\[\]#])", r"\\\1", part)
            out.append(part.replace("<", "&lt;").replace(">", "&gt;"))
    return "".join(out)


def _cell(text: str) -> str:
    """Text for a table cell: one line, pipes escaped (also inside code spans, which tables split on)."""
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the CLI


def _cli_root():
    import typer

    from ssmlm.cli import app

    return typer.main.get_command(app)


def cli_commands() -> list[tuple[str, Any, Any]]:
    """(full name, Click command, its context) for every command and group of the app, in the app's order."""
    root = _cli_root()
    found = []

    def walk(cmd, ctx, path):
        found.append((path, cmd, ctx))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, sub.context_class(sub, info_name=name, parent=ctx), f"{path} {name}")

    walk(root, root.context_class(root, info_name="ssmlm"), "ssmlm")
    return found


def _help_markdown(text: str) -> str:
    """A command's help text: paragraphs as text, its 'Example:' lines as one shell block."""
    prose, examples = [], []
    for para in inspect.cleandoc(text or "").split("\n\n"):
        lines = para.splitlines()
        for line in lines:
            if line.strip().startswith("Example:"):
                examples.append(line.strip().removeprefix("Example:").strip())
        rest = [ln for ln in lines if not ln.strip().startswith("Example:")]
        if rest:
            prose.append(_escape(" ".join(ln.strip() for ln in rest)))
    out = "\n\n".join(prose)
    if examples:
        out += "\n\n" + ("Example:" if len(examples) == 1 else "Examples:")
        out += "\n\n```bash\n" + "\n".join(examples) + "\n```"
    return out


def _first_sentence(text: str) -> str:
    first = inspect.cleandoc(text or "").split("\n\n")[0]
    return " ".join(first.split())


def _options_table(cmd, ctx) -> str:
    rows = []
    for param in cmd.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or param.name == "help":
            continue
        names, help_text = record
        kind = "argument" if param.param_type_name == "argument" else "option"
        rows.append([f"`{names}`", kind, _escape(help_text)])
    return _table(["name", "kind", "what"], rows) if rows else "No options besides `--help`."


def cli_reference() -> str:
    """The CLI reference page (Markdown)."""
    commands = cli_commands()
    lines = [
        "# CLI reference",
        "",
        "Generated from the typer app in `ssmlm/cli.py` when the site is built: the same help, usage and "
        "options as `ssmlm COMMAND --help` prints. Every command answers `--help` at once (heavy libraries "
        "load only inside commands); a mistake on the command line is one `error:` line and exit status 2.",
    ]
    for path, cmd, ctx in commands:
        lines += ["", f"## `{path}`", "", _help_markdown(cmd.help), "", "```text", cmd.get_usage(ctx), "```", ""]
        if getattr(cmd, "commands", None):
            subs = [[f"[`{path} {n}`](#{_slug(f'{path} {n}')})", _escape(_first_sentence(s.help))]
                    for n, s in cmd.commands.items()]  # fmt: skip
            lines.append(_table(["command", "what it does"], subs))
        else:
            lines.append(_options_table(cmd, ctx))
    return "\n".join(lines) + "\n"


def _slug(heading: str) -> str:
    """The anchor mkdocs' toc gives a heading (its default slugify, for the names used here)."""
    return re.sub(r"[^\w\s-]", "", heading).strip().lower().replace(" ", "-")


# ----------------------------------------------------------------------------- recipe fields


@functools.cache
def _comments_of(cls: type) -> dict[str, str]:
    """field name -> the comments written beside it in ``cls``'s own source: full-line comments directly above
    the field, then those on its own lines."""
    src = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, tuple[str, bool]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not text.startswith(("fmt:", "noqa", "type:")):
                comments[tok.start[0]] = (text, tok.line.strip().startswith("#"))
    docs = {}
    for node in ast.parse(src).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, ln = [], node.lineno - 1
        while ln in comments and comments[ln][1]:
            above.insert(0, comments[ln][0])
            ln -= 1
        beside = [comments[i][0] for i in range(node.lineno, node.end_lineno + 1) if i in comments]
        docs[node.target.id] = " — ".join(p for p in (" ".join(above), " ".join(beside)) if p)
    return docs


def field_doc(cls: type, name: str) -> str:
    """The comments beside field ``name`` in the class (of ``cls``'s bases) that declares it."""
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}):
            return _comments_of(klass).get(name, "")
    return ""


def _type_name(tp, in_union: bool = False) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:  # alone: a string of given values; beside other types: those values
        return " or ".join(map(_yaml, args)) if in_union else "string"
    if origin in (typing.Union, types.UnionType):  # values of a Literal only beside another type (bool | 'auto')
        other = any(a is not type(None) and typing.get_origin(a) is not Literal for a in args)
        return " or ".join(_type_name(a, in_union=other) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0]) if args else 'values'}"
    if dataclasses.is_dataclass(tp):
        return "section"
    return {int: "int", float: "float", bool: "bool", str: "string"}.get(tp, getattr(tp, "__name__", str(tp)))


def _choices(tp) -> list:
    """The values a field with Literal choices allows (through Optional and unions: bool | 'auto' gives all
    three)."""
    if typing.get_origin(tp) is Literal:
        return list(typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        literal = [c for a in args for c in _choices(a)]
        return ([True, False] if literal and bool in args else []) + literal
    return []


def _yaml(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return str(value)


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(section)"
    return f"`{_yaml(value)}`" if value != "" else '`""`'


def _nested(tp) -> tuple[type | None, bool]:
    """The dataclass a field holds (a subsection), and whether it is a list of them."""
    if dataclasses.is_dataclass(tp):
        return tp, False
    if typing.get_origin(tp) is list and typing.get_args(tp) and dataclasses.is_dataclass(typing.get_args(tp)[0]):
        return typing.get_args(tp)[0], True
    return None, False


class Section(typing.NamedTuple):
    """One table of the recipe page: the dotted prefix of its fields, a heading, the dataclass, the fields."""

    prefix: str
    title: str
    cls: type
    names: list[str]
    level: int = 2


def recipe_sections() -> list[Section]:
    """Every section and subsection of a recipe, in the order of the Recipe dataclass."""
    from ssmlm.models.config import ModelConfig, all_config_classes
    from ssmlm.recipe import Recipe

    out = [Section("", "top level", Recipe, _scalar_fields(Recipe))]
    for f in dataclasses.fields(Recipe):
        cls = typing.get_type_hints(Recipe)[f.name]
        if not dataclasses.is_dataclass(cls):
            continue
        out.append(Section(f.name, f.name, cls, _scalar_fields(cls)))
        if cls is ModelConfig:  # each family adds its own fields (model.arch picks the family)
            shared = {g.name for g in dataclasses.fields(ModelConfig)} - {"arch"}
            for family in all_config_classes():
                archs = ", ".join(_choices(typing.get_type_hints(family)["arch"]))
                own = [g.name for g in dataclasses.fields(family) if g.name not in shared]
                out.append(Section("model", f"model.arch: {archs} ({family.__name__})", family, own, level=3))
        for g in dataclasses.fields(cls):
            sub, is_list = _nested(typing.get_type_hints(cls)[g.name])
            if sub is not None:
                key = f"{f.name}.{g.name}" + ("[]" if is_list else "")
                out.append(Section(key, key, sub, _scalar_fields(sub)))
    return out


def _scalar_fields(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(hints[f.name])]


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _field_rows(sec: Section) -> list[list[str]]:
    from ssmlm.checks import FIELDS

    cls = sec.cls
    hints, fields = typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}
    rows = []
    for name in sec.names:
        key = _key(sec.prefix, name)
        tp = hints[name]
        allowed = []
        choices = _choices(tp) or (list(_families()) if key == "model.arch" else [])
        if choices:
            allowed.append("one of " + ", ".join(f"`{_yaml(c)}`" for c in choices))
        elif typing.get_origin(tp) is list and (items := _choices(typing.get_args(tp)[0])):
            allowed.append("each one of " + ", ".join(f"`{_yaml(c)}`" for c in items))
        if key in FIELDS:
            allowed.append(_escape(FIELDS[key].expected))
        sub, is_list = _nested(tp)
        doc = _escape_doc(field_doc(cls, name))
        if sub is not None:
            sub_key = key + ("[]" if is_list else "")
            doc = (doc + " " if doc else "") + f"Its fields: [`{sub_key}`](#{_anchor(sub_key)})."
        # the short name, with the dotted key as its anchor: reference/recipe.md#train.steps
        rows.append([f"`{name}`{{#{key.replace('[]', '')}}}", _escape(_type_name(tp)), _default(fields[name]),
                     "; ".join(allowed), doc])  # fmt: skip
    return rows


def _families() -> dict[str, str]:
    from ssmlm.models.config import FAMILIES

    return FAMILIES


def _escape_doc(text: str) -> str:
    """A field's comment as Markdown: code spans kept, other markup characters escaped."""
    return _escape(text.replace("``", "`"))


def _anchor(key: str) -> str:
    return "field-" + re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def recipe_fields() -> list[str]:
    """Every dotted field the reference lists (tests/test_docs.py compares it with the dataclasses)."""
    return [_key(sec.prefix, n) for sec in recipe_sections() for n in sec.names]


def _class_doc(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(cls.__name__ + "("):  # dataclasses' generated signature, not a description
        return ""
    return _escape_doc(" ".join(doc.split()))


def _relations_table() -> str:
    from ssmlm.checks import RELATIONS
    from ssmlm.recipe import Recipe

    default = Recipe()
    rows = []
    for rel in RELATIONS:
        try:
            expected = _escape(rel.expected(default))
        except Exception:  # a rule worded from values the default recipe does not have
            expected = "(see `RELATIONS` in `ssmlm/checks.py`)"
        rows.append([", ".join(f"`{k}`" for k in rel.keys), expected])
    return _table(["fields (the message names the first)", "expected (as worded for the default recipe)"], rows)


def recipe_reference() -> str:
    """The recipe-field reference page (Markdown)."""
    lines = [
        "# Recipe fields",
        "",
        "Generated from the config dataclasses (`ssmlm/recipe.py` re-exports them from `ssmlm/models/config.py`, "
        "`ssmlm/data/config.py`, `ssmlm/objectives/config.py` and `ssmlm/train_config.py`) and the range tables "
        "that `ssmlm/checks.py` assembles, when the site is built. *What* is the comment beside the field in its "
        "config.py; *allowed* is what a recipe is checked against before anything is read, built or written "
        "(a value outside it is one `error:` line naming the file or `--set`, the key and this text).",
        "",
        "A recipe is a YAML file of these sections; `base: other.yaml` (or a shipped recipe's name) inherits "
        "another recipe, and `--set section.field=value` overrides any field on the command line, e.g. "
        "`--set train.steps=100 --set 'train.param_rules=[{pattern: \"^encoder/embeddings/\", lr_multiplier: 0}]'`. "
        "`null` means derive the value (the message in *what* says from where).",
    ]
    for sec in recipe_sections():
        anchor = f" {{#{_anchor(sec.prefix or 'top')}}}" if sec.level == 2 else ""
        lines += ["", "#" * sec.level + f" {_escape(sec.title)}{anchor}", ""]
        if doc := _class_doc(sec.cls):
            lines += [doc, ""]
        lines.append(_table(["field", "type", "default", "allowed", "what"], _field_rows(sec)))
    lines += [
        "",
        "## Rules between fields {#field-relations}",
        "",
        "Checked after the ranges, also before anything is read or written (`RELATIONS` in `ssmlm/checks.py`).",
        "",
        _relations_table(),
    ]
    return "\n".join(lines) + "\n"
