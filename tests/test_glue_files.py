"""GLUE from the original TSV download: hub column names and label ids, errors, leaderboard files."""

import pytest

from ssmlm.data.glue import read_glue_dir, write_glue_submission
from ssmlm.errors import DataError


def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join("\t".join(map(str, r)) for r in lines) + "\n")


@pytest.fixture
def glue(tmp_path):
    """A tiny glue_data/ folder in the benchmark's own layout, one task per subfolder."""
    g = tmp_path / "glue_data"
    # CoLA train/dev are headerless: source, label, original label, sentence. A quote must stay literal.
    write(g / "CoLA/train.tsv", [["gj04", 1, "", 'He said "hi" to me.'], ["gj04", 0, "*", "Me him saw."]])
    write(g / "CoLA/dev.tsv", [["cj99", 1, "", "The dog barked."]])
    write(g / "CoLA/test.tsv", [["index", "sentence"], [0, "A cat."], [1, 'The "odd" one.']])
    write(g / "SST-2/train.tsv", [["sentence", "label"], ["a fine film ", 1], ['it " stinks', 0], ["meh", 0]])
    mrpc_head = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    write(
        g / "MRPC/train.tsv",
        [mrpc_head, [1, 11, 12, "He left.", "He went away."], [0, 13, 14, "Yes.", "No."]],
    )
    write(g / "MRPC/dev.tsv", [mrpc_head, [1, 15, 16, "Hi.", "Hello."]])
    write(g / "MRPC/test.tsv", [["index", "#1 ID", "#2 ID", "#1 String", "#2 String"], [0, 1, 2, "x", "y"]])
    write(
        g / "QQP/train.tsv",
        [
            ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
            [5, 1, 2, "How?", "How so?", 1],
            [6, 3, 4, "broken row with too few fields"],  # dropped, as the hub does
            [7, 5, 6, "Why?", "When?", 0],
        ],
    )
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
    ]
    write(
        g / "STS-B/dev.tsv",
        [[*sts_head, "score"], [0, "main-news", "f", "2012", 1, "none", "none", "A", "B", "3.800"]],
    )
    mnli_head = [
        "index",
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
        "sentence1",
        "sentence2",
        "label1",
    ]
    rows = [
        [i, 0, 0, "fiction", "(", "(", "(", "(", f"premise {i}", f"hyp {i}", g_]
        for i, g_ in enumerate(["neutral", "entailment", "contradiction"])
    ]
    write(g / "MNLI/train.tsv", [[*mnli_head, "gold_label"], *[[*r, r[-1]] for r in rows]])
    write(g / "MNLI/dev_matched.tsv", [[*mnli_head, "gold_label"], *[[*r, r[-1]] for r in rows[:2]]])
    write(g / "MNLI/dev_mismatched.tsv", [[*mnli_head, "gold_label"], [*rows[2], "contradiction"]])
    write(g / "MNLI/test_matched.tsv", [mnli_head[:-1], *[r[:-1] for r in rows]])
    write(
        g / "QNLI/dev.tsv",
        [
            ["index", "question", "sentence", "label"],
            [0, "Who?", "Me.", "entailment"],
            [1, "What?", 'The "thing".', "not_entailment"],
        ],
    )
    write(
        g / "RTE/train.tsv",
        [
            ["index", "sentence1", "sentence2", "label"],
            [0, "A b.", "A.", "not_entailment"],
            [1, "C d.", "C.", "entailment"],
        ],
    )
    return g


def test_columns_and_labels_match_the_hub(glue):
    cola = read_glue_dir("cola", glue / "CoLA", "train")
    assert cola["sentence"] == ['He said "hi" to me.', "Me him saw."]  # quotes kept verbatim
    assert cola["label"] == [1, 0]
    assert read_glue_dir("cola", glue, "validation")["sentence"] == ["The dog barked."]  # glue root works too
    test = read_glue_dir("cola", glue, "test")
    assert test["sentence"] == ["A cat.", 'The "odd" one.'] and test["label"] == [-1, -1] and test["idx"] == [0, 1]

    sst = read_glue_dir("sst2", glue, "train")
    assert sst["sentence"] == ["a fine film ", 'it " stinks', "meh"] and sst["label"] == [1, 0, 0]

    mrpc = read_glue_dir("mrpc", glue, "train")
    assert set(mrpc) == {"sentence1", "sentence2", "label", "idx"}
    assert mrpc["sentence1"] == ["He left.", "Yes."] and mrpc["label"] == [1, 0]
    assert read_glue_dir("mrpc", glue, "test")["label"] == [-1]

    qqp = read_glue_dir("qqp", glue, "train")
    assert qqp["question1"] == ["How?", "Why?"] and qqp["label"] == [1, 0] and qqp["idx"] == [5, 7]

    sts = read_glue_dir("stsb", glue, "validation")
    assert sts["sentence1"] == ["A"] and sts["label"] == [3.8] and isinstance(sts["label"][0], float)

    # MNLI: hub order entailment 0, neutral 1, contradiction 2; premise/hypothesis names.
    mnli = read_glue_dir("mnli", glue, "train")
    assert mnli["premise"] == ["premise 0", "premise 1", "premise 2"] and mnli["hypothesis"][0] == "hyp 0"
    assert mnli["label"] == [1, 0, 2]
    assert read_glue_dir("mnli", glue, "validation")["label"] == [1, 0]
    assert read_glue_dir("mnli", glue, "validation_mismatched")["label"] == [2]
    assert read_glue_dir("mnli", glue, "test")["label"] == [-1, -1, -1]

    qnli = read_glue_dir("qnli", glue, "validation")
    assert qnli["question"] == ["Who?", "What?"] and qnli["sentence"][1] == 'The "thing".' and qnli["label"] == [0, 1]
    rte = read_glue_dir("RTE", glue, "train")
    assert rte["sentence1"] == ["A b.", "C d."] and rte["label"] == [1, 0]


def test_mrpc_from_the_msr_release(tmp_path):
    d = tmp_path / "MRPC"
    head = ["\ufeffQuality", "#1 ID", "#2 ID", "#1 String", "#2 String"]  # the MSR files start with a BOM
    write(d / "msr_paraphrase_train.txt", [head, [1, 1, 2, "a", "b"], [0, 3, 4, "c", "d"], [1, 5, 6, "e", "f"]])
    write(d / "dev_ids.tsv", [[3, 4]])
    assert read_glue_dir("mrpc", d, "train")["sentence1"] == ["a", "e"]
    dev = read_glue_dir("mrpc", d, "validation")
    assert dev["sentence1"] == ["c"] and dev["label"] == [0]


def test_missing_file_is_a_one_line_error(glue):
    with pytest.raises(DataError) as e:
        read_glue_dir("sst2", glue / "SST-2", "validation")
    msg = str(e.value)
    assert "\n" not in msg and "dev.tsv" in msg and str(glue / "SST-2") in msg
    with pytest.raises(DataError, match="dev_mismatched.tsv"):
        read_glue_dir("mnli", glue / "QNLI", "validation_mismatched")
    with pytest.raises(DataError, match="not a GLUE task"):
        read_glue_dir("squad", glue, "train")
    with pytest.raises(DataError, match="row 1: unexpected label 'maybe'"):
        write(glue / "RTE/dev.tsv", [["index", "sentence1", "sentence2", "label"], [0, "a", "b", "maybe"]])
        read_glue_dir("rte", glue, "validation")


def test_submission_files(tmp_path):
    p = write_glue_submission("mnli", [0, 1, 2], tmp_path)
    assert p.name == "MNLI-m.tsv"
    assert p.read_text().splitlines() == [
        "index\tprediction",
        "0\tentailment",
        "1\tneutral",
        "2\tcontradiction",
    ]
    assert write_glue_submission("mnli-mm", [2], tmp_path).name == "MNLI-mm.tsv"
    rte = write_glue_submission("rte", [1, 0], tmp_path)
    assert rte.read_text().splitlines()[1:] == ["0\tnot_entailment", "1\tentailment"]
    assert write_glue_submission("qnli", [0], tmp_path).read_text().splitlines()[1] == "0\tentailment"
    # Labels from local string columns are sorted (contradiction, entailment, neutral): mapped by name.
    mapped = write_glue_submission("mnli", [0, 2], tmp_path, label_names=["contradiction", "entailment", "neutral"])
    assert mapped.read_text().splitlines()[1:] == ["0\tcontradiction", "1\tneutral"]
    names = {t: write_glue_submission(t, [1], tmp_path).name for t in ("cola", "sst2", "mrpc", "qqp", "stsb")}
    assert names == {
        "cola": "CoLA.tsv",
        "sst2": "SST-2.tsv",
        "mrpc": "MRPC.tsv",
        "qqp": "QQP.tsv",
        "stsb": "STS-B.tsv",
    }
    assert (tmp_path / "CoLA.tsv").read_text() == "index\tprediction\n0\t1\n"
    sts = write_glue_submission("stsb", [-0.4, 2.5, 5.7], tmp_path)
    assert sts.read_text().splitlines()[1:] == ["0\t0.000", "1\t2.500", "2\t5.000"]  # clipped to [0, 5]
