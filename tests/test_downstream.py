"""finetune and evaluate for every task type, from files in each benchmark's own layout written here:
GLUE TSVs (classification, pair classification, regression, test-set submission), SQuAD JSON (span),
SCROLLS JSONL (QuALITY multiple choice, ContractNLI), the MNLI initialisation, seeds and the table."""

import json
import os

import numpy as np
import pytest
from conftest import english_lines, invoke
from flax import nnx

from ssmlm.runs import open_run


def tsv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(map(str, r)) for r in rows) + "\n")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny pretrained BiGS run and a folder of task files."""
    tmp = tmp_path_factory.mktemp("downstream")
    os.chdir(tmp)
    corpus = tmp / "corpus.txt"
    corpus.write_text("\n".join(english_lines(2000)))
    (tmp / "r.yaml").write_text(
        f"""
base: default
model: {{hidden_size: 16, num_layers: 1, intermediate_size: 32, max_seq_length: 48, num_ssm: 8}}
data: {{source: "{corpus}", vocab_size: 200}}
objective: {{duplicate_factor: 1}}
train: {{steps: 4, batch_size: 8, eval_every: 0, checkpoint_every: 0, out_dir: "{tmp / "runs"}"}}
"""
    )
    invoke("pretrain", tmp / "r.yaml", "--name", "base", "-q")
    lines = english_lines(120, seed=7)
    g = tmp / "glue"
    animal = lambda s: int(any(w in s.lower() for w in ("cat", "dog", "bird")))  # noqa: E731
    tsv(g / "SST-2/train.tsv", [["sentence", "label"], *[[s, animal(s)] for s in lines[:96]]])
    tsv(g / "SST-2/dev.tsv", [["sentence", "label"], *[[s, animal(s)] for s in lines[96:]]])
    tsv(g / "SST-2/test.tsv", [["index", "sentence"], *[[i, s] for i, s in enumerate(lines[:10])]])
    nli = ["entailment", "neutral", "contradiction"]
    head = ["index", "promptID", "pairID", "genre", "s1bp", "s2bp", "s1p", "s2p", "sentence1", "sentence2", "label1"]
    mnli = lambda rows: (
        [head + ["gold_label"]]
        + [  # noqa: E731
            [i, 0, 0, "g", "", "", "", "", a, b, nli[i % 3], nli[i % 3]] for i, (a, b) in enumerate(rows)
        ]
    )
    pairs = list(zip(lines, lines[1:], strict=False))
    tsv(g / "MNLI/train.tsv", mnli(pairs[:60]))
    tsv(g / "MNLI/dev_matched.tsv", mnli(pairs[60:80]))
    tsv(g / "MNLI/dev_mismatched.tsv", mnli(pairs[80:100]))
    rte = lambda rows: (
        [["index", "sentence1", "sentence2", "label"]]
        + [  # noqa: E731
            [i, a, b, ["entailment", "not_entailment"][i % 2]] for i, (a, b) in enumerate(rows)
        ]
    )
    tsv(g / "RTE/train.tsv", rte(pairs[:40]))
    tsv(g / "RTE/dev.tsv", rte(pairs[40:60]))
    sts_head = [
        "index",
        "genre",
        "filename",
        "year",
        "old_index",
        "source1",
        "source2",
        "sentence1",
        "sentence2",
        "score",
    ]
    sts = lambda rows: (
        [sts_head] + [[i, "g", "f", 2012, i, "s", "s", a, b, (i % 6) * 1.0] for i, (a, b) in enumerate(rows)]
    )  # noqa: E731
    tsv(g / "STS-B/train.tsv", sts(pairs[:40]))
    tsv(g / "STS-B/dev.tsv", sts(pairs[40:60]))
    return tmp


def finetune(base, name, *args):
    sets = [f"train.out_dir={base / 'runs'}", "train.batch_size=8", "train.epochs=1", "train.learning_rate=1e-3"]
    invoke(
        "finetune", "--ckpt", base / "runs/base", "--name", name, "-q", *[x for s in sets for x in ("--set", s)], *args
    )
    return base / "runs" / name


def test_glue_classification_and_submission(base):
    run = finetune(base, "sst2", "--task", "sst2", "--data-dir", base / "glue")
    res = invoke("evaluate", "--ckpt", run)
    ev = json.loads((run / "eval/sst2-validation.json").read_text())
    assert 0 <= ev["metrics"]["accuracy"] <= 1 and ev["arch"] == "bigs" and "accuracy" in res.stdout
    invoke("evaluate", "--ckpt", run, "--split", "test", "--submission", base / "submit")
    lines = (base / "submit/SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 11
    assert {ln.split("\t")[1] for ln in lines[1:]} <= {"0", "1"}


def test_mnli_then_mnli_initialised_rte(base):
    mnli = finetune(base, "mnli", "--task", "mnli", "--data-dir", base / "glue")
    assert json.loads((mnli / "run.json").read_text())["num_labels"] == 3
    r = invoke("evaluate", "--ckpt", mnli, "--split", "validation_mismatched")
    assert "accuracy" in r.stdout
    # RTE from the MNLI run: new 2-way classifier, encoder and pooler from MNLI (a learning rate of 1e-12 keeps
    # them as loaded, to float32 precision; 0 is refused as a mistake)
    rte = finetune(
        base,
        "rte",
        "--init-from",
        mnli,
        "--task",
        "rte",
        "--data-dir",
        base / "glue",
        "--set",
        "train.learning_rate=1e-12",
    )
    src, _ = open_run(mnli).load_model()
    dst, _ = open_run(rte).load_model()
    same = lambda a, b: np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), rtol=0, atol=1e-8)  # noqa: E731
    same(dst.pooler.dense.kernel, src.pooler.dense.kernel)
    same(dst.encoder.layers[0].w_v.kernel, src.encoder.layers[0].w_v.kernel)
    assert dst.classifier.kernel.shape == (16, 2)
    # same label space (MNLI again): the classifier is copied too
    again = finetune(
        base,
        "mnli2",
        "--init-from",
        mnli,
        "--task",
        "mnli",
        "--data-dir",
        base / "glue",
        "--set",
        "train.learning_rate=1e-12",
    )
    m2, _ = open_run(again).load_model()
    same(m2.classifier.kernel, src.classifier.kernel)


def test_stsb_regression_and_seeds(base):
    invoke(
        "finetune",
        "--ckpt",
        base / "runs/base",
        "--task",
        "stsb",
        "--data-dir",
        base / "glue",
        "--name",
        "stsb",
        "--seeds",
        "1,2",
        "-q",
        "--set",
        f"train.out_dir={base / 'runs'}",
        "--set",
        "train.batch_size=8",
        "--set",
        "train.epochs=1",
    )
    seeds = json.loads((base / "runs/stsb-seeds.json").read_text())
    assert seeds["seeds"] == [1, 2] and set(seeds["final"]) == {"pearson", "spearman"}
    assert len(seeds["final"]["pearson"]["values"]) == 2
    assert json.loads((base / "runs/stsb-seed1/run.json").read_text())["num_labels"] == 1


def test_squad_span_extraction(base):
    d = base / "squad"
    d.mkdir()
    lines = english_lines(60, seed=3)

    def doc(rows, start):
        paras = []
        for i, s in enumerate(rows):
            ans = s.split()[1]  # the verb, e.g. "saw"
            answers = [{"text": ans, "answer_start": s.index(ans)}]
            qa = {"id": f"{start + i}", "question": f"What did {s.split()[0]} do?", "answers": answers}
            paras.append({"context": s, "qas": [qa]})
        return {"version": "1.1", "data": [{"title": "t", "paragraphs": paras}]}

    (d / "train-v1.1.json").write_text(json.dumps(doc(lines[:48], 0)))
    (d / "dev-v1.1.json").write_text(json.dumps(doc(lines[48:], 100)))
    run = finetune(base, "squad", "--task", "squad", "--data-dir", d)
    assert json.loads((run / "run.json").read_text())["head"] == "span"
    invoke("evaluate", "--ckpt", run)
    m = json.loads((run / "eval/squad-validation.json").read_text())["metrics"]
    assert 0 <= m["exact_match"] <= 100 and 0 <= m["f1"] <= 100 and m["total"] == 12


def scrolls_rows(kind, n, seed):
    rows = []
    for i, s in enumerate(english_lines(n, seed)):
        if kind == "quality":
            opts = ["the cat", "a dog", "my sister", "the farmer"]
            body = "".join(f" ({c}) {o}\n" for c, o in zip("ABCD", opts, strict=True))
            rows.append(
                {"id": f"q{i}", "pid": f"q{i}", "input": f"Who acted?\n\n{body}\n\n\n{s}", "output": opts[i % 4]}
            )
        else:
            label = ["Entailment", "Contradiction", "Not mentioned"][i % 3]
            rows.append({"id": f"c{i}", "pid": f"c{i}", "input": f"The party may share data.\n\n{s}", "output": label})
    return rows


@pytest.mark.parametrize("task", ["quality", "contract_nli"])
def test_scrolls_tasks(base, task):
    d = base / task
    d.mkdir()
    for split, n, seed in (("train", 24, 1), ("validation", 9, 2)):
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in scrolls_rows(task, n, seed)))
    run = finetune(base, task, "--task", task, "--data-dir", d)
    info = json.loads((run / "run.json").read_text())
    assert info["head"] == ("choice" if task == "quality" else "classify")
    invoke("evaluate", "--ckpt", run)
    assert 0 <= json.loads((run / f"eval/{task}-validation.json").read_text())["metrics"]["accuracy"] <= 1


def test_results_table(base):
    if not (base / "runs/sst2/eval").exists():
        pytest.skip("needs test_glue_classification_and_submission")
    out = base / "table.md"
    r = invoke("results", base / "runs/sst2", base / "runs/mnli", "--out", out)
    assert "SST2" in r.stdout and "gated / ssm" in r.stdout and out.is_file()
    assert r.stdout.startswith("validation split\n"), r.stdout  # which scores these are


def test_model_is_a_multiple_choice_head(base):
    run = base / "runs/quality"
    if not run.exists():
        pytest.skip("needs test_scrolls_tasks")
    model, _ = open_run(run).load_model()
    assert model.classifier.kernel.shape == (16, 1)
    assert isinstance(nnx.state(model, nnx.Param), nnx.State)


# ----------------------------------------------------------------------------- choosing the best validation


def test_best_validation_by_the_task_selection_metric(tmp_path):
    from ssmlm.data.tasks import get_task
    from ssmlm.train.parts import best_validation

    rows = [
        {"step": 10, "split": "train", "loss": 1.0, "spearman": 0.99},  # not a validation row
        {"step": 10, "split": "validation", "pearson": 0.50, "spearman": 0.40},
        {"step": 20, "split": "validation", "pearson": 0.80, "spearman": 0.55},  # best by Pearson
        {"step": 30, "split": "validation", "pearson": 0.70, "spearman": 0.65},  # best by Spearman
        {"step": 40, "split": "validation", "pearson": 0.60, "spearman": float("nan")},  # skipped, not compared
        {"step": 50, "split": "validation", "pearson": 0.60, "spearman": 0.65},  # a tie: the earlier row stays
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stsb = get_task("stsb")
    assert stsb.metrics[0] == "pearson" and stsb.selection == "spearman"
    assert best_validation(path, stsb.selection)["step"] == 30
    assert best_validation(path, "pearson")["step"] == 20
    assert best_validation(path, "matthews") is None
    others = {t: get_task(t).selection for t in ("sst2", "mnli", "cola", "mrpc", "qqp", "squad", "quality")}
    assert others == {
        "sst2": "accuracy",
        "mnli": "accuracy",
        "cola": "matthews",
        "mrpc": "f1",
        "qqp": "f1",
        "squad": "f1",
        "quality": "accuracy",
    }


def test_local_regression_task_selects_spearman(tmp_path):
    from ssmlm.data.tasks import TaskDef, load_task
    from ssmlm.recipe import TaskConfig

    f = tmp_path / "scores.csv"
    f.write_text("text,score\na b,0.5\nc d,1.5\n")
    td = load_task(TaskConfig(train_file=str(f), text_fields=["text"], label_field="score", num_labels=1)).definition
    assert td.metrics == ("pearson", "spearman") and td.selection == "spearman"
    td = load_task(TaskConfig(train_file=str(f), text_fields=["text"], label_field="score", num_labels=2)).definition
    assert td.selection == "accuracy"
    assert TaskDef("t", ("x",), num_labels=1, metrics=("pearson", "spearman"), select="pearson").selection == "pearson"
    with pytest.raises(ValueError, match="not one of its metrics"):
        TaskDef("t", ("x",), metrics=("accuracy",), select="f1")


def test_stsb_summary_best_is_by_spearman(base):
    run = base / "runs/stsb-seed1"
    if not run.exists():
        pytest.skip("needs test_stsb_regression_and_seeds")
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    val = [r for r in rows if r.get("split") == "validation"]
    best = json.loads((run / "summary.json").read_text())["best_validation"]
    assert best["spearman"] == max(r["spearman"] for r in val)
