"""Result tables in the BiGS Table 1 layout, from evaluate JSON files."""

import json

import pandas as pd
import pytest

from ssmlm.evaluate.tables import LONG_TASKS, results_table, save_table, to_markdown


def result(tmp_path, name, task, metrics, split="validation", **labels):
    p = tmp_path / f"{name}.json"
    p.write_text(
        json.dumps({"run": f"runs/{name}", "task": task, "split": split, "step": 100, "metrics": metrics, **labels})
    )
    return p


@pytest.fixture
def files(tmp_path):
    bigs = {"arch": "gated", "route": "ssm"}
    return [
        result(tmp_path, "b-mnli", "mnli", {"accuracy": 0.826}, **bigs),
        result(tmp_path, "b-mnli-mm", "mnli", {"accuracy": 0.5}, split="validation_mismatched", **bigs),  # not Table 1
        result(tmp_path, "b-qqp", "qqp", {"f1": 0.876, "accuracy": 0.9}, **bigs),  # QQP column is F1
        result(tmp_path, "b-cola1", "cola", {"matthews": 0.60}, **bigs),
        result(tmp_path, "b-cola2", "cola", {"matthews": 0.66}, **bigs),  # seeds are averaged: 63.0
        result(tmp_path, "b-stsb", "stsb", {"pearson": 0.7, "spearman": 0.884}, **bigs),
        result(tmp_path, "bert-rte", "rte", {"accuracy": 0.768}, arch="stack", route="att"),
        result(tmp_path, "bert-mrpc", "mrpc", {"f1": 0.908, "accuracy": 0.85}, arch="stack", route="att"),
        result(tmp_path, "plain-sst2", "sst2", {"accuracy": 0.915}),  # no labels: the run's name
        result(tmp_path, "b-qnli", "qnli", {"accuracy": 0.892}, arch="bigs"),  # arch only: the paper's route
        result(tmp_path, "x-qnli", "qnli", {"accuracy": 0.5}, arch="bigs", label="BiGS short"),  # explicit label
        result(tmp_path, "mlm", "mlm", {"mlm_loss": 2.0}),  # not a table task
    ]


def test_table_layout_and_average(files):
    df = results_table(files)
    assert list(df.columns) == ["MNLI", "QNLI", "QQP", "RTE", "SST2", "MRPC", "COLA", "STSB", "AVG"]
    assert list(df.index) == ["gated / ssm", "stack / att", "plain-sst2", "BiGS short"]
    assert df.index.name == "model"
    bigs = df.loc["gated / ssm"]
    assert bigs["MNLI"] == pytest.approx(82.6) and bigs["QQP"] == pytest.approx(87.6)
    assert bigs["COLA"] == pytest.approx(63.0) and bigs["STSB"] == pytest.approx(88.4)
    assert bigs["QNLI"] == pytest.approx(89.2) and pd.isna(bigs["RTE"])
    assert bigs["AVG"] == pytest.approx((82.6 + 89.2 + 87.6 + 63.0 + 88.4) / 5)  # mean of the available columns
    assert df.loc["stack / att", "MRPC"] == pytest.approx(90.8) and df.loc["stack / att", "RTE"] == pytest.approx(76.8)
    assert df.loc["plain-sst2", "AVG"] == pytest.approx(91.5)
    mm = results_table(files, split="validation_mismatched")
    assert list(mm.index) == ["gated / ssm"] and mm.loc["gated / ssm", "MNLI"] == pytest.approx(50.0)


def test_markdown_and_csv(files, tmp_path):
    df = results_table(files)
    md = to_markdown(df)
    lines = md.splitlines()
    assert lines[0].split("|")[1].strip() == "model" and lines[0].split("|")[-2].strip() == "AVG"
    assert set(lines[1]) <= {"|", "-", ":"}
    assert lines[2].startswith("| gated / ssm") and "82.6" in lines[2] and "63.0" in lines[2]
    assert lines[2].split("|")[2].strip() == "82.6" and lines[2].split("|")[5].strip() == "-"  # missing: '-'
    assert len({len(line) for line in lines}) == 1  # aligned columns
    assert save_table(df, tmp_path / "t.md").read_text() == md
    back = pd.read_csv(save_table(df, tmp_path / "t.csv"), index_col="model")
    assert back.loc["gated / ssm", "MNLI"] == pytest.approx(82.6)


def test_long_task_columns(tmp_path):
    files = [
        result(tmp_path, "s", "squad", {"exact_match": 80.0, "f1": 89.5}, arch="BiGS"),
        result(tmp_path, "q", "quality", {"accuracy": 0.323}, arch="BiGS"),
        result(tmp_path, "c", "contract_nli", {"accuracy": 0.687}, arch="BiGS"),
    ]
    df = results_table(files, columns=LONG_TASKS, average=False)
    assert df.loc["BiGS"].tolist() == pytest.approx([89.5, 32.3, 68.7]) and "AVG" not in df
