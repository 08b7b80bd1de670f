"""`analyze agreement` (BiGS Table 5, Figure 8) and `analyze cola` (BiGS Figures 7 and 9) on tiny runs: the
numbers they write are checked against logits and Matthews correlations computed here, independently."""

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import english_lines, invoke, tiny_recipe

from ssmlm.analyze import agreement, cola
from ssmlm.evaluate.metrics import matthews


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def sample_sentences() -> list[str]:
    """Every sentence of the shipped stimuli, both forms: a corpus whose vocabulary covers most of them."""
    lines = []
    for row in csv.reader(agreement.SAMPLES[0].open(), delimiter="\t"):
        lines += [row[2], row[3]]
    for row in csv.reader(agreement.SAMPLES[1].open(), delimiter="\t"):
        lines += [row[2].replace(agreement.MASK, row[3]), row[2].replace(agreement.MASK, row[4])]
    return lines


def cola_sample() -> list[dict]:
    with cola.SAMPLE.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


@pytest.fixture(scope="module")
def mlm_run(tmp_path_factory):
    """A tiny BiGS pretrained on the shipped sentences (agreement stimuli, annotated CoLA sample) and more."""
    tmp = tmp_path_factory.mktemp("syntax")
    corpus = tmp / "corpus"
    corpus.mkdir()
    cola_lines = [r["sentence"] for r in cola_sample()]
    for i in range(6):
        lines = sample_sentences() + cola_lines + english_lines(20, seed=i)
        (corpus / f"doc{i}.txt").write_text("\n".join(lines) + "\n")
    recipe = tiny_recipe(tmp / "tiny.yaml", corpus, data={"vocab_size": 400}, train={"steps": 4})
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        invoke("pretrain", recipe, "--name", "mlm", "-q")
    finally:
        os.chdir(cwd)
    return tmp / "runs" / "mlm"


def expected_scores(run_dir: Path):
    """(kind, condition, good logit, bad logit) per shipped item, or (kind, condition, None, why skipped):
    from the full sentence with [MASK] in it, encoded whole by the tokenizer (not piecewise as the analysis
    does), padded to the run's length, every position's logits computed."""
    from flax import nnx

    from ssmlm.runs import open_run

    run = open_run(run_dir)
    model, _ = run.load_model()
    tok = run.tokenizer()
    length = run.recipe.model.max_seq_length
    forward = nnx.jit(lambda m, ids: m(ids))
    out = []
    for kind, rows in (("marvin", agreement.SAMPLES[0]), ("attractors", agreement.SAMPLES[1])):
        for row in csv.reader(rows.open(), delimiter="\t"):
            if kind == "marvin":
                good, bad = row[2].split(), row[3].split()
                i = next(j for j, (g, b) in enumerate(zip(good, bad, strict=True)) if g != b)
                cond = row[0].replace("inanim", "anim")
                text, gw, bw = " ".join(good[:i] + ["[MASK]"] + good[i + 1 :] + ["."]), good[i], bad[i]
            else:
                cond, text, gw, bw = row[0], row[2].replace(agreement.MASK, "[MASK]"), row[3], row[4]
            g_ids, b_ids = tok.encode(gw, add_special_tokens=False).ids, tok.encode(bw, add_special_tokens=False).ids
            unk = tok.token_to_id("[UNK]")
            ids = tok.encode(text).ids
            if len(g_ids) != 1 or len(b_ids) != 1 or unk in g_ids + b_ids:
                out.append((kind, cond, None, "not one token"))
                continue
            if len(ids) > length:
                out.append((kind, cond, None, "too long"))
                continue
            pos = ids.index(tok.token_to_id("[MASK]"))
            logits = np.asarray(forward(model, np.array([ids + [0] * (length - len(ids))], np.int32)))[0, pos]
            out.append((kind, cond, float(logits[g_ids[0]]), float(logits[b_ids[0]])))
    return out


def test_agreement_matches_logits(mlm_run):
    out = mlm_run / "analysis"
    res = json.loads(invoke("analyze", "agreement", "--ckpt", mlm_run, "--sample", "--json").stdout)
    expected = expected_scores(mlm_run)
    # per condition: scored items, skipped items, accuracy, from the logits computed above
    want: dict = {}
    for kind, cond, g, b in expected:
        w = want.setdefault((kind, cond), [0, 0, 0])
        w[0] += 1
        if g is None:
            w[1] += 1
        else:
            w[2] += int(g > b)
    assert any(w[1] < w[0] for w in want.values()), "the tiny vocabulary should cover some items"
    assert any(w[1] > 0 for w in want.values()), "some items should be skipped (forms not one token)"
    table = read_csv(out / "agreement_table5.csv")
    assert [r["label"] for r in table[:13]] == [t[2] for t in agreement.TABLE5]
    assert float(table[0]["paper_bigs"]) == 100.0 and float(table[12]["paper_bert"]) == 75.9
    for r in table:
        n, skipped, correct = want[("marvin", r["condition"])]
        assert (int(r["items"]), int(r["skipped"]), int(r["correct"])) == (n, skipped, correct), r
        if n > skipped:
            assert float(r["accuracy"]) == pytest.approx(100 * correct / (n - skipped), abs=0.01)
        else:
            assert r["accuracy"] == ""
    attractors = read_csv(out / "agreement_attractors.csv")
    assert [int(r["attractors"]) for r in attractors] == [1, 2, 3, 4]
    for r in attractors:
        assert [int(r[k]) for k in ("items", "skipped", "correct")] == want[("attractors", r["attractors"])]
    # the per-item scores are the logits at the masked slot
    items = read_csv(out / "agreement_items.csv")
    assert len(items) == len(expected)
    for r, (_, _, g, b) in zip(items, expected, strict=True):
        if g is None:
            assert r["skipped"] == b
        else:
            assert float(r["score_good"]) == pytest.approx(g, abs=1e-4)
            assert float(r["score_bad"]) == pytest.approx(b, abs=1e-4)
    assert res["headline"]["items"] == len(expected)
    assert res["headline"]["skipped"] == sum(g is None for _, _, g, _ in expected)
    marvin = [g > b for kind, _, g, b in expected if kind == "marvin" and g is not None]
    assert res["headline"]["table5_accuracy"] == pytest.approx(100 * sum(marvin) / len(marvin), abs=0.01)
    for name in ("agreement_table5.png", "agreement_attractors.png"):
        assert (out / name).stat().st_size > 5000
    assert "| Simple |" in (out / "agreement_table5.md").read_text()


def test_agreement_needs_data_and_an_mlm(mlm_run, tmp_path):
    res = invoke("analyze", "agreement", "--ckpt", mlm_run, code=2)
    assert "--data" in res.output
    bad = tmp_path / "bad.tsv"
    bad.write_text("only\ttwo\n")
    res = invoke("analyze", "agreement", "--ckpt", mlm_run, "--data", bad, code=2)
    assert "bad.tsv:1" in res.output and "4 tab-separated columns" in res.output


def test_read_stimuli_layouts(tmp_path):
    f = tmp_path / "stim.tsv"
    f.write_text(
        "obj_rel_across_inanim\tsing\tthe movie that the guards like is good\tthe movie that the guards like are good\n"
        "simple_agrmt\tsing\tthe author laughs\tthe authors laugh\n"  # two words differ: dropped, as Goldberg did
        "2\tthe key to the cabinets is here\tthe key to the cabinets ***mask*** here\tis\tare\n"
    )
    items = agreement.read_stimuli(f)
    assert items == [
        agreement.Item("marvin", "obj_rel_across_anim", "the movie that the guards like", "good .", "is", "are"),
        agreement.Item("attractors", "2", "the key to the cabinets", "here", "is", "are"),
    ]


# ----------------------------------------------------------------------------- cola


def shuffled(line: str, seed: int) -> str:
    import random

    words = line.rstrip(".").split()
    random.Random(seed).shuffle(words)
    return " ".join(words) + "."


def write_rows(path: Path, rows: list[tuple[str, int]]):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sentence", "label"])
        w.writerows(rows)


@pytest.fixture(scope="module")
def cola_run(mlm_run):
    """A tiny CoLA-like finetune (`--task cola` on local files): scrambled sentences are unacceptable. The
    validation split is the shipped annotated sample plus longer sentences, so several length bins fill."""
    tmp = mlm_run.parent.parent
    train = [(s, 1) for s in english_lines(32, seed=7)] + [
        (shuffled(s, i), 0) for i, s in enumerate(english_lines(32, seed=8))
    ]
    val = [(r["sentence"], int(r["label"])) for r in cola_sample()]
    val += [(s, 1) for s in english_lines(6, seed=9)] + [
        (shuffled(s, i) + " again", 0) for i, s in enumerate(english_lines(6, seed=10))
    ]
    write_rows(tmp / "cola_train.csv", train)
    write_rows(tmp / "cola_val.csv", val)
    invoke(
        "finetune",
        "--ckpt",
        mlm_run,
        "--task",
        "cola",
        "--train-file",
        tmp / "cola_train.csv",
        "--validation-file",
        tmp / "cola_val.csv",
        "--set",
        f"train.out_dir={tmp / 'runs'}",
        "--set",
        "train.learning_rate=5e-3",
        "--set",
        "train.epochs=6",
        "-q",
    )
    (run_dir,) = [d for d in (tmp / "runs").iterdir() if d.name != "mlm" and "cola" in d.name]
    return run_dir, val


def independent_predictions(run_dir: Path, sentences: list[str]) -> np.ndarray:
    """Argmax of the classifier on each sentence, tokenised and padded to the task length here."""
    from flax import nnx

    from ssmlm.runs import open_run

    run = open_run(run_dir)
    model, _ = run.load_model()
    tok = run.tokenizer()
    length = run.recipe.task.max_seq_length or run.recipe.model.max_seq_length
    forward = nnx.jit(lambda m, ids, mask: m(ids, mask))
    ids = np.zeros((len(sentences), length), np.int32)
    for i, s in enumerate(sentences):
        e = tok.encode(s).ids[:length]
        ids[i, : len(e)] = e
    return np.asarray(forward(model, ids, (ids != 0).astype(np.int32))).argmax(-1)


def test_cola_by_length_and_category(cola_run):
    run_dir, val = cola_run
    out = run_dir / "analysis"
    res = json.loads(
        invoke("analyze", "cola", "--ckpt", run_dir, "--annotations", cola.SAMPLE, "--bins", "4,6,9", "--json").stdout
    )
    sentences = [s for s, _ in val]
    gold = np.array([label for _, label in val])
    pred = independent_predictions(run_dir, sentences)
    rows = read_csv(out / "cola_predictions.csv")
    assert [r["sentence"] for r in rows] == sentences
    np.testing.assert_array_equal([int(r["prediction"]) for r in rows], pred)
    assert len(set(pred.tolist())) == 2, "a classifier that predicts one class makes every MCC 0: a weak test"
    from sklearn.metrics import matthews_corrcoef

    assert res["mcc"] == pytest.approx(matthews_corrcoef(gold, pred), abs=1e-6)

    # Figure 7: bins 1-4, 5-6, 7-9, 10+ words
    words = np.array([len(s.split()) for s in sentences])
    bins = {"1-4": (1, 4), "5-6": (5, 6), "7-9": (7, 9), "10+": (10, 10**6)}
    length = read_csv(out / "cola_length.csv")
    assert [r["bin"] for r in length] == list(bins)
    for r in length:
        lo, hi = bins[r["bin"]]
        keep = (words >= lo) & (words <= hi)
        assert int(r["n"]) == keep.sum() > 0
        assert float(r["mcc"]) == pytest.approx(matthews(pred[keep], gold[keep]), abs=1e-6)
        assert float(r["accuracy"]) == pytest.approx((pred[keep] == gold[keep]).mean(), abs=1e-6)

    # Figure 9: each phenomenon's sentences, read from the annotation file here
    sample = cola_sample()
    names = [c for c in sample[0] if c not in ("sentence", "label")]
    cats = read_csv(out / "cola_categories.csv")
    assert [r["category"] for r in cats] == names and len(names) == 15
    index = {s: i for i, s in enumerate(sentences)}
    nonzero = 0
    for r in cats:
        idx = [index[a["sentence"]] for a in sample if a[r["category"]] == "1"]
        assert int(r["n"]) == len(idx)
        want = matthews_corrcoef(gold[idx], pred[idx]) if len(set(gold[idx]) | set(pred[idx])) > 1 else 0.0
        assert float(r["mcc"]) == pytest.approx(want, abs=1e-6), r
        nonzero += want != 0
    assert nonzero >= 3
    assert res["annotated"] == len(sample) and res["annotations_unmatched"] == 0
    for name in ("cola_length.png", "cola_categories.png"):
        assert (out / name).stat().st_size > 5000


def test_cola_report_and_errors(cola_run, mlm_run, tmp_path):
    from ssmlm.runs import open_run

    run_dir, _ = cola_run
    assert cola.for_report(open_run(mlm_run), tmp_path) is None  # a pretraining run: not applicable
    assert agreement.for_report(open_run(run_dir), tmp_path) is None  # a finetuned run has no MLM head
    shipped = sum(1 for p in agreement.SAMPLES for _ in agreement.read_stimuli(p))
    report = agreement.for_report(open_run(mlm_run), tmp_path / "agreement")
    assert report["figure"] == agreement.FIGURE and report["numbers"]["items"] == shipped == 52 + 12
    assert all(Path(p).is_file() for p in report["images"] + report["data"])
    report = cola.for_report(open_run(run_dir), tmp_path / "report")
    assert report["figure"] == "BiGS Figure 7" and len(report["images"]) == 1  # no annotation file: lengths only
    assert set(report["numbers"]) >= {"mcc", "1-5", "21+"}
    import shutil

    shutil.copy(cola.SAMPLE, run_dir / "cola_annotations.tsv")  # found there: Figure 9 joins the report
    try:
        report = cola.for_report(open_run(run_dir), tmp_path / "report")
    finally:
        (run_dir / "cola_annotations.tsv").unlink()
    assert report["figure"] == cola.FIGURE and len(report["images"]) == 2
    assert read_csv(tmp_path / "report" / "cola_categories.csv")[0]["category"] == "Simple"
    res = invoke("analyze", "cola", "--ckpt", mlm_run, code=2)
    assert "not a CoLA-finetuned run" in res.output
    res = invoke("analyze", "cola", "--ckpt", run_dir, "--bins", "5,3", code=2)
    assert "--bins" in res.output
    bad = tmp_path / "ann.tsv"
    bad.write_text("sentence\tBinding\nThe dog barked.\tyes\n")
    res = invoke("analyze", "cola", "--ckpt", run_dir, "--annotations", bad, code=2)
    assert "ann.tsv:2" in res.output and "'Binding'" in res.output
