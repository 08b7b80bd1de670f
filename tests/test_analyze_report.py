"""`ssmlm analyze spatial` (gMLP Figures 3 and 4) and `ssmlm analyze report` (one self-contained HTML page).

Two tiny runs, trained once for the module through the CLI: a gMLP (Toeplitz spatial weights) and a BiGS.
The spatial values are checked against the parameters read straight from the checkpoint with Orbax; the page
against the recipe, a hand-written evaluation JSON and the PNG files it embeds; and, where a Chromium is
installed, in a headless browser (every <img> decoded).
"""

import base64
import csv
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import english_lines, tiny_recipe
from typer.testing import CliRunner

from ssmlm.analyze import registry
from ssmlm.analyze.report import check_images, find_browser
from ssmlm.cli import app

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
N = 16  # max_seq_length of the tiny runs
EVAL = {
    "run": "hand", "task": "sst2", "split": "validation", "step": 2,
    "metrics": {"accuracy": 0.8125, "f1": 0.6875, "loss": 0.43359375, "by_class": {"0": 0.75, "1": 0.875}},
}  # fmt: skip


def invoke(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, f"ssmlm {' '.join(map(str, args))} failed:\n{result.output}"
    return result


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
    res = json.loads(invoke("analyze", "spatial", "--ckpt", runs["gmlp"], "--out", out, "--layer", 1,
                            "--token", 0, "--token", 5).stdout)  # fmt: skip
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
        tmp_path / "dense.yaml", corpus, {"arch": "gmlp", "num_layers": 2, "max_seq_length": N, "spatial": "dense",
        "causal": True}, train={"steps": 2, "out_dir": str(tmp_path / "runs")},
    )  # fmt: skip
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
    r = CliRunner().invoke(app, ["analyze", "spatial", "--ckpt", str(runs["bigs"])])
    assert r.exit_code != 0 and "no spatial projection" in r.output
    r = CliRunner().invoke(app, ["analyze", "spatial", "--ckpt", str(runs["gmlp"]), "--token", str(N)])
    assert r.exit_code != 0 and f"--token {N}" in r.output


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    res = invoke("analyze", "report", "--ckpt", runs["bigs"], "--ckpt", runs["gmlp"], "--out", out)
    summary = json.loads(res.stdout)
    return out, summary, (out / "index.html").read_text()


def sections(page: str) -> dict[str, str]:
    """Run name -> its <section> of the page."""
    found = re.finditer(r"<section id='run-\d+'><h2>(.*?)</h2>.*?</section>", page, re.S)
    return {m.group(1): m.group(0) for m in found}


def test_report_page_shows_recipe_curves_evaluations_and_analyses(runs, report):
    out, summary, page = report
    assert summary["page"] == str(out / "index.html")
    by_run = {Path(s["run"]).name: s for s in summary["runs"]}
    parts = sections(page)
    assert set(parts) == {"bigs", "gmlp"}

    # self-contained: no scripts, stylesheets or images fetched from elsewhere
    assert "<script" not in page and "<link" not in page
    srcs = re.findall(r"src='([^']*)'", page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    for s in srcs:
        assert base64.b64decode(s.split(",", 1)[1], validate=True).startswith(PNG)

    for name, run_dir in runs.items():
        part = parts[name]
        assert html.escape((run_dir / "recipe.yaml").read_text(), quote=True) in part  # the recipe, verbatim
        # the curves: the embedded loss plot is the PNG written beside the page, byte for byte
        curves = [out / name / "curve_loss.png", out / name / "curve_throughput.png"]
        for png in curves:
            assert f"base64,{base64.b64encode(png.read_bytes()).decode()}'" in part
        last = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if "split" not in ln][-1]
        assert f"<td>last train loss</td><td class='num'>{last['loss']:.6g}</td>" in part
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

    # which analyses applied: spatial to the gMLP only; kernels to the BiGS once it has a report entry
    assert list(by_run["gmlp"]["analyses"]["spatial"]) == [
        str(out / "gmlp" / "spatial_middle.png"), str(out / "gmlp" / "spatial_tokens.png")
    ]  # fmt: skip
    assert "spatial" in by_run["bigs"]["not_applicable"] and "spatial" not in by_run["bigs"]["analyses"]
    assert "Not applicable to this run: " in bigs and "spatial" in bigs.split("Not applicable to this run: ")[1]
    if hasattr(registry()["kernels"], "for_report"):
        assert "kernels" in by_run["bigs"]["analyses"] and "kernels" in by_run["gmlp"]["not_applicable"]
    W = np.load(out / "gmlp" / "spatial.npz")["W"]  # the numbers table of the spatial entry
    peak = int(np.abs(W[0, N // 2]).argmax()) - N // 2
    assert f"<td>layer 0: peak offset / |W| share within ±8</td><td class='num'>{peak:+d} / " in parts["gmlp"]


def test_a_failing_analysis_shows_its_error_and_the_page_goes_on(runs, tmp_path):
    """A gMLP run whose checkpoint lost its parameters: spatial applies, fails, and the rest of the page is there."""
    run = tmp_path / "damaged"
    shutil.copytree(runs["gmlp"], run)
    for step in (run / "checkpoints").iterdir():
        if step.is_dir():
            shutil.rmtree(step / "params")
    summary = json.loads(invoke("analyze", "report", "--ckpt", run).stdout)
    page = (run / "analysis" / "index.html").read_text()
    (info,) = summary["runs"]
    assert "spatial" in info["errors"] and "spatial" not in info["analyses"]
    assert info["errors"]["spatial"].startswith("CheckpointError: ")
    assert f"<p class='error'>{html.escape(info['errors']['spatial'])}</p>" in page
    assert page.count("<img ") == 2  # the two curves still drawn
    assert "<summary>recipe.yaml</summary>" in page and page.rstrip().endswith("</html>")


needs_browser = pytest.mark.skipif(
    find_browser() is None, reason="no Chromium on PATH (e.g. `apt-get install -y chromium`): browser check skipped"
)


@needs_browser
def test_every_image_loads_in_a_headless_browser(report, tmp_path):
    out, _, page = report
    result = check_images(out / "index.html")
    assert result == {"images": page.count("<img "), "broken": []}
    # the check can fail: one image with a corrupt payload is reported by its alt text, and the script exits 1
    bad = tmp_path / "bad.html"
    first = re.search(r"<img alt='([^']*)' src='data:image/png;base64,([^']*)'", page)
    bad.write_text(page.replace(first.group(2), "iVBORw0KGgoAAAAAAAAA", 1))
    assert check_images(bad)["broken"] == [first.group(1)]
    script = [sys.executable, str(ROOT / "benchmarks" / "check_report.py")]
    env = {"PYTHONPATH": str(ROOT), "PATH": str(Path(find_browser()).parent) + ":/usr/bin:/bin"}
    good = subprocess.run([*script, str(out / "index.html")], capture_output=True, text=True, env=env, timeout=180)
    assert good.returncode == 0, good.stdout + good.stderr
    broken = subprocess.run([*script, str(bad)], capture_output=True, text=True, env=env, timeout=180)
    assert broken.returncode == 1 and first.group(1) in broken.stdout + broken.stderr
