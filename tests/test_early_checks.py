"""Every check that needs no data runs before any data work, and says what is wrong in the family's terms; a
failed attempt leaves no cache behind; packing that wastes most of every row on padding says so.

The recipe-mismatch refusal and `evaluate --task phonebook` on an encoder need a trained run: they are in
tests/test_bad_inputs.py, beside its trained run."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import english_lines, invoke, tiny_recipe

DATA_WORK = ("tokenizing", "configurations", "packing:", "parameter rules")  # lines only data work prints


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path, monkeypatch):
    """A cache home of this test's own: under xdist the other worker's tests write caches to the shared one, which
    the checks below would count as left behind."""
    monkeypatch.setenv("SSMLM_HOME", str(tmp_path / "ssmlm-home"))


def cache_dirs() -> set[str]:
    d = Path(os.environ["SSMLM_HOME"]) / "data"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def lm_recipe(tmp_path: Path, corpus: Path, **objective) -> Path:
    recipe = {
        "base": "lm_tiny",
        "model": {"hidden_size": 32, "num_layers": 1, "state_size": 32, "num_heads": 2, "max_seq_length": 96},
        "data": {"source": str(corpus), "vocab_size": 400},
        "objective": {"mixture": "birdie", **objective},
        "train": {"steps": 2, "batch_size": 4, "out_dir": str(tmp_path / "runs")},
    }
    path = tmp_path / "lm.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def one_error_line(result) -> str:
    """The one error line, last; before it only the command's start lines (its imports), no data work."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:], result.output
    assert not any(w in ln for ln in lines[:-1] for w in DATA_WORK), result.output
    return lines[-1]


# ----------------------------------------------------------------------------- a language model's row length


@pytest.mark.parametrize(
    "setting, key",
    [
        ("model.max_seq_length=16", "'model.max_seq_length' = 16"),
        ("data.max_seq_length=16", "'data.max_seq_length' = 16"),
        ("model.max_seq_length=4", "'model.max_seq_length' = 4"),
    ],
)
def test_lm_row_too_short_for_any_sample_is_refused_before_data_work(tmp_path, corpus_file, setting, key):
    """A row takes a sample only while objective.min_sample_space slots are left: a shorter row never holds one.
    Refused as the recipe loads — no tokenising, no cache directory, no run directory — in a language model's
    words (no [CLS])."""
    recipe = lm_recipe(tmp_path, corpus_file)
    before = cache_dirs()
    line = one_error_line(invoke("pretrain", recipe, "--set", setting, code=None))
    assert key in line and "objective.min_sample_space = 32" in line and "[CLS]" not in line, line
    assert cache_dirs() == before and not (tmp_path / "runs").exists()


def test_lm_row_length_words_without_a_min_sample_space(tmp_path, corpus_file):
    recipe = lm_recipe(tmp_path, corpus_file, min_sample_space=4)
    line = one_error_line(invoke("pretrain", recipe, "--set", "model.max_seq_length=4", code=None))
    assert "at least 8 tokens per row" in line and "[CLS]" not in line, line
    # an encoder's row does hold [CLS] and [SEP]: its message says so
    line = one_error_line(invoke("pretrain", "--set", "model.max_seq_length=4", code=None))
    assert "[CLS]" in line, line


def test_shorter_rows_with_a_smaller_min_sample_space_are_accepted(tmp_path, corpus_file):
    invoke(
        "pretrain",
        lm_recipe(tmp_path, corpus_file, min_sample_space=8),
        "--set",
        "model.max_seq_length=16",
        "--dry-run",
    )


def test_the_row_length_rule_is_the_packers():
    """What the rule above relies on: a row shorter than min_space holds no sample at all, and every mixture
    has a configuration that makes a sample in a row of 8 (so rows of max(8, min_sample_space) hold samples)."""
    from ssmlm.objectives.birdie.functions import Ids, sample
    from ssmlm.objectives.birdie.mixtures import MIXTURES, mixture
    from ssmlm.objectives.birdie.pipeline import make_row

    ids = Ids.for_tests()
    docs = [np.arange(500, dtype=np.int32)]
    for name in MIXTURES:
        configs, probs = mixture(name)
        row = make_row(docs, configs, probs, 31, key=3, ids=ids, min_space=32)
        assert not row["segment_ids"].any(), name
        src = np.arange(64, dtype=np.int32)
        fits = [
            sample(c.kind, c.cls, src, 8, np.random.default_rng(k), ids, "start", **c.params) is not None
            for c in configs
            for k in range(4)
        ]
        assert any(fits), f"no configuration of mixture {name!r} fits a row of 8"


def test_a_mesh_the_devices_cannot_make_is_refused_before_data_work(tmp_path, corpus_file):
    import jax

    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file, data={"vocab_size": 140})  # data never tokenised yet
    before = cache_dirs()
    line = one_error_line(invoke("pretrain", recipe, "--set", f"mesh.tensor={jax.device_count() + 1}", code=None))
    assert "mesh" in line and "devices" in line, line
    assert cache_dirs() == before and not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- failed attempts leave no cache


def test_refused_data_leaves_no_cache_directory(tmp_path):
    """All of a one-document corpus is held out for validation: refused, and the half-made cache goes."""
    source = tmp_path / "one.jsonl"
    source.write_text(json.dumps({"text": " ".join(english_lines(20))}) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {"base": "default", "data": {"source": str(source), "vocab_size": 150, "validation_fraction": 0.9999}}
        )
    )
    before = cache_dirs()
    line = one_error_line(invoke("preprocess", recipe, code=None))
    assert "no training text" in line, line
    assert cache_dirs() == before


# ----------------------------------------------------------------------------- packing that wastes compute


def paragraphs_jsonl(path: Path, n: int, sentences: int) -> Path:
    """One short paragraph per line, as a JSONL of prose split at blank lines looks."""
    lines = english_lines(n * sentences, seed=1)
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"text": " ".join(lines[i * sentences : (i + 1) * sentences])}) + "\n")
    return path


def preprocess_rows(tmp_path: Path, source: Path, packing: str):
    recipe = tmp_path / f"{source.stem}-{packing}.yaml"
    data = {"source": str(source), "vocab_size": 200, "packing": packing}
    recipe.write_text(yaml.safe_dump({"base": "default", "model": {"max_seq_length": 128}, "data": data}))
    r = invoke("preprocess", recipe)
    meta = json.loads(r.output[r.output.index("{") :])
    notes = [ln for ln in r.output.splitlines() if ln.startswith("packing:")]
    return meta["fill_rate"], notes


def test_low_fill_says_so_and_names_full_packing(tmp_path):
    short = paragraphs_jsonl(tmp_path / "short.jsonl", 400, 2)  # ~20 tokens a document, rows of 128
    fill, notes = preprocess_rows(tmp_path, short, "fill")
    assert fill < 0.85 and len(notes) == 1, notes
    assert f"{fill:.0%} text" in notes[0] and "data.packing: full would fill them" in notes[0], notes
    fill, notes = preprocess_rows(tmp_path, short, "full")  # the advice holds: full fills the rows
    assert fill > 0.85 and notes == []
    long = paragraphs_jsonl(tmp_path / "long.jsonl", 20, 150)  # documents of about ten rows each
    fill, notes = preprocess_rows(tmp_path, long, "fill")
    assert fill > 0.85 and notes == []


def test_lm_rows_closed_early_say_so(tmp_path):
    """Language models pack samples into rows at training time: a large objective.min_sample_space closes
    rows early, and the run says which setting fills them."""
    from ssmlm.data.preprocess import preprocess
    from ssmlm.recipe import load_recipe
    from ssmlm.train.parts.lm import lm_objective, packing_note, row_fill

    short = paragraphs_jsonl(tmp_path / "short.jsonl", 300, 1)
    fills = {}
    for space in (56, 8):
        r = load_recipe(lm_recipe(tmp_path, short, mixture="clm", min_sample_space=space), ["model.max_seq_length=64"])
        objective = lm_objective(r, preprocess(r.data, r.seq_len, quiet=True, layout="documents"))
        fills[space] = row_fill(objective), packing_note(row_fill(objective), r)
    fill, note = fills[56]
    assert fill < 0.85 and "objective.min_sample_space = 56" in note and f"{fill:.0%} samples" in note, fills
    fill, note = fills[8]
    assert fill > 0.85 and note is None, fills


def test_finetune_dry_run_counts_the_steps_its_epochs_take(tiny_encoder, tmp_path):
    """A finetuning recipe runs train.epochs, not train.steps: the dry run counts epochs × whole batches of the
    task's training rows (48 less the 10% held out for validation: 43; in batches of 8 (5 per epoch), 3 epochs: 15
    steps, as training takes them); a hub task, whose
    size is known only once downloaded, says its steps depend on the data instead of a false number."""
    rows = ["sentence,label"] + [f"{s},{int('cat' in s)}" for s in english_lines(48, 1)]
    (tmp_path / "task.csv").write_text("\n".join(rows) + "\n")
    args = ["finetune", "--ckpt", tiny_encoder, "--dry-run", "--set", "train.epochs=3", "--set", "train.batch_size=8"]
    local = ["--train-file", tmp_path / "task.csv", "--text-fields", "sentence", "--label-field", "label"]
    out = " ".join(invoke(*args, *local, env={"COLUMNS": "200"}).output.split())
    assert "over 15 steps (3 epochs of 43 rows)" in out, out
    out = " ".join(invoke(*args, "--task", "sst2", env={"COLUMNS": "200"}).output.split())
    assert "3 epochs (steps depend on the data)" in out and "1,000,000" not in out, out


def test_pretraining_says_how_much_it_held_out_for_validation(tmp_path, corpus_file, tiny_lm):
    """Not only when it held out none: an encoder's data says its validation rows, a language model's run its
    validation documents (and summary.json records the count)."""
    out = invoke("preprocess", tiny_recipe(tmp_path / "r.yaml", corpus_file)).output
    assert re.search(r"validation: [1-9]\d* rows held out \(data.validation_fraction = 0.03 of 40 documents\)", out)
    recipe = yaml.safe_load((tiny_lm / "recipe.yaml").read_text())  # the shared tiny LM, one step, 20% held out
    recipe["data"]["validation_fraction"] = 0.2
    recipe["train"].update(steps=1, out_dir=str(tmp_path / "runs"))
    (tmp_path / "lm.yaml").write_text(yaml.safe_dump(recipe))
    out = invoke("pretrain", tmp_path / "lm.yaml", "--name", "lm").output
    held = re.search(r"validation: ([1-9]\d*) documents held out \(data.validation_fraction = 0.2 of 20\)", out)
    assert held, out
    summary = json.loads((tmp_path / "runs" / "lm" / "summary.json").read_text())
    assert summary["validation_held_out"] == {"documents": int(held.group(1))}
