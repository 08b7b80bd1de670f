"""A local task's labels as a user's files hold them (-1/1, 0/1, pos/neg) through `finetune` and `evaluate`: one
sorted label map from the training file, kept in the run and used for evaluation and predictions; a held-out
validation split when no validation file is given; header-less files; and every bad label or file refused at once
in one line, before any run directory exists."""

import csv
import json
from types import SimpleNamespace

import pytest
from conftest import english_lines, invoke

from ssmlm.data.config import TaskConfig
from ssmlm.data.tasks import load_task, local_task_name
from ssmlm.errors import DataError


def animal(sentence: str) -> int:
    return int(any(w in sentence for w in ("cat", "dog", "bird")))


def write_csv(path, rows, header=("sentence", "label")):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(header)
        w.writerows(rows)
    return path


@pytest.fixture(scope="module")
def env(tiny_encoder, tmp_path_factory):
    """The shared tiny encoder (finetuned into a folder of this module's own) and the same sentences labelled
    three ways: -1/1, 0/1 and neg/pos."""
    tmp = tmp_path_factory.mktemp("labels")
    (tmp / "runs").mkdir()
    train, dev = english_lines(96, seed=11), english_lines(40, seed=12)
    sign = lambda s: 2 * animal(s) - 1  # noqa: E731
    write_csv(tmp / "polarity-train.csv", [(s, sign(s)) for s in train])
    write_csv(tmp / "polarity-dev.csv", [(s, sign(s)) for s in dev])
    write_csv(tmp / "binary-train.csv", [(s, animal(s)) for s in train])
    write_csv(tmp / "binary-dev.csv", [(s, animal(s)) for s in dev])
    words = lambda s: "pos" if animal(s) else "neg"  # noqa: E731
    (tmp / "words_train.jsonl").write_text(
        "".join(json.dumps({"sentence": s, "label": words(s)}) + "\n" for s in train)
    )
    return SimpleNamespace(tmp=tmp, runs=tmp / "runs", base=tiny_encoder, train=train, dev=dev)


def finetune(env, *args):
    sets = [
        f"train.out_dir={env.runs}",
        "train.batch_size=8",
        "train.epochs=1",
        "train.learning_rate=1e-3",
        "train.seed=3",
    ]
    r = invoke("finetune", "--ckpt", env.base, *[x for s in sets for x in ("--set", s)], *args)
    return r


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def read_predictions(path) -> list[str]:
    with path.open() as f:
        return [row["prediction"] for row in csv.DictReader(f)]


def test_minus_one_and_one_are_classes_and_match_their_zero_one_recoding(env):
    r = finetune(
        env,
        "--task",
        "polarity",
        "--train-file",
        env.tmp / "polarity-train.csv",
        "--validation-file",
        env.tmp / "polarity-dev.csv",
    )
    n_pos = sum(animal(s) for s in env.train)
    assert f"labels: -1 → 0 ({len(env.train) - n_pos:,}), 1 → 1 ({n_pos:,})" in r.output
    run = env.runs / f"{env.base.name}-polarity"
    info = json.loads((run / "run.json").read_text())
    assert info["task"] == "polarity" and info["label_names"] == [-1, 1] and info["num_labels"] == 2
    finetune(env, "--train-file", env.tmp / "binary-train.csv", "--validation-file", env.tmp / "binary-dev.csv")
    recoded = env.runs / f"{env.base.name}-binary"  # named after the file without its split: binary-train.csv -> binary
    accuracy = summary(run)["validation"]["accuracy"]
    assert accuracy == summary(recoded)["validation"]["accuracy"]

    preds = env.tmp / "polarity-preds.csv"
    r = invoke("evaluate", "--ckpt", run, "--task", "polarity", "--predictions", preds)
    result = json.loads((run / "eval" / "polarity-validation.json").read_text())
    assert result["metrics"]["accuracy"] == pytest.approx(accuracy)
    values = read_predictions(preds)
    assert len(values) == len(env.dev) and set(values) <= {"-1", "1"}  # the file's own values, every row
    gold = [str(2 * animal(s) - 1) for s in env.dev]
    assert sum(p == g for p, g in zip(values, gold, strict=True)) / len(gold) == pytest.approx(accuracy)


def test_string_labels_with_a_held_out_split(env):
    r = finetune(env, "--train-file", env.tmp / "words_train.jsonl")
    n_val = round(len(env.train) * 0.1)
    assert "labels: neg → 0" in r.output and ", pos → 1 (" in r.output
    assert f"validation: 10% of words_train.jsonl held out ({n_val} rows, seed 3)" in r.output
    run = env.runs / f"{env.base.name}-words"
    assert json.loads((run / "run.json").read_text())["label_names"] == ["neg", "pos"]

    preds = env.tmp / "words-preds.tsv"
    r = invoke("evaluate", "--ckpt", run, "--predictions", preds)
    result = json.loads((run / "eval" / "words-validation.json").read_text())
    # the same rows held out again (the run's seed): evaluation agrees with training's last validation
    assert result["metrics"]["accuracy"] == pytest.approx(summary(run)["validation"]["accuracy"])
    lines = preds.read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == n_val + 1
    assert {ln.split("\t")[1] for ln in lines[1:]} <= {"neg", "pos"}

    # an analysis scores the same held-out rows with the same label map (the run's seed is 3, not 0)
    r = invoke("analyze", "length-bins", "--ckpt", run, "--json")
    with (run / "analysis" / "length_bins.csv").open() as f:
        bins = list(csv.DictReader(f))
    assert sum(int(b["n"]) for b in bins) == n_val
    assert sum(int(b["correct"]) for b in bins) / n_val == pytest.approx(result["metrics"]["accuracy"])


def test_header_less_file_reads_columns_by_position(env):
    rows = [(s, "pos" if animal(s) else "neg") for s in env.train]
    path = write_csv(env.tmp / "nohead.csv", rows, header=None)
    invoke("finetune", "--ckpt", env.base, "--train-file", path, "--no-header", "--dry-run")
    data = load_task(TaskConfig(train_file=str(path), header=False), seed=0)
    assert data.definition.text_fields == ("0",) and data.definition.label_field == "1"
    assert data.label_names == ["neg", "pos"]
    assert len(data.splits["train"]["0"]) + len(data.splits["validation"]["0"]) == len(env.train)
    three = env.tmp / "three.tsv"
    three.write_text("".join(f"{i}\t{s}\t{animal(s)}\n" for i, s in enumerate(env.train)))
    data = load_task(TaskConfig(train_file=str(three), header=False, text_fields=[1], label_field=2))
    assert data.definition.text_fields == ("1",) and data.label_names == [0, 1]
    pair = load_task(TaskConfig(train_file=str(three), header=False)).definition  # by default: text, text, label
    assert pair.text_fields == ("0", "1") and pair.label_field == "2"
    four = env.tmp / "four.tsv"
    four.write_text("".join(f"{i}\ta\t{s}\t{animal(s)}\n" for i, s in enumerate(env.train)))
    with pytest.raises(DataError, match="say which hold the text"):  # four columns: which are text is unclear
        load_task(TaskConfig(train_file=str(four), header=False))


# ----------------------------------------------------------------------------- bad input: one line, at once


def check_refused(env, args, *culprits):
    before = set(env.runs.iterdir())
    r = invoke("finetune", "--ckpt", env.base, "--set", f"train.out_dir={env.runs}", *args, code=None)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    for c in culprits:
        assert str(c) in lines[0], (c, lines[0])
    assert set(env.runs.iterdir()) == before  # no run directory left behind


def test_num_labels_must_match_the_training_labels(env):
    path = write_csv(env.tmp / "three-train.csv", [(s, i % 3) for i, s in enumerate(env.train)])
    check_refused(
        env, ["--train-file", path, "--num-labels", "2"], "--num-labels 2", "holds 3 distinct", "0, 1, 2", path.name
    )


def test_unseen_label_in_validation(env):
    dev = write_csv(env.tmp / "odd-dev.csv", [(env.dev[0], 1), (env.dev[1], "maybe")])
    check_refused(
        env,
        ["--train-file", env.tmp / "polarity-train.csv", "--validation-file", dev],
        dev.name,
        "line 3",
        "'maybe'",
        "-1, 1",
    )


def test_unseen_label_in_test(env):
    test = write_csv(env.tmp / "odd-test.csv", [(env.dev[0], 0)])
    check_refused(
        env,
        ["--train-file", env.tmp / "polarity-train.csv", "--set", f"task.test_file={test}"],
        test.name,
        "line 2",
        "label 0",
        "-1, 1",
    )


def test_regression_needs_numbers(env):
    first = "'pos'" if animal(env.train[0]) else "'neg'"
    check_refused(
        env,
        ["--train-file", env.tmp / "words_train.jsonl", "--num-labels", "1"],
        "words_train.jsonl",
        "line 1",
        first,
        "not a number",
    )


def test_header_less_file_is_detected(env):
    path = write_csv(env.tmp / "bare.csv", [(s, 2 * animal(s) - 1) for s in env.train], header=None)
    check_refused(env, ["--train-file", path], path.name, "looks like data", "--no-header")


def test_one_label_only_and_non_whole_numbers(env):
    one = write_csv(env.tmp / "one.csv", [(s, "pos") for s in env.train])
    check_refused(env, ["--train-file", one], "one.csv", "one label only", "'pos'")
    scores = write_csv(env.tmp / "scores.csv", [(s, i / 4) for i, s in enumerate(env.train)])
    check_refused(env, ["--train-file", scores], "scores.csv", "not whole", "--num-labels 1")


# ----------------------------------------------------------------------------- no model needed


def test_label_map_is_sorted_numerically_then_as_text(tmp_path):
    rows = [("a b", "10"), ("c d", "9"), ("e f", "-1"), ("g h", "9")]
    data = load_task(TaskConfig(train_file=str(write_csv(tmp_path / "n.csv", rows)), validation_fraction=0))
    assert data.label_names == [-1, 9, 10] and data.splits["train"]["label"] == [2, 1, 0, 1]
    assert data.definition.num_labels == 3 and data.notes[0] == "labels: -1 → 0 (1), 9 → 1 (2), 10 → 2 (1)"
    test = write_csv(tmp_path / "t.csv", [("x y", ""), ("z w", "9.0")])  # an empty test label is unscored
    data = load_task(TaskConfig(train_file=str(tmp_path / "n.csv"), test_file=str(test), validation_fraction=0))
    assert data.splits["test"]["label"] == [-1, 1]


def test_held_out_split_follows_the_seed(tmp_path):
    path = write_csv(tmp_path / "s.csv", [(f"sentence {i}", i % 2) for i in range(50)])
    split = lambda seed: load_task(TaskConfig(train_file=str(path)), seed=seed).splits  # noqa: E731
    a, b, c = split(0), split(0), split(1)
    assert a["validation"] == b["validation"] and a["validation"] != c["validation"]
    assert len(a["validation"]["sentence"]) == 5 and len(a["train"]["sentence"]) == 45
    assert not set(a["validation"]["sentence"]) & set(a["train"]["sentence"])


@pytest.mark.parametrize(
    "file, name",
    [
        ("polarity-train.csv", "polarity"),
        ("polarity_train.jsonl", "polarity"),
        ("polarity.train.tsv", "polarity"),
        ("data/sst/train.csv", "train"),
        ("reviews.csv", "reviews"),
        ("training.csv", "training"),
    ],
)
def test_local_task_is_named_after_its_file_without_the_split(file, name):
    assert local_task_name(file) == name


# ----------------------------------------------------------------------------- label files that mislead


def refused(env, *args):
    """`finetune ARGS` on the shared encoder: exit 2, one `error:` line (returned), no run directory written."""
    before = sorted(p.relative_to(env.runs) for p in env.runs.rglob("*"))
    r = invoke("finetune", "--ckpt", env.base, "--set", f"train.out_dir={env.runs}", *map(str, args), code=None)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert sorted(p.relative_to(env.runs) for p in env.runs.rglob("*")) == before
    return lines[0]


def test_label_first_file_gets_the_flags_that_read_it(env):
    # Pang & Lee's polarity file as it comes: no header, the label first
    path = write_csv(env.tmp / "label-first.csv", [(animal(s), s) for s in env.train], header=None)
    first = refused(env, "--train-file", path)
    assert "--no-header --label-field 0 --text-fields 1" in first, first
    # the default (text first, label last) would make each sentence a class: refused, with the same flags
    again = refused(env, "--train-file", path, "--no-header")
    assert "column '1' does not look like labels" in again and "--no-header --label-field 0 --text-fields 1" in again
    data = load_task(TaskConfig(train_file=str(path), header=False, label_field="0", text_fields=["1"]))
    assert data.label_names == [0, 1] and data.definition.text_fields == ("1",)


def test_many_distinct_scores_are_still_a_regression_task(tmp_path):
    rows = [(f"sentence number {i}", f"{i * 0.037:.3f}") for i in range(120)]  # STS-B-like: 120 distinct scores
    data = load_task(TaskConfig(train_file=str(write_csv(tmp_path / "sts.csv", rows)), num_labels=1))
    assert data.definition.num_labels == 1 and data.splits["train"]["label"][:2] == [0.0, 0.037]


def test_a_long_label_map_is_one_short_line(tmp_path):
    rows = [(f"sentence number {i}", f"class {i % 40} " + "x" * 40) for i in range(400)]
    path = str(write_csv(tmp_path / "many.csv", rows))
    with pytest.raises(DataError, match="does not look like labels"):  # long labels: text, unless counted
        load_task(TaskConfig(train_file=path))
    data = load_task(TaskConfig(train_file=path, num_labels=40, validation_fraction=0))
    (line,) = [n for n in data.notes if n.startswith("labels:")]
    assert line.endswith("… and 30 more") and len(line) < 600, line


@pytest.mark.parametrize(
    "cell, says",
    [("nan", "(the cell reads 'nan')"), ("NaN", "(the cell reads 'NaN')"), ("null", "'null'"), ("", "no label")],
)
def test_an_empty_label_is_refused_where_it_is(env, cell, says):
    rows = [(s, cell if i == 5 else animal(s)) for i, s in enumerate(env.train)]
    path = write_csv(env.tmp / "holes.csv", rows)
    line = refused(env, "--train-file", path)
    assert f"{path}: line 7: no label in column 'label'" in line and says in line, line


def test_an_empty_text_cell_is_refused(env):
    path = write_csv(env.tmp / "blank.csv", [("  " if i == 3 else s, animal(s)) for i, s in enumerate(env.train)])
    assert f"{path}: line 5: empty text in column 'sentence'" in refused(env, "--train-file", path)


def test_labels_differing_in_spaces_are_named(env):
    path = write_csv(env.tmp / "spaced.csv", [(s, " 1" if i == 8 else str(animal(s))) for i, s in enumerate(env.train)])
    line = refused(env, "--train-file", path)
    assert f"{path}: line 10: label ' 1'" in line and "differs from '" in line and "only in the spaces" in line, line


def test_a_tab_separated_file_named_csv_and_a_short_row(env):
    tabbed = env.tmp / "tabbed.csv"
    tabbed.write_text("sentence\tlabel\n" + "".join(f"{s}\t{animal(s)}\n" for s in env.train))
    line = refused(env, "--train-file", tabbed)
    assert "looks tab-separated" in line and "name it .tsv" in line and "quote" not in line, line
    short = env.tmp / "short.csv"
    rows = [f"{s}\n" if i == 2 else f"{s},{animal(s)}\n" for i, s in enumerate(env.train)]  # line 4 lacks its label
    short.write_text("sentence,label\n" + "".join(rows))
    line = refused(env, "--train-file", short)
    assert f"{short}: line 4 has 1 field, the header has 2" in line and "quote" not in line, line
