"""`ssmlm analyze spatial` (gMLP Figures 3 and 4) and `ssmlm analyze report` (one self-contained HTML page that
reads top to bottom as an account of a run).

Tiny runs, trained once for the module through the CLI: a gMLP (Toeplitz spatial weights) and a BiGS (MLM), a
gated-SSM language model on Birdie's mixture (its controller and per-configuration losses) and that model
finetuned on phone books. The spatial values are checked against the parameters read straight from the checkpoint
with Orbax; the pages against the runs' own files: every page's structure is parsed (parts in order, every image
decodes and is the file beside the page, no table over MAX_ROWS rows), and where a Chromium is installed each page
is opened headless, checked and screenshot.
"""

import base64
import csv
import html
import io
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import english_lines, invoke, load_benchmark, tiny_recipe

from ssmlm.analyze.report import MAX_ROWS, PARTS
from ssmlm.progress import clock_time

ROOT = Path(__file__).resolve().parents[1]
# the headless-Chromium checker is a development tool beside benchmarks/check_report.py, not part of ssmlm
page_check = load_benchmark("page_check")
check_images, find_browser = page_check.check_images, page_check.find_browser
inspect_page, screenshot = page_check.inspect_page, page_check.screenshot
PNG = b"\x89PNG\r\n\x1a\n"
N = 16  # max_seq_length of the tiny runs
EVAL = {
    "run": "hand",
    "task": "sst2",
    "split": "validation",
    "step": 2,
    "metrics": {"accuracy": 0.8125, "f1": 0.6875, "loss": 0.43359375, "by_class": {"0": 0.75, "1": 0.875}},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"gmlp": run dir, "bigs": run dir}: 2 training steps each, the BiGS run with an evaluation JSON."""
    tmp = tmp_path_factory.mktemp("areport")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"doc{i}.txt").write_text("\n".join(english_lines(30, seed=i)) + "\n")
    out = {}
    for name, model in (("gmlp", {"arch": "gmlp", "num_layers": 2}), ("bigs", {"num_layers": 2})):
        recipe = tiny_recipe(
            tmp / f"{name}.yaml", corpus, {**model, "max_seq_length": N}, train={"steps": 2, "log_every": 1}
        )
        invoke("pretrain", recipe, "-q", "--name", name)
        out[name] = tmp / "runs" / name
        assert (out[name] / "checkpoints").is_dir()
    (out["bigs"] / "eval").mkdir()
    (out["bigs"] / "eval" / "sst2-validation.json").write_text(json.dumps(EVAL))
    (out["bigs"] / "eval" / "broken.json").write_text("{not json")
    return out


def checkpoint_kernels(run_dir: Path) -> np.ndarray:
    """(num_layers, 2n-1): every block's Toeplitz diagonals, read from the newest checkpoint with Orbax alone."""
    import jax
    import orbax.checkpoint as ocp

    step = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    tree = ocp.StandardCheckpointer().restore((run_dir / "checkpoints" / str(step) / "params").resolve())
    found = {}
    for path, value in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = [str(getattr(k, "key", k)) for k in path]
        if keys[-3:] in (["spatial", "kernel", "value"], ["spatial", "kernel"]):
            found[keys[keys.index("layers") + 1]] = np.asarray(value, np.float64)
    if list(found) == ["block"]:  # scanned layout: one stacked array, layer axis first
        return found["block"]
    return np.stack([found[str(i)] for i in range(len(found))])


def toeplitz_by_hand(w: np.ndarray, n: int) -> np.ndarray:
    """W[i, j] = w[i - j + n - 1], spelled out element by element."""
    W = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            W[i, j] = w[i - j + n - 1]
    return W


def test_spatial_values_are_the_checkpoint_weights(runs, tmp_path):
    out = tmp_path / "spatial"
    res = json.loads(
        invoke(
            "analyze",
            "spatial",
            "--ckpt",
            runs["gmlp"],
            "--out",
            out,
            "--layer",
            1,
            "--token",
            0,
            "--token",
            5,
            "--json",
        ).stdout
    )
    kernels = checkpoint_kernels(runs["gmlp"])
    assert kernels.shape == (2, 2 * N - 1)
    W = np.stack([toeplitz_by_hand(k, N) for k in kernels])
    assert np.abs(W).max() > 0  # W starts near zero but not at zero: the comparison below means something

    saved = np.load(out / "spatial.npz")
    np.testing.assert_allclose(saved["W"], W, rtol=1e-6, atol=0)
    mid = N // 2
    assert int(saved["middle"]) == mid == res["middle"]
    np.testing.assert_allclose(saved["middle_rows"], W[:, mid, :], rtol=1e-6, atol=0)

    # Figure 4 CSV: every layer's middle row, with offsets j - mid
    rows = list(csv.DictReader((out / "spatial_middle.csv").open()))
    assert len(rows) == 2 * N
    for r in rows:
        layer, j = int(r["layer"]), int(r["position"])
        assert int(r["offset"]) == j - mid
        assert float(r["weight"]) == pytest.approx(W[layer, mid, j], rel=1e-6, abs=0)
    # Figure 3 CSV: the selected layer and tokens only
    rows = list(csv.DictReader((out / "spatial_tokens.csv").open()))
    assert {(int(r["layer"]), int(r["token"])) for r in rows} == {(1, 0), (1, 5)} and len(rows) == 2 * N
    for r in rows:
        t, j = int(r["token"]), int(r["position"])
        assert int(r["offset"]) == j - t
        assert float(r["weight"]) == pytest.approx(W[1, t, j], rel=1e-6, abs=0)

    # headline numbers, recomputed: where each middle row peaks (as an offset) and its share within ±8
    absmid = np.abs(W[:, mid, :])
    assert res["peak_offset"] == [int(a.argmax()) - mid for a in absmid]
    near = np.abs(np.arange(N) - mid) <= 8
    np.testing.assert_allclose(res["local_mass"], absmid[:, near].sum(1) / absmid.sum(1), atol=1e-6)
    for key in ("plot_middle", "plot_tokens"):
        assert Path(res[key]).read_bytes().startswith(PNG)
        assert Path(res[key]).with_suffix(".svg").is_file()


@pytest.mark.slow
def test_spatial_dense_causal_weights(runs, tmp_path):
    """model.spatial = dense with causal = true: W is the stored n×n kernel with its upper triangle zeroed."""
    import orbax.checkpoint as ocp

    corpus = runs["gmlp"].parent.parent / "corpus"
    recipe = tiny_recipe(
        tmp_path / "dense.yaml",
        corpus,
        {"arch": "gmlp", "num_layers": 2, "max_seq_length": N, "spatial": "dense", "causal": True},
        train={"steps": 2, "out_dir": str(tmp_path / "runs")},
    )
    invoke("pretrain", recipe, "-q", "--name", "dense")
    run = tmp_path / "runs" / "dense"
    invoke("analyze", "spatial", "--ckpt", run, "--out", tmp_path / "out")
    step = max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    tree = ocp.StandardCheckpointer().restore((run / "checkpoints" / str(step) / "params").resolve())
    layers = tree["encoder"]["layers"]
    if "block" in layers:
        kernels = np.asarray(layers["block"]["sgu"]["spatial"]["kernel"]["value"], np.float64)
    else:
        kernels = np.stack([np.asarray(layers[str(i)]["sgu"]["spatial"]["kernel"]["value"]) for i in range(2)])
    assert kernels.shape == (2, N, N)
    expected = np.where(np.arange(N)[:, None] >= np.arange(N)[None, :], kernels, 0.0)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "spatial.npz")["W"], expected, rtol=1e-6, atol=0)


def test_spatial_refuses_other_architectures_and_bad_options(runs):
    r = invoke("analyze", "spatial", "--ckpt", runs["bigs"], code=None)
    assert r.exit_code != 0 and "no spatial projection" in r.output
    r = invoke("analyze", "spatial", "--ckpt", runs["gmlp"], "--token", N, code=None)
    assert r.exit_code != 0 and f"--token {N}" in r.output


# ----------------------------------------------------------------------------- the report


class Page(HTMLParser):
    """What a report page is made of: its images (attributes), the rows of each table, and its parts (headings
    with data-part) in document order, each with the run section it sits in."""

    def __init__(self, text: str):
        super().__init__()
        self.images, self.tables, self.parts, self.section = [], [], [], None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.section = a.get("id")
        elif tag == "img":
            self.images.append(a)
        elif tag == "table":
            self.tables.append(0)
        elif tag == "tr" and self.tables:
            self.tables[-1] += 1
        if "data-part" in a:
            self.parts.append((self.section, a["data-part"]))


def check_structure(page_path: Path) -> Page:
    """The checks that need no browser: every run's parts in PARTS order (the ones every run has all there), every
    <img> a PNG that decodes and is byte for byte the file it names beside the page, no table over MAX_ROWS rows
    (plus its header)."""
    from PIL import Image

    text = page_path.read_text()
    page = Page(text)
    runs = dict.fromkeys(s for s, _ in page.parts if s and s.startswith("run-"))
    assert runs, "no run sections"
    for run in runs:
        parts = [p for s, p in page.parts if s == run]
        assert parts == [p for p in PARTS if p in parts], parts  # in order, each once
        assert {"summary", "training", "evaluation", "analyses", "recipe"} <= set(parts)
    assert page.images
    for img in page.images:
        data = base64.b64decode(img["src"].split(",", 1)[1], validate=True)
        assert data.startswith(PNG)
        Image.open(io.BytesIO(data)).verify()
        files = list(page_path.parent.rglob(img["data-file"]))
        assert any(f.read_bytes() == data for f in files), img["data-file"]
    assert max(page.tables) <= MAX_ROWS + 1, page.tables
    return page


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    res = invoke("analyze", "report", "-q", "--json", "--ckpt", runs["bigs"], "--ckpt", runs["gmlp"], "--out", out)
    summary = json.loads(res.stdout)
    return out, summary, (out / "index.html").read_text()


def sections(page: str) -> dict[str, str]:
    """Run name -> its <section> of the page."""
    found = re.finditer(r"<section class='run' id='run-\d+'><h2>(.*?)</h2>.*?</section>", page, re.S)
    return {m.group(1): m.group(0) for m in found}


def checkpoint_param_count(run_dir: Path) -> int:
    import jax
    import orbax.checkpoint as ocp

    step = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    tree = ocp.StandardCheckpointer().restore((run_dir / "checkpoints" / str(step) / "params").resolve())
    return sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(tree))


def test_report_page_shows_recipe_curves_evaluations_and_analyses(runs, report):
    out, summary, page = report
    assert summary["page"] == str(out / "index.html")
    check_structure(out / "index.html")
    by_run = {Path(s["run"]).name: s for s in summary["runs"]}
    parts = sections(page)
    assert set(parts) == {"bigs", "gmlp"}
    # two runs: the page opens with a table comparing them, before either run's section
    assert page.index("Runs compared") < page.index("<section class='run'")

    # self-contained: no scripts, stylesheets or images fetched from elsewhere
    assert "<script" not in page and "<link" not in page
    srcs = re.findall(r"src='([^']*)'", page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)

    for name, run_dir in runs.items():
        if name not in parts:
            continue
        part = parts[name]
        assert html.escape((run_dir / "recipe.yaml").read_text(), quote=True) in part  # the recipe, verbatim
        # the summary: the size counted from the checkpoint's own arrays, the tokens and time the run took
        params = checkpoint_param_count(run_dir)
        assert f"{params / 1e3:.3g}k parameters" in part
        assert f"{2 * 8 * N} (2 steps × 8 rows × {N})" in part
        seconds = json.loads((run_dir / "summary.json").read_text())
        assert clock_time(seconds.get("seconds_total", seconds["seconds"])) in part  # H:MM:SS, as every duration
        # the curves: the embedded loss plot is the PNG written beside the page, byte for byte
        curves = [out / name / "curve_loss.png", out / name / "curve_throughput.png"]
        for png in curves:
            assert f"base64,{base64.b64encode(png.read_bytes()).decode()}'" in part
        last = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if "split" not in ln][-1]
        assert f"<td>training loss at step {last['step']}</td><td class='num'>{last['loss']:.6g}</td>" in part
        # the summary comes first, the loss curve in it
        assert part.index("data-part='summary'") < part.index("curve_loss.png") < part.index("data-part='training'")
        # one <img> per curve and per image of every analysis that applied
        applied = by_run[name]["analyses"]
        assert part.count("<img ") == len(curves) + sum(len(v) for v in applied.values())
        for key in applied:
            assert f"<code>ssmlm analyze {key}</code>" in part
        assert not by_run[name]["errors"]

    # the evaluation JSON: its numeric metrics as a table; the nested one named; a broken file reported
    bigs = parts["bigs"]
    for metric, value in (("accuracy", "0.8125"), ("f1", "0.6875"), ("loss", "0.433594")):
        assert f"<td>{metric}</td><td class='num'>{value}</td>" in bigs
    assert "Nested tables in the file: by_class" in bigs
    assert "broken.json: not an evaluation result (JSONDecodeError" in bigs
    assert "No evaluation results" in parts["gmlp"]

    # which analyses applied: spatial to the gMLP only; kernels and FLOPs to the BiGS
    assert list(by_run["gmlp"]["analyses"]["spatial"]) == [
        str(out / "gmlp" / "spatial_middle.png"),
        str(out / "gmlp" / "spatial_tokens.png"),
    ]
    assert "spatial" in by_run["bigs"]["not_applicable"] and "spatial" not in by_run["bigs"]["analyses"]
    assert "Not applicable to this run: " in bigs and "spatial" in bigs.split("Not applicable to this run: ")[1]
    assert "kernels" in by_run["bigs"]["analyses"] and "kernels" in by_run["gmlp"]["not_applicable"]
    W = np.load(out / "gmlp" / "spatial.npz")["W"]  # the numbers table of the spatial entry
    peak = int(np.abs(W[0, N // 2]).argmax()) - N // 2
    assert f"<td>layer 0: peak offset / |W| share within ±8</td><td>{peak:+d} / " in parts["gmlp"]
    # a 2-layer, d 16 BiGS is not the paper's 23 x 1024: its FLOPs are not set beside Table 6's, only normalised
    assert "flops" in by_run["bigs"]["analyses"]
    assert html.escape("is not the size of the paper's BiGS (23 layers × d 1024)") in bigs
    assert "÷ at 128: paper (23 layers × d 1024)" in bigs and "paper Table 6 (forward)" not in bigs
    # Figure 5 needs several finetuned runs: not drawn for pretraining runs
    assert "BiGS Figure 5" not in page and "transfer" in by_run["bigs"]["several_runs"]


def test_flops_figure_sets_the_paper_beside_only_its_own_size(runs):
    from ssmlm.analyze.flops import PAPER_TABLE6, flops_panels, is_paper_config, model_config
    from ssmlm.recipe import load_recipe
    from ssmlm.runs import open_run

    assert is_paper_config("BiGS", model_config(load_recipe("bigs_full")).cfg)
    assert not is_paper_config("BiGS", model_config(open_run(runs["bigs"]).recipe).cfg)
    rows = [
        {"model": m, "length": n, "paper_flops": PAPER_TABLE6[n][m], "paper_config": True}
        for m in ("BiGS", "BERT")
        for n in (128, 512)
    ]
    bigs = [r for r in rows if r["model"] == "BiGS"]
    assert flops_panels(bigs) == ["flops"]  # the paper's size: its numbers beside ours, no other panel
    assert flops_panels([{**r, "paper_config": False} for r in bigs]) == ["flops", "growth"]
    assert flops_panels(rows) == ["flops", "ratio"]


def test_a_failing_analysis_shows_its_error_and_the_page_goes_on(runs, tmp_path):
    """A gMLP run whose checkpoint lost its parameters: spatial applies, fails, and the rest of the page is there."""
    run = tmp_path / "damaged"
    shutil.copytree(runs["gmlp"], run)
    for step in (run / "checkpoints").iterdir():
        if step.is_dir():
            shutil.rmtree(step / "params")
    summary = json.loads(invoke("analyze", "report", "-q", "--json", "--ckpt", run).stdout)
    page = (run / "analysis" / "index.html").read_text()
    (info,) = summary["runs"]
    assert "spatial" in info["errors"] and "spatial" not in info["analyses"]
    assert info["errors"]["spatial"].startswith("CheckpointError: ")
    assert f"<p class='error'>{html.escape(info['errors']['spatial'])}</p>" in page
    assert page.count("<img ") == 2  # the two curves still drawn
    assert "<summary>recipe.yaml</summary>" in page and page.rstrip().endswith("</html>")


# ----------------------------------------------------------------------------- language models


@pytest.fixture(scope="module")
def lm_runs(runs, tmp_path_factory):
    """{"birdie": a gated-SSM LM on Birdie's mixture (controller, per-configuration losses), "phonebook": it
    finetuned on phone books, with a phone-book evaluation written from hand-made records}."""
    import yaml

    from ssmlm.evaluate.retrieval import summarize

    tmp = tmp_path_factory.mktemp("lmreport")
    corpus = runs["bigs"].parent.parent / "corpus"
    recipe = {
        "base": "lm_tiny",
        "name": "birdie",
        "model": {"arch": "gated_ssm", "hidden_size": 32, "num_layers": 2, "state_size": 32, "max_seq_length": 128},
        "data": {"source": str(corpus), "vocab_size": 400, "validation_fraction": 0.2},  # 12 files: 2 held out
        "objective": {
            "mixture": "birdie",
            "min_sample_space": 16,
            "controller": {
                "eval_scale": 0.02,
                "validation_rows": 1,
                "proposals": 32,
                "grok_iterations": 2,
                "width": 16,
                "state_size": 16,
                "layers": 1,
            },
        },
        "train": {
            "steps": 6,
            "batch_size": 4,
            "log_every": 1,
            "eval_every": 0,
            "eval_batches": 1,
            "checkpoint_every": 0,
            "out_dir": str(tmp / "runs"),
        },
    }
    (tmp / "birdie.yaml").write_text(yaml.safe_dump(recipe))
    invoke("pretrain", tmp / "birdie.yaml", "-q")
    phonebook = {
        "base": "phonebook_tiny",
        "task": {
            "max_seq_length": 256,
            "phonebook": {"train_books": 8, "validation_books": 2, "entries": [2, 5], "queries": [1, 2]},
        },
        "train": {
            "steps": 2,
            "batch_size": 4,
            "eval_every": 0,
            "checkpoint_every": 0,
            "log_every": 1,
            "out_dir": str(tmp / "runs"),
        },
    }
    (tmp / "pb.yaml").write_text(yaml.safe_dump(phonebook))
    invoke("finetune", "--ckpt", tmp / "runs" / "birdie", "--task", "phonebook", "--recipe", tmp / "pb.yaml", "-q")
    ft = tmp / "runs" / "birdie-phonebook"
    records = [
        {"entries": 3, "queries": 1, "correct": 0, "all_correct": False, "digits": 10, "digits_correct": 2},
        {"entries": 5, "queries": 2, "correct": 1, "all_correct": False, "digits": 20, "digits_correct": 12},
    ]
    (ft / "eval").mkdir()
    (ft / "eval" / "phonebook-validation.json").write_text(
        json.dumps(
            {
                "run": str(ft),
                "task": "phonebook",
                "split": "validation",
                "step": 2,
                "metrics": summarize(records),
                "records": records,
            }
        )
    )
    return {"birdie": tmp / "runs" / "birdie", "phonebook": ft}


@pytest.fixture(scope="module")
def birdie_report(lm_runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("birdie_report")
    summary = json.loads(invoke("analyze", "report", "-q", "--json", "--ckpt", lm_runs["birdie"], "--out", out).stdout)
    return out, summary, (out / "index.html").read_text()


def test_birdie_report_names_the_objective_losses(lm_runs, birdie_report):
    from ssmlm.analyze.objective_losses import class_of, short_name
    from ssmlm.objectives.birdie.mixtures import mixture

    out, summary, page = birdie_report
    parsed = check_structure(out / "index.html")
    assert [p for _, p in parsed.parts] == list(PARTS)  # every part, objectives included, in order
    (info,) = summary["runs"]
    assert not info["errors"] and "mixture" in info["analyses"]
    # the 95-row list of unnamed losses is gone: every configuration named, in a compact per-class table
    assert "config_loss_" not in page
    rows = [json.loads(ln) for ln in (lm_runs["birdie"] / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r.get("split") == "validation" and "config_loss_0" in r]
    n = sum(1 for k in val[-1] if k.startswith("config_loss_"))
    table = list(csv.DictReader((out / "objective_losses.csv").open()))
    assert len(table) == n * len(val)
    grid = [c.name for c in mixture("birdie")[0]]
    names = [r["configuration"] for r in table[:n]]
    # the names are the grid's, in the grid's order, the ones that do not fit the rows left out
    assert len(set(names)) == n and [g for g in grid if g in names] == names
    assert f"{len(grid) - n} of the mixture's {len(grid)} cannot make a sample" in page
    for r in table:
        step = next(v for v in val if v["step"] == int(r["step"]))
        assert float(r["loss"]) == pytest.approx(step[f"config_loss_{r['index']}"], rel=1e-9)
    classes = list(dict.fromkeys(class_of(x) for x in names))
    objectives = page[page.index("data-part='objectives'") : page.index("data-part='evaluation'")]
    for c in classes:
        members = [i for i, x in enumerate(names) if class_of(x) == c]
        mean = sum(val[-1][f"config_loss_{i}"] for i in members) / len(members)
        assert f"<td>{c.replace('_', ' ')}</td><td class='num'>{len(members)}</td>" in objectives
        assert f"<td class='num'>{round(mean, 3):.6g}</td>" in objectives
    assert any(short_name(x) and html.escape(short_name(x)) in objectives for x in names)
    # the controller's mixture sits with the objective losses, not among the paper figures
    assert html.escape("Birdie's objective mixture over training") in objectives
    assert "flops" in info["not_applicable"] and "BiGS Figure 5" not in page


def test_finetuned_runs_get_figure_5_only_together(lm_runs, tmp_path):
    ft = lm_runs["phonebook"]
    alone = json.loads(invoke("analyze", "report", "-q", "--json", "--ckpt", ft, "--out", tmp_path / "alone").stdout)
    page = (tmp_path / "alone" / "index.html").read_text()
    check_structure(tmp_path / "alone" / "index.html")
    (info,) = alone["runs"]
    assert "transfer" in info["several_runs"] and "BiGS Figure 5" not in page
    assert "phonebook" in info["analyses"]
    assert "generated phone books: 8 for training, 2 for validation; 2–5 entries, 1–2 numbers asked each" in page
    # a second finetuned run (a copy, another name): Figure 5 and Figure 1 across both, before the runs' sections
    twin = tmp_path / "twin"
    shutil.copytree(ft, twin)
    both = json.loads(
        invoke("analyze", "report", "-q", "--json", "--ckpt", ft, "--ckpt", twin, "--out", tmp_path / "both").stdout
    )
    page = (tmp_path / "both" / "index.html").read_text()
    check_structure(tmp_path / "both" / "index.html")
    assert set(both["across_runs"]) == {"transfer", "phonebook"}
    assert "(n = 2 finetuned runs)" in page
    assert page.index("BiGS Figure 5") < page.index("<section class='run'")


def test_metric_rows_keep_the_last_line_of_a_step(tmp_path):
    """A step logged twice (an older run restarted before its first checkpoint) counts once, its last line."""
    from ssmlm.analyze.run_summary import metric_rows

    lines = [
        {"step": 1, "loss": 3.0},
        {"step": 0, "split": "controller", "share/a": 1.0},
        {"step": 1, "loss": 2.0},
        {"step": 0, "split": "controller", "share/a": 0.5},
        {"step": 2, "loss": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\nnot json\n")
    assert metric_rows(tmp_path) == [lines[3], lines[2], lines[4]]


def test_configuration_names_read_short():
    from ssmlm.analyze.objective_losses import class_of, short_name

    assert short_name("infilling(max_len=256,mean=3.0,min_len=30,rate=0.05)") == "rate 0.05, mean 3, ≤256 tokens"
    assert short_name("autoencoding(max_len=384,mean=8.0,min_len=5,rate=0.5,shuffle=True)") == (
        "rate 0.5, mean 8, shuffled, ≤384 tokens"
    )
    assert short_name("selective_copying(form=context_query,k=2,max_len=768)") == "k 2, context→query, ≤768 tokens"
    assert short_name("next_token") == "" and class_of("deshuffling(max_len=256,p=0.5)") == "deshuffling"


def test_tables_are_cut_at_max_rows():
    from ssmlm.analyze.report import _grid

    cut = _grid(["a", "b"], [[i, i * 2] for i in range(100)])
    assert cut.count("<tr>") == MAX_ROWS + 1 and f"… {100 - MAX_ROWS + 1} more rows" in cut
    assert _grid(["a"], [[1]] * MAX_ROWS).count("<tr>") == MAX_ROWS + 1


def agreement_rows(scored: dict[str, int]) -> list[dict]:
    """Table 5's rows with ``scored`` items (label -> n) scored, half of them right; the other rows none."""
    from ssmlm.analyze.agreement import TABLE5, table5_rows

    counts = {}
    for _, cond, label, *_ in TABLE5:
        n = scored.get(label, 0)
        if n:
            counts[("marvin", cond)] = {"items": n + 1, "skipped": 1, "correct": n // 2, "accuracy": 100 * (n // 2) / n}
    return table5_rows(counts)


def svg_text(path: Path) -> str:
    """The words of an SVG figure written with its text as text (svg.fonttype none)."""
    return html.unescape(" ".join(re.findall(r"<text[^>]*>([^<]*)</text>", path.read_text())))


def test_agreement_figures_leave_out_empty_rows_and_mark_few(tmp_path):
    """BiGS Table 5 beside the paper's bars: a condition with no scored item is not drawn (it is named under the
    figure), one of 2 items is greyed and marked "too few to read", one of 12 is drawn as ours; Figure 8's
    points the same way."""
    import matplotlib

    from ssmlm.analyze.agreement import MIN_ITEMS, plot_attractors, plot_table5

    table = agreement_rows({"Sentential complement": 2, "Across prep phrase": 12})
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        plot_table5(table, "run (step 2)", tmp_path / "t5.png")
        plot_attractors(
            [
                {"attractors": 1, "items": 3, "skipped": 0, "correct": 1, "accuracy": 33.33},
                {"attractors": 2, "items": 20, "skipped": 0, "correct": 15, "accuracy": 75.0},
            ],
            "run (step 2)",
            tmp_path / "f8.png",
        )
    words = svg_text(tmp_path / "t5.svg")
    assert "SV: Sentential complement (n=2)" in words and "SV: Across prep phrase (n=12)" in words
    assert "n=0" not in words and "Simple (n=" not in words  # rows with nothing scored are not set beside the paper
    assert "left out, no item scored (11): SV: Simple, " in words
    assert words.count("too few to read") == 2  # the n = 2 row's mark and the legend's grey entry
    assert "n = 2, too few to read" in words and "n = 12" not in words
    assert f"ours, n < {MIN_ITEMS}: too few to read" in words
    words = svg_text(tmp_path / "f8.svg")
    assert "n=3" in words and "n=20" in words and f"ours, n < {MIN_ITEMS}: too few to read" in words
    assert (tmp_path / "t5.png").read_bytes().startswith(PNG)


def test_a_report_entry_of_too_few_items_is_marked_and_its_figures_folded(tmp_path):
    from ssmlm.analyze.report import _analysis_block

    png = tmp_path / "fig.png"
    png.write_bytes(
        base64.b64decode(
            "iVBORw0KGgoAAAAASUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
        )
    )
    entry = {"title": "Agreement", "figure": "BiGS Table 5", "images": [png], "numbers": {"items": 4}}
    plain = _analysis_block("agreement", entry, tmp_path)
    few = _analysis_block("agreement", {**entry, "too_few": "no condition has 10 scored items"}, tmp_path)
    assert plain.startswith("<div class='analysis'>") and "<details>" not in plain and "Too few" not in plain
    assert few.startswith("<div class='analysis few'>")
    assert "<p class='few'>Too few items to read: no condition has 10 scored items.</p>" in few
    assert few.index("<details><summary>the figures anyway</summary>") < few.index("<img ") < few.index("</details>")


# ----------------------------------------------------------------------------- in a browser

needs_browser = pytest.mark.skipif(
    find_browser() is None, reason="no Chromium on PATH (e.g. `apt-get install -y chromium`): browser check skipped"
)


@needs_browser
def test_pages_in_a_headless_browser(report, birdie_report, tmp_path):
    """Each page as Chromium lays it out: every image decoded, the parts in order, nothing wider than a 1280 px
    window; the whole page saved as a screenshot."""
    from PIL import Image

    for out, _, page in (report, birdie_report):
        expected = [p for _, p in Page(page).parts]
        shot = tmp_path / f"{out.name}.png"
        found = screenshot(out / "index.html", shot)
        assert found["images"] == page.count("<img ") and found["broken"] == []
        assert [p["part"] for p in found["parts"]] == expected
        tops = [p["top"] for p in found["parts"]]
        assert tops == sorted(tops)  # laid out top to bottom in that order
        assert found["too_wide"] == []
        with Image.open(shot) as im:
            assert im.width == 1280 and im.height >= found["height"]


@needs_browser
def test_broken_images_are_named_and_the_script_saves_screenshots(report, tmp_path):
    out, _, page = report
    # the check can fail: one image with a corrupt payload is reported by its alt text, and the script exits 1
    bad = tmp_path / "bad.html"
    first = re.search(r"<img alt='([^']*)' data-file='[^']*' src='data:image/png;base64,([^']*)'", page)
    bad.write_text(page.replace(first.group(2), "iVBORw0KGgoAAAAAAAAA", 1))
    assert check_images(bad)["broken"] == [first.group(1)]
    assert inspect_page(out / "index.html")["broken"] == []
    script = [sys.executable, str(ROOT / "benchmarks" / "check_report.py")]
    env = {"PYTHONPATH": str(ROOT), "PATH": str(Path(find_browser()).parent) + ":/usr/bin:/bin"}
    shots = tmp_path / "shots"
    good = subprocess.run(
        [*script, str(out / "index.html"), "--out", shots], capture_output=True, text=True, env=env, timeout=180
    )
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads(good.stdout)["screenshot"] == str(shots / f"{out.name}.png")
    assert (shots / f"{out.name}.png").read_bytes().startswith(PNG)
    broken = subprocess.run([*script, str(bad), "--out", shots], capture_output=True, text=True, env=env, timeout=180)
    assert broken.returncode == 1 and first.group(1) in broken.stdout + broken.stderr
