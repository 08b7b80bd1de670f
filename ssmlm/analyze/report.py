"""`analyze report`: one self-contained HTML page for one or more runs.

Per run the page shows the recipe (collapsible YAML), the training loss and throughput (tokens/s) curves from
metrics.jsonl, every evaluation the run holds (RUN/eval/*.json: the numeric entries of its ``metrics`` as a
table), and every analysis of the registry that applies: for each module defining ``for_report(run, out_dir)``,
its returned {"title", "figure", "images", "data", "numbers"} (None: it does not apply to this run). The
analyses that do not apply are listed; an analysis that fails shows its error line and the page goes on.

Self-contained: CSS inline and every image embedded as a base64 data URI, so the one file can be mailed or
archived. The files behind it (PNGs, CSV/NPZ) stay in the output directory and are linked relatively.

``check_images`` opens a page in headless Chromium and reports every <img> that did not load (naturalWidth 0);
benchmarks/check_report.py is its command-line form.
"""

from __future__ import annotations

import base64
import html
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks

NAME = "report"
FIGURE = "the run report: every figure and table that applies"
MIME = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell")


def command(
    ckpt: Annotated[list[str], typer.Option("--ckpt", metavar="RUN", help="Run directory (repeat for more runs).")],
    out: Annotated[
        str | None,
        typer.Option("--out", metavar="DIR", help="Output directory of index.html (default: FIRST_RUN/analysis)."),
    ] = None,
):
    """Write one self-contained HTML page for one or more runs (the run report: every figure and table that applies).

    One section per run: the recipe, loss and tokens/s curves, the evaluation results (RUN/eval/*.json) and every
    analysis that applies to it; images are embedded, so index.html stands alone. With several runs, each
    run's analysis files go to DIR/RUN_NAME.
    Example: ssmlm analyze report --ckpt runs/gmlp_base --ckpt runs/bigs_128
    """
    for c in ckpt:
        checks.run_dir(c, "--ckpt")
    result = build_report([Path(c) for c in ckpt], Path(out) if out else Path(ckpt[0]) / "analysis")
    typer.echo(json.dumps(result, indent=2))


# ----------------------------------------------------------------------------- the page


def build_report(run_dirs: list[Path], out_dir: Path) -> dict:
    """Write out_dir/index.html for the runs; one run's files go to out_dir, several runs' to out_dir/NAME."""
    from ssmlm.runs import open_run

    out_dir.mkdir(parents=True, exist_ok=True)
    names = _unique_names(run_dirs)
    sections, summary = [], []
    for i, (d, name) in enumerate(zip(run_dirs, names, strict=True)):
        run = open_run(d)
        run_out = out_dir if len(run_dirs) == 1 else out_dir / name
        run_out.mkdir(parents=True, exist_ok=True)
        body, info = _run_section(run, name, f"run-{i}", run_out, out_dir)
        sections.append(body)
        summary.append({"run": str(d), **info})
    page = out_dir / "index.html"
    nav = "".join(f'<li><a href="#run-{i}">{_e(n)}</a></li>' for i, n in enumerate(names))
    page.write_text(
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>ssmlm report: {_e(', '.join(names))}</title><style>{CSS}</style></head><body>"
        f"<h1>ssmlm report</h1><p class='meta'>{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"ssmlm {_version()}</p><ul class='nav'>{nav}</ul>" + "".join(sections) + "</body></html>\n",
        encoding="utf-8",
    )
    return {"page": str(page), "runs": summary}


def _run_section(run, name: str, anchor: str, run_out: Path, page_dir: Path) -> tuple[str, dict]:
    """One run's part of the page, and what it found (for the printed summary)."""
    parts = [f"<section id='{anchor}'><h2>{_e(name)}</h2><p class='meta'>{_e(str(run.dir))}</p>"]
    parts.append(_guard("overview", lambda: _facts(run)))
    recipe = (run.dir / "recipe.yaml").read_text(encoding="utf-8", errors="replace")
    parts.append(f"<details><summary>recipe.yaml</summary><pre>{_e(recipe)}</pre></details>")
    parts.append("<h3>Training curves</h3>" + _guard("training curves", lambda: _curves(run.dir, run_out)))
    parts.append("<h3>Evaluation</h3>" + _guard("evaluation results", lambda: _evaluations(run.dir)))

    applied, not_applicable, no_hook, errors = {}, [], [], {}
    blocks = []
    from ssmlm.analyze import registry

    for key, module in registry().items():
        if module is sys.modules[__name__]:
            continue
        hook = getattr(module, "for_report", None)
        if hook is None:
            no_hook.append(key)
            continue
        try:
            result = hook(run, run_out)
            if result is None:
                not_applicable.append(key)
                continue
            blocks.append(_analysis_block(key, result, page_dir))
            applied[key] = [str(p) for p in result.get("images") or []]
        except Exception as e:  # one analysis failing must not sink the page
            errors[key] = _error_line(e)
            blocks.append(f"<div class='analysis'><h4>{_e(key)}</h4><p class='error'>{_e(errors[key])}</p></div>")
    parts.append("<h3>Analyses</h3>" + ("".join(blocks) or "<p>None applies to this run.</p>"))
    if not_applicable:
        parts.append(f"<p class='meta'>Not applicable to this run: {_e(', '.join(not_applicable))}</p>")
    if no_hook:
        parts.append(f"<p class='meta'>Without a report entry (run them by hand): {_e(', '.join(no_hook))}</p>")
    parts.append("</section>")
    info = {"analyses": applied, "not_applicable": not_applicable, "no_report_entry": no_hook, "errors": errors}
    return "".join(parts), info


def _analysis_block(key: str, result: dict, page_dir: Path) -> str:
    """An analysis's for_report result as HTML: title, figure, embedded images, numbers, linked data files."""
    title = result.get("title") or key
    figure = result.get("figure") or ""
    imgs = "".join(
        f"<figure><img alt='{_e(Path(p).name)}' src='{data_uri(Path(p))}'><figcaption>{_e(Path(p).name)}"
        "</figcaption></figure>"
        for p in result.get("images") or []
    )
    numbers = result.get("numbers") or {}
    table = _table(numbers.items(), ("quantity", "value")) if numbers else ""
    data = [Path(p) for p in result.get("data") or []]
    links = ", ".join(f"<a href='{_e(_rel(p, page_dir))}'>{_e(p.name)}</a>" for p in data)
    return (
        f"<div class='analysis'><h4>{_e(title)} <span class='fig'>{_e(figure)}</span> "
        f"<code>ssmlm analyze {_e(key)}</code></h4>{imgs}{table}"
        + (f"<p class='meta'>Data: {links}</p>" if links else "")
        + "</div>"
    )


def _facts(run) -> str:
    """A small table of what the run is: kind, model, last logged step, loss and throughput."""
    rows = _metric_rows(run.dir)
    train = [r for r in rows if "loss" in r and "split" not in r]
    facts = {"kind": run.kind, "architecture": run.recipe.model.arch, "objective": run.recipe.objective.kind}
    if train:
        facts["last logged step"] = train[-1]["step"]
        facts["last train loss"] = train[-1]["loss"]
        tps = sorted(r["tokens_per_s"] for r in train[1:] if "tokens_per_s" in r)  # first window: compiling
        if tps:
            facts["median tokens/s (after the first log)"] = tps[len(tps) // 2]
    summary = run.dir / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text())
        for k in ("final_step", "seconds", "fill_rate"):
            if isinstance(s.get(k), int | float):
                facts[f"summary: {k}"] = s[k]
        for k, v in (s.get("validation") or {}).items():
            if isinstance(v, int | float):
                facts[f"summary: validation {k}"] = v
    return _table(facts.items(), ("", ""))


def _metric_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _curves(run_dir: Path, out: Path) -> str:
    """Loss against step (train and validation, ssmlm.analyze.plots.plot_metrics) and tokens/s against step."""
    from ssmlm.analyze.plots import _plt, plot_metrics

    rows = _metric_rows(run_dir)
    train = [r for r in rows if "loss" in r and "split" not in r]
    if not train:
        return "<p class='meta'>No training log (metrics.jsonl) in this run.</p>"
    html_ = [_img(plot_metrics(run_dir, out / "curve_loss.png"), "training and validation loss against step")]
    fast = [r for r in train if "tokens_per_s" in r]
    if fast:
        plt = _plt()
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot([r["step"] for r in fast], [r["tokens_per_s"] for r in fast], "o-", ms=3)
        ax.set_xlabel("step")
        ax.set_ylabel("tokens / s (real tokens, all processes)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{run_dir.name}: training throughput (the first window includes compilation)")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        png = out / "curve_throughput.png"
        fig.savefig(png, dpi=110)
        plt.close(fig)
        html_.append(_img(png, "training throughput (tokens/s) against step"))
    return "".join(html_)


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
    return f"<figure><img alt='{_e(caption)}' src='{data_uri(path)}'><figcaption>{_e(caption)}</figcaption></figure>"


def _table(rows, header: tuple[str, str]) -> str:
    head = f"<tr><th>{_e(header[0])}</th><th>{_e(header[1])}</th></tr>" if any(header) else ""
    body = "".join(f"<tr><td>{_e(str(k))}</td><td class='num'>{_e(_fmt(v))}</td></tr>" for k, v in rows)
    return f"<table>{head}{body}</table>"


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
    return html.escape(text, quote=True)


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
h1{margin-bottom:0}h2{border-bottom:2px solid #ccc;margin-top:2em}h3{margin-top:1.5em}
.meta{color:#666}.error{color:#b00;font-family:monospace}.fig{color:#666;font-weight:normal}
.nav{columns:3}figure{margin:.5em 0}img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#666;font-size:12px}table{border-collapse:collapse;margin:.4em 0}
td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}td.num{text-align:right;font-family:monospace}
pre{background:#f6f6f6;padding:.6em;overflow:auto;font-size:12px}summary{cursor:pointer;font-weight:600}
.analysis{border-left:3px solid #8ab;padding-left:.8em;margin:1em 0}code{font-size:12px}
"""


# ----------------------------------------------------------------------------- browser check


def find_browser() -> str | None:
    """A Chromium-family executable on PATH, or None."""
    import shutil

    return next((p for p in map(shutil.which, BROWSERS) if p), None)


CHECK_SCRIPT = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                   .map(function (i) { return i.alt || i.src.slice(0, 60); });
  var p = document.createElement('pre');
  p.id = 'ssmlm-image-check';
  p.textContent = JSON.stringify({images: imgs.length, broken: broken});
  document.body.appendChild(p);
});
</script>"""


def check_images(page: Path, browser: str | None = None, timeout: float = 120) -> dict:
    """Open ``page`` in headless Chromium and return {"images": N, "broken": [alt of each image with
    naturalWidth 0]}. The page itself carries no script: a copy with a checking script is what is opened."""
    import re
    import subprocess
    import tempfile

    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError(f"no Chromium browser on PATH (looked for {', '.join(BROWSERS)})")
    text = Path(page).read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="ssmlm-report-check-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(text.replace("</body>", CHECK_SCRIPT + "</body>", 1), encoding="utf-8")
        args = [
            browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp}/profile", "--virtual-time-budget=5000", "--dump-dom", copy.as_uri(),
        ]  # fmt: skip
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    found = re.search(r'<pre id="ssmlm-image-check">(.*?)</pre>', proc.stdout, re.S)
    if not found:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        raise RuntimeError(f"{browser} did not run the check on {page} (exit {proc.returncode}): {' | '.join(tail)}")
    return json.loads(html.unescape(found.group(1)))
