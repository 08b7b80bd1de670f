"""`analyze kernels` (BiGS Figures 3 and 4) and `analyze flops` (BiGS Table 6): the numbers they write, against
independent computations (S4D kernels from the checkpoints' parameters, XLA's count of an unrolled model,
BiGS's closed-form parameter count) and the paper's typed-in table."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import english_lines, invoke


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs(tiny_encoder, tmp_path_factory):
    """The shared tiny 2-layer BiGS (pretrained for 4 steps), and a classifier finetuned from it into this
    module's folder (2 steps, a large learning rate so that the SSM kernels move)."""
    tmp = tmp_path_factory.mktemp("bigs")
    pre = tiny_encoder
    rows = ["sentence,label"] + [f"{s},{int('cat' in s)}" for s in english_lines(32, 3)]
    (tmp / "task.csv").write_text("\n".join(rows) + "\n")
    invoke(
        "finetune",
        "--ckpt",
        pre,
        "--train-file",
        tmp / "task.csv",
        "--text-fields",
        "sentence",
        "--label-field",
        "label",
        "--set",
        "train.epochs=1",
        "--set",
        "train.learning_rate=0.05",
        "--set",
        f"train.out_dir={tmp / 'runs'}",
        "-q",
    )
    return pre, tmp / "runs" / f"{pre.name}-task"


def s4d_kernels(run_dir: Path, length: int):
    """Each layer's forward and backward kernel straight from the checkpoint's S4D parameters."""
    from ssmlm.models import s4d
    from ssmlm.runs import open_run

    model, _ = open_run(run_dir).load_model()
    layers = model.encoder.layers
    out = []
    for i in range(open_run(run_dir).recipe.model.num_layers):
        pair = []
        for ssm in (layers[i].ssm_f, layers[i].ssm_b):
            k = s4d.s4d_kernel(ssm.A_re[...], ssm.A_im[...], ssm.C[...], ssm.log_step[...], length)
            pair.append(np.asarray(k))
        out.append(pair)
    return out  # [layer][0 forward / 1 backward] -> (L,)


def test_compare_writes_both_runs_kernels_and_their_change(runs, tmp_path):
    """BiGS Figure 4: K of the pretrained and of the finetuned encoder at every lag, and ‖K2−K1‖/‖K1‖."""
    pre, ft = runs
    res = invoke("analyze", "kernels", "--ckpt", pre, "--compare", ft, "--out", tmp_path, "--json")
    summary = json.loads(res.stdout)
    assert summary["layers"] == [0, 1]  # a 2-layer model: every layer (three spread over the depth, deduplicated)
    k_pre, k_ft = s4d_kernels(pre, 32), s4d_kernels(ft, 32)
    rows = read_csv(tmp_path / "kernels_compare.csv")
    assert len(rows) == 2 * 2 * 32  # layers × directions × lags
    for r in rows:
        layer, d, j = int(r["layer"]), 0 if r["direction"] == "forward" else 1, int(r["lag"])
        assert int(r["relative_position"]) == (-j if d == 0 else j)
        assert float(r["kernel_1"]) == pytest.approx(k_pre[layer][d][j], rel=1e-5, abs=1e-7)
        assert float(r["kernel_2"]) == pytest.approx(k_ft[layer][d][j], rel=1e-5, abs=1e-7)
    change = {int(r["layer"]): r for r in read_csv(tmp_path / "kernels_change.csv")}
    for layer in (0, 1):
        k1, k2 = np.concatenate(k_pre[layer]), np.concatenate(k_ft[layer])
        expected = np.linalg.norm(k2 - k1) / np.linalg.norm(k1)
        assert expected > 1e-4, "finetuning did not move the kernels: the test could not tell runs apart"
        assert float(change[layer]["relative_change"]) == pytest.approx(expected, rel=1e-4)
        assert summary["relative_change"][str(layer)] == pytest.approx(expected, rel=1e-4)
        fwd = np.linalg.norm(k_ft[layer][0] - k_pre[layer][0]) / np.linalg.norm(k_pre[layer][0])
        assert float(change[layer]["relative_change_forward"]) == pytest.approx(fwd, rel=1e-4)
    assert (tmp_path / "kernels_compare.png").stat().st_size > 1000
    assert (tmp_path / "kernels_compare.svg").is_file()


def test_crop_and_layers_choose_what_the_map_shows(runs, tmp_path):
    pre, _ = runs
    res = invoke("analyze", "kernels", "--ckpt", pre, "--crop", "3", "--layers", "1", "--out", tmp_path, "--json")
    summary = json.loads(res.stdout)
    assert summary["shown_layers"] == [1] and summary["crop"] == 3 and summary["layers"] == 2
    npz = np.load(tmp_path / "kernels.npz")  # every layer, every lag, as before
    assert npz["forward"].shape == (2, 32)
    rows = read_csv(tmp_path / "kernels.csv")
    assert {r["layer"] for r in rows} == {"1"} and len(rows) == 2 * 32
    k = s4d_kernels(pre, 32)
    back = {int(r["lag"]): float(r["kernel"]) for r in rows if r["direction"] == "backward"}
    np.testing.assert_allclose([back[j] for j in range(32)], k[1][1], rtol=1e-5, atol=1e-7)
    # --window is the older name of --crop
    summary = json.loads(
        invoke("analyze", "kernels", "--ckpt", pre, "--window", "5", "--out", tmp_path, "--json").stdout
    )
    assert summary["crop"] == 5 and summary["shown_layers"] == [0, 1]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--layers", "2"], "--layers = '2': expected comma-separated layer numbers in 0..1"),
        (["--layers", "a"], "--layers = 'a'"),
        (["--crop", "0"], "--crop = 0: expected at least 1"),
    ],
)
def test_bad_kernel_options_are_named(runs, tmp_path, args, message):
    pre, _ = runs
    r = invoke("analyze", "kernels", "--ckpt", pre, "--out", tmp_path, *args, code=None)
    assert r.exit_code != 0 and message in r.output, r.output


def test_a_random_initialisation_is_reported_as_one(runs, tmp_path):
    """`finetune --init random` records its source run as the architecture only (run.json init: random): the
    report says random initialisation, and draws no change of kernels from a source whose weights it never had."""
    from ssmlm.analyze import kernels, score_vs_loss
    from ssmlm.analyze.run_summary import facts
    from ssmlm.runs import open_run

    pre, ft = runs
    rand = tmp_path / "rand"
    shutil.copytree(ft, rand)
    info = json.loads((rand / "run.json").read_text())
    (rand / "run.json").write_text(json.dumps({**info, "init": "random"}))  # as drive.train writes it
    run = open_run(rand)
    assert facts(run)["task"].endswith(f", from random initialisation (the architecture of {pre.name})")
    rep = kernels.for_report(run, tmp_path / "k")
    assert rep["figure"] == "BiGS Figure 3" and len(rep["images"]) == 1
    assert score_vs_loss.for_report(run, tmp_path / "t") is None
    invoke("analyze", "report", "--ckpt", rand, "--out", tmp_path / "report")
    page = (tmp_path / "report" / "index.html").read_text()
    assert "random initialisation (the architecture of" in page and f"from run {pre.name}" not in page
    assert not list((tmp_path / "report").glob("kernels_compare*"))


def test_kernels_for_report(runs, tmp_path):
    """A finetuned BiGS run gets Figures 3 and 4 (its source is on disk); a run without SSMs gets None without
    a model being loaded (this one has no checkpoint at all)."""
    from ssmlm.analyze import kernels
    from ssmlm.runs import open_run

    pre, ft = runs
    rep = kernels.for_report(open_run(ft), tmp_path / "ft")
    assert rep["figure"] == "BiGS Figure 3 and BiGS Figure 4"
    assert all(Path(p).is_file() for p in rep["images"] + rep["data"]) and len(rep["images"]) == 2
    assert set(rep["numbers"]) >= {"layers", "relative change, layer 0", "relative change, layer 1"}
    rep = kernels.for_report(open_run(pre), tmp_path / "pre")
    assert rep["figure"] == "BiGS Figure 3" and len(rep["images"]) == 1

    other = tmp_path / "gmlp"
    other.mkdir()
    shutil.copy(pre / "run.json", other / "run.json")
    raw = yaml.safe_load((pre / "recipe.yaml").read_text())
    raw["model"]["arch"] = "gmlp"
    (other / "recipe.yaml").write_text(yaml.safe_dump(raw))
    assert kernels.for_report(open_run(other), tmp_path / "x") is None
    assert not (tmp_path / "x").exists()
    r = invoke("analyze", "kernels", "--ckpt", pre, "--compare", other, "--out", tmp_path, code=None)
    assert r.exit_code != 0 and "architecture 'gmlp'" in r.output, r.output


# ----------------------------------------------------------------------------- flops


def test_analytic_flops_agree_with_xla_on_a_tiny_config():
    """The 6N + mixing count against XLA's count of the compiled loss+grad, for BiGS (3 layers) and BERT (2)
    at d 128: within 10%; and extending the 1- and 2-layer counts to 3 layers equals compiling all 3."""
    from ssmlm.analyze.flops import analytic_flops, at_length, xla_flops, xla_step_flops
    from ssmlm.models.config import ModelConfig

    common = {"hidden_size": 128, "intermediate_size": 384, "vocab_size": 500, "max_seq_length": 64}
    bigs = ModelConfig(arch="bigs", num_layers=3, num_ssm=16, **common)
    whole = xla_step_flops(at_length(bigs, 64), 64, 10)
    assert whole == pytest.approx(analytic_flops(bigs, 64, 10), rel=0.10)
    assert xla_flops(bigs, 64, 10) == pytest.approx(whole, rel=1e-6)
    bert = ModelConfig(arch="bert", num_layers=2, num_heads=4, **common)
    assert xla_step_flops(at_length(bert, 64), 64, 10) == pytest.approx(analytic_flops(bert, 64, 10), rel=0.10)


def test_flops_table_holds_the_paper_numbers_and_the_count(tmp_path):
    """The CSV has Table 6 as typed in, and our analytic count: BiGS's from its closed-form parameter count,
    hand-worked; the paper's numbers are a forward pass (a third of training) of the large models."""
    from ssmlm.models.bigs import param_count_formula
    from ssmlm.models.config import ModelConfig

    res = invoke("analyze", "flops", "--lengths", "128,512,1024,4096", "--no-xla", "--out", tmp_path, "--json")
    assert json.loads(res.stdout)["data"] == str(tmp_path / "flops.csv")
    rows = {(r["model"], int(r["length"])): r for r in read_csv(tmp_path / "flops.csv")}
    paper = {128: (8.1e10, 7.9e10), 512: (3.2e11, 3.4e11), 1024: (6.5e11, 7.2e11), 4096: (2.6e12, 4.1e12)}
    for length, (bigs, bert) in paper.items():
        assert float(rows["BiGS", length]["paper_flops"]) == bigs
        assert float(rows["BERT", length]["paper_flops"]) == bert
        for model in ("BiGS", "BERT"):
            r = rows[model, length]
            assert r["paper_config"] == "True" and r["xla_train_flops"] == ""
            assert float(r["forward_over_paper"]) == pytest.approx(1.0, abs=0.10)
            assert float(r["train_over_paper"]) == pytest.approx(3.0 * float(r["forward_over_paper"]))

    # BiGS (bigs_full: 23 x 1024, 3072, N 64, vocab 30522, final norm) at 128 tokens, 20 masked slots, by hand:
    # 6 per non-embedding parameter per token, two FFT convolutions per layer, the tied decoder at the slots
    h, n_layers, length, slots, vocab = 1024, 23, 128, 20, 30522
    cfg = ModelConfig(
        arch="bigs",
        hidden_size=h,
        num_layers=n_layers,
        intermediate_size=3072,
        vocab_size=vocab,
        max_seq_length=length,
        num_ssm=64,
    )
    p = param_count_formula(cfg)
    non_embedding = p["mlm_total"] - (vocab + length + 2) * h  # LayerNorm of the embeddings counts
    per_token = 6 * non_embedding + 2 * n_layers * 30 * np.log2(2 * length) * h + 6 * h * vocab * slots / length
    assert float(rows["BiGS", 128]["analytic_train_flops"]) == pytest.approx(per_token * length, rel=1e-9)
    assert int(rows["BiGS", 4096]["predictions"]) == 20 * 4096 // 128
    assert (tmp_path / "flops.png").stat().st_size > 1000 and (tmp_path / "flops.svg").is_file()
    assert "forward" in json.loads((tmp_path / "flops.json").read_text())["note"]


def test_flops_options_and_report(runs, tmp_path, monkeypatch):
    from ssmlm.analyze import flops
    from ssmlm.runs import open_run

    r = invoke("analyze", "flops", "--lengths", "128,x", "--out", tmp_path, code=None)
    assert r.exit_code != 0 and "--lengths = '128,x'" in r.output, r.output
    pre, _ = runs
    # --ckpt: the run's model replaces its column's (BiGS); BERT stays bert_large
    res = json.loads(
        invoke("analyze", "flops", "--ckpt", pre, "--lengths", "32", "--no-xla", "--out", tmp_path, "--json").stdout
    )
    tiny = next(r for r in res["table"] if r["model"] == "BiGS")
    assert tiny["analytic_train_flops"] < 1e8 and tiny["paper_flops"] is None
    monkeypatch.setattr(flops, "REPORT_LENGTHS", ())  # the run's own length only: two small compiles
    rep = flops.for_report(open_run(pre), tmp_path / "rep")
    assert rep["figure"] == "BiGS Table 6" and Path(rep["images"][0]).is_file()
    assert {"BiGS training FLOPs at 32 (analytic)", "BiGS training FLOPs at 32 (XLA)"} <= set(rep["numbers"])
    # at d 16 element-wise work (which only XLA counts) is a large share: the same order, XLA above
    got = rep["numbers"]
    assert 1 < got["BiGS training FLOPs at 32 (XLA)"] / got["BiGS training FLOPs at 32 (analytic)"] < 3
