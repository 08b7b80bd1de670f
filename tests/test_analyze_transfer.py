"""`analyze transfer` (BiGS Figure 5), `analyze length-bins` (Figure 6) and `analyze adversarial` (Table 4) on
tiny BiGS and stack/ssm runs finetuned on a generated sentence-pair task: every number they write is checked
against the runs' own files or against predictions computed here straight from the model."""

import csv
import json
import os
import random

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import english_lines, invoke

from ssmlm.analyze import adversarial, length_bins, score_vs_loss
from ssmlm.runs import open_run

ANIMALS = ("cat", "dog", "bird")


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def pair_rows(n, seed):
    """A balanced question-sentence task: is the sentence about an animal (1) or not (0)? The question names one."""
    rng = random.Random(seed)
    lines = english_lines(4 * n, seed)
    about = {1: [s for s in lines if any(a in s.lower() for a in ANIMALS)]}
    about[0] = [s for s in lines if s not in about[1]]
    return [
        {"question": f"is there a {rng.choice(ANIMALS)} here?", "sentence": about[i % 2][i // 2], "label": i % 2}
        for i in range(n)
    ]


def write_pairs(path, rows):
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["question", "sentence", "label"])
        w.writeheader()
        w.writerows(rows)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two pretraining runs (bigs with an `evaluate` MLM result, stack_ssm with validation rows only), each
    finetuned on the pair task; the bigs one also evaluated."""
    tmp = tmp_path_factory.mktemp("transfer")
    os.chdir(tmp)
    corpus = tmp / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"doc{i:02d}.txt").write_text("\n".join(english_lines(30, seed=i)) + "\n")
    out = tmp / "runs"
    (tmp / "r.yaml").write_text(
        f"""
base: default
model: {{hidden_size: 16, num_layers: 1, intermediate_size: 32, max_seq_length: 48, num_ssm: 8}}
data: {{source: "{corpus}", vocab_size: 200, validation_fraction: 0.1}}
objective: {{duplicate_factor: 1}}
train: {{steps: 20, batch_size: 8, learning_rate: 3.0e-3, eval_every: 10, eval_batches: 2, checkpoint_every: 0,
         out_dir: "{out}"}}
"""
    )
    write_pairs(tmp / "pairs.csv", pair_rows(160, 1))
    write_pairs(tmp / "pairs_val.csv", pair_rows(40, 2))
    invoke("pretrain", tmp / "r.yaml", "--name", "bigs", "-q")
    invoke(
        "pretrain",
        tmp / "r.yaml",
        "--name",
        "stack",
        "--set",
        "model.arch=stack_ssm",
        "--set",
        "model.num_heads=2",
        "--set",
        "train.eval_every=5",
        "--set",
        "train.steps=10",
        "-q",
    )
    for src, epochs in (("bigs", 3), ("stack", 1)):
        invoke(
            "finetune",
            "--ckpt",
            out / src,
            "--name",
            f"{src}-pairs",
            "--train-file",
            tmp / "pairs.csv",
            "--validation-file",
            tmp / "pairs_val.csv",
            "--text-fields",
            "question,sentence",
            "--label-field",
            "label",
            "--set",
            f"train.out_dir={out}",
            "--set",
            f"train.epochs={epochs}",
            "--set",
            "train.batch_size=8",
            "--set",
            "train.learning_rate=1e-2",
            "-q",
        )
    invoke("evaluate", "--ckpt", out / "bigs")
    invoke("evaluate", "--ckpt", out / "bigs-pairs")
    return tmp, out


def direct_predictions(run_dir, ids, types, mask):
    """Class predictions straight from the model's forward pass (no evaluation loop, no batching)."""
    model, _ = open_run(run_dir).load_model()
    logits = model(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
    return np.asarray(logits).argmax(-1)


def plain_encoding(run_dir, rows):
    """The pair inputs as the run's tokenizer encodes them, padded to the model length (built here, not by ssmlm)."""
    run = open_run(run_dir)
    tok = run.tokenizer()
    width = run.recipe.model.max_seq_length
    ids, types, mask = (np.zeros((len(rows), width), np.int32) for _ in range(3))
    for i, r in enumerate(rows):
        e = tok.encode(r["question"], r["sentence"])
        assert len(e.ids) <= width
        ids[i, : len(e.ids)], types[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, e.type_ids, 1
    return ids, types, mask


def test_length_bins_equal_a_direct_recomputation(runs):
    tmp, out = runs
    ft = out / "bigs-pairs"
    invoke("analyze", "length-bins", "--ckpt", ft, "--bins", "18,20,22", "--out", tmp / "lb")
    table = read_csv(tmp / "lb" / "length_bins.csv")
    assert [r["bin"] for r in table] == ["1-18", "19-20", "21-22", ">22"]

    rows = pair_rows(40, 2)
    ids, types, mask = plain_encoding(ft, rows)
    preds = direct_predictions(ft, ids, types, mask)
    labels = np.array([r["label"] for r in rows])
    assert 0 < preds.sum() < len(preds), "a constant classifier would make these checks weak"
    lengths = mask.sum(1)
    for r, (lo, hi) in zip(table, [(0, 18), (18, 20), (20, 22), (22, 10**9)], strict=True):
        inside = (lengths > lo) & (lengths <= hi)
        assert int(r["n"]) == inside.sum()
        assert int(r["correct"]) == (preds == labels)[inside].sum()
        if inside.any():
            assert float(r["accuracy"]) == pytest.approx((preds == labels)[inside].mean())
        else:
            assert r["accuracy"] == ""
    assert sum(int(r["n"]) for r in table) == 40 and len({int(r["n"]) > 0 for r in table}) == 2
    ev = json.loads((ft / "eval" / "pairs-validation.json").read_text())
    assert sum(int(r["correct"]) for r in table) / 40 == pytest.approx(ev["metrics"]["accuracy"])
    assert (tmp / "lb" / "length_bins.png").stat().st_size > 5000


def test_transfer_points_are_the_runs_numbers(runs):
    tmp, out = runs
    res = invoke(
        "analyze",
        "transfer",
        "--ckpt",
        out / "bigs-pairs",
        "--ckpt",
        out / "stack-pairs",
        "--out",
        tmp / "tr",
        "--bert-reference",
        "--json",
    )
    assert json.loads(res.stdout)["plot"].endswith("transfer.png")
    bigs, stack = read_csv(tmp / "tr" / "transfer.csv")
    # bigs: the `evaluate` results of both runs
    ev_ft = json.loads((out / "bigs-pairs" / "eval" / "pairs-validation.json").read_text())
    ev_src = json.loads((out / "bigs" / "eval" / "mlm-validation.json").read_text())
    assert (bigs["arch"], bigs["source"], bigs["metric"], bigs["loss_name"]) == ("bigs", "bigs", "accuracy", "mlm_loss")
    assert float(bigs["score"]) == ev_ft["metrics"]["accuracy"]
    assert float(bigs["loss"]) == ev_src["metrics"]["mlm_loss"] and int(bigs["step"]) == ev_src["step"] == 20
    # stack: nothing evaluated, so the best validation row of finetuning and the source's last validation row
    ft_rows = [json.loads(ln) for ln in (out / "stack-pairs" / "metrics.jsonl").read_text().splitlines()]
    src_rows = [json.loads(ln) for ln in (out / "stack" / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in src_rows if r.get("split") == "validation"]
    assert [r["step"] for r in val] == [5, 10]
    assert stack["arch"] == "stack_ssm" and float(stack["loss"]) == val[-1]["mlm_loss"] and int(stack["step"]) == 10
    assert float(stack["score"]) == max(r["accuracy"] for r in ft_rows if r.get("split") == "validation")
    assert "best validation" in stack["score_from"]
    assert (tmp / "tr" / "transfer.png").stat().st_size > 5000
    # runs moved together: the source is found beside the finetuned run
    import shutil

    moved = tmp / "moved"
    for name in ("bigs", "bigs-pairs"):
        shutil.copytree(out / name, moved / name, ignore=shutil.ignore_patterns("checkpoints"))
    info = json.loads((moved / "bigs-pairs" / "run.json").read_text())
    (moved / "bigs-pairs" / "run.json").write_text(json.dumps({**info, "source": "/gone/bigs"}))
    row = score_vs_loss.point(moved / "bigs-pairs")
    assert (row["score"], row["loss"], row["loss_from"]) == (
        float(bigs["score"]),
        float(bigs["loss"]),
        str(moved / "bigs" / "eval" / "mlm-validation.json"),
    )
    shutil.rmtree(moved / "bigs")
    r = invoke("analyze", "transfer", "--ckpt", moved / "bigs-pairs", code=2)
    assert r.exit_code == 2 and "source '/gone/bigs' is not a run directory here" in r.output
    # --metric names another score; one the runs lack is a one-line error
    r = invoke("analyze", "transfer", "--ckpt", out / "bigs-pairs", "--metric", "f1", code=2)
    assert r.exit_code == 2 and "no 'f1' score" in r.output and len(r.output.strip().splitlines()) == 1


def test_distractor_construction_is_documented_and_deterministic(runs):
    _, out = runs
    run = open_run(out / "bigs-pairs")
    tok = run.tokenizer()
    rows = pair_rows(40, 2)[:6]
    ids, types, mask = plain_encoding(out / "bigs-pairs", rows)
    arrays = {
        "input_ids": ids,
        "token_type_ids": types,
        "attention_mask": mask,
        "labels": np.zeros(6, np.int32),
        "example_weight": np.ones(6, np.float32),
    }
    index = np.array([3, 5, 8, 13, 21, 34])
    a = adversarial.with_distractors(arrays, tok, 7, seed=1, index=index)
    assert all(np.array_equal(a[k], v) for k, v in adversarial.with_distractors(arrays, tok, 7, 1, index).items())
    other = adversarial.with_distractors(arrays, tok, 7, seed=2, index=index)
    assert not np.array_equal(a["input_ids"], other["input_ids"])
    words = {w for phrase in adversarial.FILLERS for w in phrase.split()}
    for i in range(6):
        n = mask[i].sum()
        b = int(np.flatnonzero(types[i] == 1)[0])  # the first token of the sentence
        assert tok.id_to_token(int(ids[i, b - 1])) == "[SEP]"
        assert a["attention_mask"][i].sum() == n + 7  # exactly D tokens inserted
        np.testing.assert_array_equal(a["input_ids"][i, :b], ids[i, :b])  # [CLS] question [SEP] unchanged
        np.testing.assert_array_equal(a["input_ids"][i, b + 7 : n + 7], ids[i, b:n])  # sentence pushed by 7
        np.testing.assert_array_equal(a["token_type_ids"][i, b : b + 7], 1)
        inserted = [int(t) for t in a["input_ids"][i, b : b + 7]]
        assert inserted == adversarial.distractor_ids(tok, 12, 1, int(index[i]))[:7]  # nested across distances
        text = tok.decode(adversarial.distractor_ids(tok, 40, 1, int(index[i]))).split()
        assert set(text[:-1]) <= words, text  # filler words only (the last may be cut inside a word)
    np.testing.assert_array_equal(adversarial.with_distractors(arrays, tok, 0, 1)["input_ids"], ids)
    with pytest.raises(ValueError, match="exceed the width"):
        adversarial.with_distractors(arrays, tok, 48, 1)


def test_adversarial_accuracy_per_distance(runs):
    tmp, out = runs
    ft = out / "bigs-pairs"
    res = json.loads(
        invoke(
            "analyze",
            "adversarial",
            "--ckpt",
            ft,
            "--distances",
            "0,3,7",
            "--seed",
            "1",
            "--out",
            tmp / "adv",
            "--json",
        ).stdout
    )
    table = read_csv(tmp / "adv" / "adversarial.csv")
    assert [int(r["distance"]) for r in table] == [0, 3, 7] and res["examples_scored"] == 40
    ev = json.loads((ft / "eval" / "pairs-validation.json").read_text())
    assert float(table[0]["accuracy"]) == pytest.approx(ev["metrics"]["accuracy"])  # D = 0: the plain accuracy
    # D = 7 recomputed: the documented construction, straight through the model
    rows = pair_rows(40, 2)
    ids, types, mask = plain_encoding(ft, rows)
    labels = np.array([r["label"] for r in rows])
    arrays = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    a = adversarial.with_distractors(arrays, open_run(ft).tokenizer(), 7, seed=1)
    preds = direct_predictions(ft, a["input_ids"], a["token_type_ids"], a["attention_mask"])
    assert int(table[2]["correct"]) == (preds == labels).sum()
    assert float(table[2]["accuracy"]) == pytest.approx((preds == labels).mean())
    assert (tmp / "adv" / "adversarial.png").stat().st_size > 5000

    # two runs: the paper's subset, examples both label alike on the plain input
    invoke(
        "analyze",
        "adversarial",
        "--ckpt",
        ft,
        "--ckpt",
        out / "stack-pairs",
        "--distances",
        "0,5",
        "--out",
        tmp / "adv2",
    )
    both = read_csv(tmp / "adv2" / "adversarial.csv")
    p_b = direct_predictions(ft, ids, types, mask)
    p_s = direct_predictions(out / "stack-pairs", *plain_encoding(out / "stack-pairs", rows))
    same = p_b == p_s
    assert {int(r["n"]) for r in both} == {same.sum()}
    d0 = {r["run"]: float(r["accuracy"]) for r in both if r["distance"] == "0"}
    assert d0["bigs-pairs"] == d0["stack-pairs"] == pytest.approx((p_b == labels)[same].mean())
    md = (tmp / "adv2" / "adversarial.md").read_text().splitlines()
    assert md[0] == "| Run | Arch | H P | H ~ P, D=5 |"
    assert md[2] == f"| bigs-pairs | bigs | {100 * d0['bigs-pairs']:.1f} | {100 * float(both[1]['accuracy']):.1f} |"


def test_report_entries_and_applicability(runs, tmp_path):
    _, out = runs
    for module in (score_vs_loss, length_bins, adversarial):
        assert module.for_report(open_run(out / "bigs"), tmp_path) is None, module.NAME  # a pretraining run
        entry = module.for_report(open_run(out / "bigs-pairs"), tmp_path / module.NAME)
        assert entry["figure"] == module.FIGURE and module.FIGURE in module.command.__doc__
        assert all(os.path.getsize(p) > 5000 for p in entry["images"]) and all(
            os.path.getsize(p) > 100 for p in entry["data"]
        )
        assert entry["numbers"] and all(isinstance(v, float | str) for v in entry["numbers"].values())
    ev = json.loads((out / "bigs-pairs" / "eval" / "pairs-validation.json").read_text())
    entry = adversarial.for_report(open_run(out / "bigs-pairs"), tmp_path / "adv")  # default D: up to 48 / 2
    assert [k for k in entry["numbers"] if k.startswith("accuracy")] == [
        "accuracy D=0",
        "accuracy D=8",
        "accuracy D=16",
    ]
    assert entry["numbers"]["accuracy D=0"] == pytest.approx(ev["metrics"]["accuracy"])
    entry = length_bins.for_report(open_run(out / "bigs-pairs"), tmp_path / "lb")
    assert entry["numbers"]["accuracy"] == pytest.approx(ev["metrics"]["accuracy"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["length-bins", "--bins", "64,32"], "strictly increasing"),
        (["adversarial", "--distances", "0,x"], "comma-separated token counts"),
        (["length-bins"], "is a pretrain run; finetune it"),
        (["transfer"], "a pretrain run; give finetuned runs"),
    ],
)
def test_bad_options_are_one_line(runs, args, message):
    _, out = runs
    r = invoke("analyze", *args[:1], "--ckpt", out / "bigs", *args[1:], code=None)
    assert r.exit_code == 2 and message in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
