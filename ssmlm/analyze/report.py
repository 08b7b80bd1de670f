"""`analyze report`: one self-contained HTML page that reads top to bottom as an account of one or more runs.

With several runs the page opens with a table comparing them and the figures that need several runs (BiGS
Figure 5, Birdie Figure 1 with one line per run: each analysis module's ``for_report_runs(runs, out_dir)``).
Then, per run, in this order (each part a heading with ``data-part``):

  summary      what was trained (family, size in parameters, recipe, objective or task), on what data, for how
               long (steps, tokens, wall time), the headline numbers and the loss curve
  training     throughput and learning rate against step
  objectives   a language model's validation loss per objective class and configuration, by name
               (ssmlm.analyze.objective_losses), and Birdie's mixture (the modules with REPORT_PART =
               "objectives"); only for runs that logged them
  evaluation   every evaluation the run holds (RUN/eval/*.json: the numeric entries of its ``metrics``)
  analyses     every analysis of the registry that applies: each module's ``for_report(run, out_dir)`` returns
               {"title", "figure", "images", "data", "numbers", "table", "note", "too_few"} or None (does not
               apply); the ones that do not apply are listed; one that fails shows its error line and the page
               goes on. "table" ({"columns", "rows"}), when given, is shown instead of the "numbers" (name:
               value) table; "too_few" (why its numbers rest on too few items to read) greys the block and folds
               its figures away under that line; a module with REPORT_ACROSS_RUNS_ONLY is drawn across runs only
  recipe       the resolved recipe.yaml (collapsed)

No table has more than MAX_ROWS rows (the rest are in the linked CSV). Self-contained: CSS inline and every image
embedded as a base64 data URI (its file named in ``data-file``), so the one file can be mailed or archived; the
files behind it stay in the output directory and are linked relatively.

benchmarks/page_check.py opens a page in headless Chromium to check how a browser lays it out.
"""

from __future__ import annotations

import base64
import html
import json
import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks

NAME = "report"
FIGURE = "an account of each run"
MIME = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
PARTS = ("summary", "training", "objectives", "evaluation", "analyses", "recipe")  # a run's parts, in page order
MAX_ROWS = 30  # rows of any one table on the page


def command(
    ckpt: Annotated[list[str], typer.Option("--ckpt", metavar="RUN", help="Run directory (repeat for more runs).")],
    out: Annotated[
        str | None,
        typer.Option("--out", metavar="DIR", help="Output directory of index.html (default: FIRST_RUN/analysis)."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
):
    """Write one self-contained HTML page for one or more runs: an account of each run (summary, training,
    objectives, evaluations, every analysis that applies, the recipe).

    Per run: what was trained, on what data and for how long, the headline numbers and the loss curve first;
    then throughput, a language model's loss per objective configuration, the evaluation results (RUN/eval/*.json)
    and every analysis that applies to it. With several runs the page starts with a table comparing them and the
    figures that need several runs (BiGS Figure 5); each run's files go to DIR/RUN_NAME. Images are embedded,
    so index.html stands alone.
    Example: ssmlm analyze report --ckpt runs/gmlp_base --ckpt runs/bigs_128
    """
    for c in ckpt:
        checks.run_dir(c, "--ckpt")
    result = build_report([Path(c) for c in ckpt], Path(out) if out else Path(ckpt[0]) / "analysis", quiet=quiet)
    return result  # printed by the CLI: tables, or JSON with --json


# ----------------------------------------------------------------------------- the page


def build_report(run_dirs: list[Path], out_dir: Path, quiet: bool = True) -> dict:
    """Write out_dir/index.html for the runs; one run's files go to out_dir, several runs' to out_dir/NAME."""
    from ssmlm.analyze import registry
    from ssmlm.progress import progress_bar
    from ssmlm.runs import open_run

    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [open_run(d) for d in run_dirs]
    names = _unique_names(run_dirs)
    analyses = {k: m for k, m in registry().items() if m is not sys.modules[__name__]}
    across = {k: m for k, m in analyses.items() if callable(getattr(m, "for_report_runs", None))}
    total = len(runs) * (4 + len(analyses)) + (len(across) if len(runs) > 1 else 0)
    with progress_bar(quiet) as bar:
        task = bar.add_task("report", total=total)

        def step(label: str) -> None:  # a part is about to be built: say which
            bar.update(task, description=f"report: {label}")

        def done() -> None:
            bar.advance(task)

        progress = (step, done)
        top, across_info = _overview(runs, names, across, out_dir, progress) if len(runs) > 1 else ("", {})
        sections, summary = [], []
        for i, (run, name) in enumerate(zip(runs, names, strict=True)):
            run_out = out_dir if len(runs) == 1 else out_dir / name
            run_out.mkdir(parents=True, exist_ok=True)
            body, info = _run_section(run, name, f"run-{i}", run_out, out_dir, analyses, progress, len(runs))
            sections.append(body)
            summary.append({"run": str(run.dir), **info})
    page = out_dir / "index.html"
    nav = "".join(f'<li><a href="#run-{i}">{_e(n)}</a></li>' for i, n in enumerate(names))
    page.write_text(
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>ssmlm report: {_e(', '.join(names))}</title><style>{CSS}</style></head><body>"
        f"<h1>ssmlm report: {_e(', '.join(names))}</h1><p class='meta'>written "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by ssmlm {_version()}</p>"
        + (f"<ul class='nav'>{nav}</ul>" if len(names) > 1 else "")
        + top
        + "".join(sections)
        + "</body></html>\n",
        encoding="utf-8",
    )
    return {"page": str(page), "runs": summary, **({"across_runs": across_info} if across_info else {})}


def _overview(runs, names, across: dict, out_dir: Path, progress) -> tuple[str, dict]:
    """The top of a page of several runs: one row per run, then the figures that need several runs."""
    from ssmlm.analyze.run_summary import facts, family_name, human

    step, done = progress
    rows = []
    for run, name in zip(runs, names, strict=True):
        f = facts(run)
        loss = next((v for k, v in f["headline"] if k.startswith("training loss")), None)
        arch = run.recipe.model.arch
        model = family_name(arch) + (f", {human(f['params']['total'])} parameters" if f["params"] else "")
        rows.append(
            [
                name,
                model,
                f.get("objective") or f.get("task"),
                f["steps"],
                f["tokens"].split(" (")[0],
                f.get("wall time", "–"),
                round(loss, 4) if loss is not None else "–",
            ]
        )
    parts = [
        "<section id='runs'><h2 data-part='runs'>Runs compared</h2>",
        _grid(["run", "model", "objective / task", "steps", "tokens", "wall time", "final training loss"], rows),
    ]
    blocks, info = [], {}
    for key, module in across.items():
        step(f"across runs: {key}")
        try:
            result = module.for_report_runs(runs, out_dir / "across")
            if result is not None:
                blocks.append(_analysis_block(key, result, out_dir))
                info[key] = [str(p) for p in result.get("images") or []]
        except Exception as e:  # one analysis failing must not sink the page
            info[key] = _error_line(e)
            blocks.append(f"<div class='analysis'><h4>{_e(key)}</h4><p class='error'>{_e(info[key])}</p></div>")
        done()
    if blocks:
        parts.append("<h3 data-part='across'>Across runs</h3>" + "".join(blocks))
    parts.append("</section>")
    return "".join(parts), info


def _part(anchor: str, key: str, title: str) -> str:
    return f"<h3 id='{anchor}-{key}' data-part='{key}'>{_e(title)}</h3>"


def _run_section(run, name: str, anchor: str, run_out: Path, page_dir: Path, analyses: dict, progress, runs: int):
    """One run's part of the page (``runs``: how many the page has), and what it found (for the printed summary)."""
    step, done = progress
    parts = [f"<section class='run' id='{anchor}'><h2>{_e(name)}</h2><p class='meta'>{_e(str(run.dir))}</p>"]
    step(f"{name}: summary")
    parts.append(_part(anchor, "summary", "Summary") + _guard("summary", lambda: _summary(run, run_out)))
    done()
    step(f"{name}: training curves")
    parts.append(_part(anchor, "training", "Training") + _guard("training curves", lambda: _training(run, run_out)))
    done()
    applied, not_applicable, no_hook, several, errors = {}, [], [], [], {}
    hooked = {"objectives": [], "analyses": []}
    step(f"{name}: objective losses")
    objectives = _guard("objective losses", lambda: _objective_losses(run, run_out, page_dir))
    done()
    for key, module in analyses.items():
        hook = getattr(module, "for_report", None)
        if hook is None or getattr(module, "REPORT_ACROSS_RUNS_ONLY", False):
            (several if hasattr(module, "for_report_runs") else no_hook).append(key)
            done()
            continue
        step(f"{name}: {key}")
        try:
            result = hook(run, run_out)
            if result is None:
                not_applicable.append(key)
            else:
                hooked[getattr(module, "REPORT_PART", "analyses")].append(_analysis_block(key, result, page_dir))
                applied[key] = [str(p) for p in result.get("images") or []]
        except Exception as e:  # one analysis failing must not sink the page
            errors[key] = _error_line(e)
            block = f"<div class='analysis'><h4>{_e(key)}</h4><p class='error'>{_e(errors[key])}</p></div>"
            hooked[getattr(module, "REPORT_PART", "analyses")].append(block)
        done()
    if objectives or hooked["objectives"]:
        parts.append(_part(anchor, "objectives", "Objectives") + objectives + "".join(hooked["objectives"]))
    step(f"{name}: evaluation results")
    evaluations = _guard("evaluation results", lambda: _evaluations(run.dir))
    parts.append(_part(anchor, "evaluation", "Evaluation") + evaluations)
    done()
    none = "<p>None of the paper analyses applies to this run.</p>"
    parts.append(_part(anchor, "analyses", "Analyses") + ("".join(hooked["analyses"]) or none))
    for label, keys in (
        ("Not applicable to this run", not_applicable),
        ("Drawn only across several runs" + (" (at the top)" if runs > 1 else " (give more --ckpt)"), several),
        ("Without a report entry (run them by hand)", no_hook),
    ):
        if keys:
            parts.append(f"<p class='meta'>{label}: {_e(', '.join(keys))}</p>")
    recipe = (run.dir / "recipe.yaml").read_text(encoding="utf-8", errors="replace")
    parts.append(
        _part(anchor, "recipe", "Recipe")
        + f"<details><summary>recipe.yaml</summary><pre>{_e(recipe)}</pre></details></section>"
    )
    info = {
        "analyses": applied,
        "not_applicable": not_applicable,
        "several_runs": several,
        "no_report_entry": no_hook,
        "errors": errors,
    }
    return "".join(parts), info


def _summary(run, out: Path) -> str:
    """A lead sentence, the facts and headline numbers beside the loss curve."""
    from ssmlm.analyze.plots import plot_metrics
    from ssmlm.analyze.run_summary import facts

    f = facts(run)
    lead = f"<p class='lead'>{_e(f['lead'])}</p>"
    keys = ("model", "recipe", "objective", "task", "data", "steps", "tokens", "wall time")
    table = _table([(k, f[k]) for k in keys if k in f], ("", ""))
    numbers = _table(f["headline"], ("headline number", "value")) if f["headline"] else ""
    curve = ""
    if (run.dir / "metrics.jsonl").is_file() and any(k.startswith("training loss") for k, _ in f["headline"]):
        curve = _img(plot_metrics(run.dir, out / "curve_loss.png"), "training and validation loss against step")
    else:
        curve = "<p class='meta'>No training log (metrics.jsonl) in this run.</p>"
    return lead + f"<div class='cols'><div>{table}{numbers}</div><div>{curve}</div></div>"


def _busy_steps(run, rows: list[dict]) -> set[int]:
    """Steps after which the loop evaluated or saved a checkpoint (the next logged window includes that work)."""
    from ssmlm.analyze.run_summary import validation_rows

    every = run.recipe.train.checkpoint_every
    last = max((r["step"] for r in rows), default=0)
    saves = set(range(every, last + 1, every)) if every else set()
    return {r["step"] for r in validation_rows(rows)} | saves


def _training(run, out: Path) -> str:
    """Throughput (real tokens/s) and learning rate against step. A logged window that includes compilation
    (the first), an evaluation or a checkpoint save is drawn apart and left out of the median."""
    from ssmlm.analyze.plots import pyplot, save_figure
    from ssmlm.analyze.run_summary import metric_rows, train_rows

    rows = metric_rows(run.dir)
    train = train_rows(rows)
    fast = [r for r in train if "tokens_per_s" in r]
    rates = [r for r in train if "lr" in r]
    if not fast and not rates:
        return "<p class='meta'>No throughput or learning rate in the training log.</p>"
    busy = _busy_steps(run, rows)
    steady, other = [], []
    for k, r in enumerate(fast):
        prev = fast[k - 1]["step"] if k else -1
        (other if k == 0 or any(prev <= b < r["step"] for b in busy) else steady).append(r)
    plt = pyplot()
    fig, (tp, lr) = plt.subplots(1, 2, figsize=(11, 3.4))
    if steady:
        tp.plot([r["step"] for r in steady], [r["tokens_per_s"] for r in steady], "o-", ms=3, label="training only")
    if other:
        tp.plot(
            [r["step"] for r in other],
            [r["tokens_per_s"] for r in other],
            "o",
            ms=5,
            mfc="none",
            color="grey",
            label="window with compilation,\nevaluation or a save",
        )
    if fast:
        tp.set_ylim(bottom=0)
        tp.legend(fontsize=7, loc="lower right")
    tp.set_title("throughput (real tokens/s, all processes)", fontsize=10)
    tp.set_xlabel("training step")
    tp.set_ylabel("tokens / s")
    if rates:
        lr.plot([r["step"] for r in rates], [r["lr"] for r in rates], "-", color="tab:purple")
    lr.set_title("learning rate", fontsize=10)
    lr.set_xlabel("training step")
    lr.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in (tp, lr):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    png = save_figure(fig, out / "curve_throughput.png", svg=False)
    tps = sorted(r["tokens_per_s"] for r in steady)
    median = (
        f"<p>Median throughput over the {len(tps)} logged windows of training alone: "
        f"{tps[len(tps) // 2]:,.0f} tokens/s.</p>"
        if tps
        else ""
    )
    return median + _img(png, "throughput and learning rate against step")


def _objective_losses(run, out: Path, page_dir: Path) -> str:
    """The validation loss per objective class (table and figure) and per configuration (figure, collapsed)."""
    from ssmlm.analyze.objective_losses import objective_losses

    r = objective_losses(run, out)
    if r is None:
        return ""
    rows = [
        [
            t["class"].replace("_", " "),
            t["n"],
            round(t["first"], 3),
            round(t["last"], 3),
            f"{t['lowest'][0]}: {t['lowest'][1]:.3f}" if t["n"] > 1 else "–",
            f"{t['highest'][0]}: {t['highest'][1]:.3f}" if t["n"] > 1 else "–",
        ]
        for t in r["table"]
    ]
    steps = r["steps"]
    left = r["grid"] - len(r["names"])
    intro = (
        f"<p>Validation loss of each of the {len(r['names'])} objective configurations the run evaluated"
        + (
            f" ({left} of the mixture's {r['grid']} cannot make a sample in a row and were left out)"
            if left > 0
            else ""
        )
        + f", at {len(steps)} evaluations (steps {steps[0]:,}–{steps[-1]:,}); names from {_e(r['names_from'])}."
        "</p>"
    )
    table = _grid(
        [
            "objective class",
            "configurations",
            f"mean loss, step {steps[0]:,}",
            f"mean loss, step {steps[-1]:,}",
            "lowest at the end",
            "highest at the end",
        ],
        rows,
    )
    by_class, every = (Path(p) for p in r["images"])
    links = ", ".join(f"<a href='{_e(_rel(Path(p), page_dir))}'>{_e(Path(p).name)}</a>" for p in r["data"])
    return (
        f"<div class='analysis'><h4>Loss per objective class</h4>{intro}{table}"
        + _img(by_class, "mean validation loss per class at each evaluation (n: configurations in the class)")
        + f"<details><summary>every configuration, by name ({len(r['names'])})</summary>"
        + _img(every, "validation loss of every configuration at each evaluation")
        + "</details>"
        + f"<p class='meta'>Data: {links}</p></div>"
    )


def _analysis_block(key: str, result: dict, page_dir: Path) -> str:
    """An analysis's report result as HTML: title, figure, note, embedded images, tables, linked data files."""
    title = result.get("title") or key
    figure = result.get("figure") or ""
    note = f"<p class='note'>{_e(result['note'])}</p>" if result.get("note") else ""
    imgs = "".join(_img(Path(p), Path(p).name) for p in result.get("images") or [])
    few = result.get("too_few")
    if few:  # figures of a few items beside the paper's numbers would be read as results: one click away
        note = f"<p class='few'>Too few items to read: {_e(few)}.</p>" + note
        imgs = f"<details><summary>the figures anyway</summary>{imgs}</details>" if imgs else ""
    numbers = result.get("numbers") or {}
    grid = result.get("table")  # when given, it shows the numbers (which stay for programmatic use)
    if grid:
        table = _grid(grid["columns"], grid["rows"])
    else:
        table = _table(numbers.items(), ("quantity", "value")) if numbers else ""
    data = [Path(p) for p in result.get("data") or []]
    links = ", ".join(f"<a href='{_e(_rel(p, page_dir))}'>{_e(p.name)}</a>" for p in data)
    return (
        f"<div class='analysis{' few' if few else ''}'><h4>{_e(title)} <span class='fig'>{_e(figure)}</span> "
        f"<code>ssmlm analyze {_e(key)}</code></h4>{note}{imgs}{table}"
        + (f"<p class='meta'>Data: {links}</p>" if links else "")
        + "</div>"
    )


def _evaluations(run_dir: Path) -> str:
    """One table per RUN/eval/*.json: its numeric metrics (nested tables are named, not expanded)."""
    files = sorted((run_dir / "eval").glob("*.json"))
    if not files:
        return "<p class='meta'>No evaluation results (RUN/eval/*.json); run `ssmlm evaluate --ckpt RUN`.</p>"
    out = []
    for f in files:
        try:
            data = json.loads(f.read_text())
            metrics = data["metrics"]
            if not isinstance(metrics, dict):
                raise TypeError("'metrics' is not an object")
        except (ValueError, KeyError, TypeError) as e:
            out.append(f"<p class='error'>{_e(f.name)}: not an evaluation result ({_e(_error_line(e))})</p>")
            continue
        numeric = [(k, v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)]
        nested = [k for k, v in metrics.items() if isinstance(v, dict | list)]
        head = ", ".join(f"{k} {data[k]}" for k in ("task", "split", "step") if k in data)
        out.append(f"<p><b>{_e(f.name)}</b> <span class='meta'>{_e(head)}</span></p>")
        out.append(_table(numeric, ("metric", "value")) if numeric else "<p class='meta'>no numeric metrics</p>")
        if nested:
            out.append(f"<p class='meta'>Nested tables in the file: {_e(', '.join(nested))}</p>")
    return "".join(out)


# ----------------------------------------------------------------------------- small pieces


def data_uri(path: Path) -> str:
    """The file as a base64 data URI (PNG, SVG or JPEG, by suffix)."""
    mime = MIME.get(path.suffix.lower())
    if mime is None:
        raise ValueError(f"{path}: not an image the page can embed (expected {', '.join(MIME)})")
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _img(path: Path, caption: str) -> str:
    return (
        f"<figure><img alt='{_e(caption)}' data-file='{_e(path.name)}' src='{data_uri(path)}'>"
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _table(rows, header: tuple[str, str]) -> str:
    """A two-column table (name, value)."""
    return _grid(list(header) if any(header) else [], [[k, v] for k, v in rows])


def _grid(columns: list[str], rows: list[list]) -> str:
    """A table of at most MAX_ROWS rows: the rest are counted in a last row (the linked CSV holds them)."""
    head = "<tr>" + "".join(f"<th>{_e(str(c))}</th>" for c in columns) + "</tr>" if columns else ""
    shown = rows if len(rows) <= MAX_ROWS else rows[: MAX_ROWS - 1]
    body = "".join("<tr>" + "".join(f"<td{_num_class(v)}>{_e(_fmt(v))}</td>" for v in row) + "</tr>" for row in shown)
    if len(shown) < len(rows):
        body += f"<tr><td colspan='{max(len(columns), 2)}' class='meta'>… {len(rows) - len(shown)} more rows</td></tr>"
    return f"<table>{head}{body}</table>"


NUMBER = re.compile(r"[-+]?(\d[\d,]*\.?\d*|\.\d+)(e[-+]?\d+)?%?|–")


def _num_class(v) -> str:
    """Numbers, and text that is one number, align right."""
    number = isinstance(v, int | float) and not isinstance(v, bool) or isinstance(v, str) and NUMBER.fullmatch(v)
    return " class='num'" if number else ""


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _guard(what: str, make) -> str:
    """make() -> HTML, or the error line in its place (a part of the page failing does not sink the page)."""
    try:
        return make()
    except Exception as e:
        return f"<p class='error'>{_e(what)}: {_e(_error_line(e))}</p>"


def _error_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def _rel(path: Path, start: Path) -> str:
    import os

    try:
        return Path(os.path.relpath(path.resolve(), start.resolve())).as_posix()
    except ValueError:  # another drive
        return path.resolve().as_uri()


def _unique_names(run_dirs: list[Path]) -> list[str]:
    names = [d.resolve().name for d in run_dirs]
    return [n if names.count(n) == 1 else f"{n}-{i}" for i, n in enumerate(names)]


def _version() -> str:
    from ssmlm import __version__

    return __version__


CSS = """
body{font:14px/1.45 system-ui,sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}
h1{margin-bottom:0;font-size:24px}h2{border-bottom:2px solid #ccc;margin-top:1.6em}
h3{margin-top:1.4em;color:#345}h4{margin:.3em 0}
.meta{color:#666}.error{color:#b00;font-family:monospace}.fig{color:#666;font-weight:normal}
.lead{font-size:15px}.note{background:#fff8e5;border-left:3px solid #e0b040;padding:.3em .6em}
.nav{columns:3}figure{margin:.5em 0}img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#666;font-size:12px}table{border-collapse:collapse;margin:.4em 0}
td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}td:first-child{white-space:nowrap}
td.num{text-align:right;font-family:monospace}th{background:#f4f6f8}
pre{background:#f6f6f6;padding:.6em;overflow:auto;font-size:12px}summary{cursor:pointer;font-weight:600}
.analysis{border-left:3px solid #8ab;padding-left:.8em;margin:1em 0}code{font-size:12px}
.analysis.few{border-left-color:#ccc;color:#777}.few img{opacity:.6}p.few{font-weight:600}
.cols{display:flex;gap:1.5em;align-items:flex-start;flex-wrap:wrap}.cols>div{flex:1 1 420px;min-width:0}
"""
