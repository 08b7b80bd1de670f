"""A battery of realistic mistakes: each one gets exit status 2, one line naming the culprit, no traceback, and
leaves the run directory as it was (or absent). A damaged newest checkpoint falls back to the previous one.

Most cases run the CLI in-process (CliRunner); a few run a real process to check stderr and speed."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import english_lines, invoke, tiny_recipe

ROOT = Path(__file__).resolve().parents[1]


STATUS = re.compile(r"^[a-z-]+( [a-z-]+)?: [^:]*…$")
HELD_OUT = re.compile(r"^validation: [\d,]+ rows held out \(")


def assert_user_error(result, *culprits):
    out = result.output
    assert "Traceback" not in out, out
    assert result.exit_code == 2, out
    # Status lines of the work that began ("pretrain: preparing the data and the model…", printed without a
    # terminal) and what the data preparation reported (its validation rows) may precede it; the error itself
    # is one line.
    lines = [ln for ln in out.splitlines() if ln.strip() and not STATUS.match(ln) and not HELD_OUT.match(ln)]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    for c in culprits:
        assert str(c) in lines[0], (c, lines[0])


def snapshot(d: Path) -> dict:
    """Every file under ``d`` with a hash of its contents (rewriting the same bytes counts as unchanged)."""
    if not d.exists():
        return {}
    files = sorted(p for p in d.rglob("*") if p.is_file())
    return {str(p.relative_to(d)): hashlib.sha1(p.read_bytes()).hexdigest() for p in files}


def truncate_files(step_dir: Path) -> None:
    for p in step_dir.rglob("*"):
        if p.is_file():
            with p.open("r+b") as f:
                f.truncate(p.stat().st_size // 2)


def empty_dir(step_dir: Path) -> None:
    for p in step_dir.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def write_corpus(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for i in range(40):
        (d / f"doc{i:02d}.txt").write_text("\n".join(english_lines(30, seed=i)) + "\n")
    return d


def damaged_run(c, name: str) -> Path:
    """A copy of the trained run's small files (no checkpoints needed) with ``name`` cut in half."""
    d = c.tmp / "damaged"
    d.mkdir()
    for f in ("recipe.yaml", "run.json", "tokenizer.json"):
        shutil.copy(c.run / f, d / f)
    (d / name).write_text((d / name).read_text()[: len((d / name).read_text()) // 2])
    return d


def edited_run(c) -> Path:
    """A copy of the trained run whose recipe.yaml was edited by hand: its checkpoints no longer fit."""
    d = c.tmp / "edited"
    shutil.copytree(c.run, d)
    (d / "recipe.yaml").write_text((d / "recipe.yaml").read_text().replace("hidden_size: 16", "hidden_size: 8"))
    return d


def write_task(path: Path, n: int, seed: int) -> Path:
    rows = ["sentence,label"] + [f"{s},{int('cat' in s)}" for s in english_lines(n, seed)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny pretraining run with checkpoints at steps 2 and 4, for the cases that need a run."""
    tmp = tmp_path_factory.mktemp("trained")
    recipe = tiny_recipe(tmp / "r.yaml", write_corpus(tmp / "corpus"), train={"steps": 4, "checkpoint_every": 2})
    invoke("pretrain", recipe, "-q")
    run = tmp / "runs" / "r"
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "4"]
    return SimpleNamespace(dir=tmp, recipe=recipe, run=run)


@pytest.fixture
def c(tmp_path, monkeypatch, trained):
    monkeypatch.chdir(tmp_path)  # the shipped recipes write under ./runs
    corpus = write_corpus(tmp_path / "corpus")

    def write(name, text):
        p = tmp_path / name
        p.write_text(text)
        return p

    def recipe(**sections):
        return tiny_recipe(tmp_path / "r.yaml", corpus, **sections)

    return SimpleNamespace(
        tmp=tmp_path, corpus=corpus, runs=tmp_path / "runs", run=trained.run, write=write, recipe=recipe
    )


# ----------------------------------------------------------------------------- the battery

# (id, args(c) -> command line, culprits(c) -> strings the one line must contain). Laid out by hand (fmt: skip):
# a case's command on its first line and its culprits under it, which the formatter would spread over many.
CASES = [
    # --- recipe values: ranges
    ("hidden_size_0", lambda c: ["pretrain", c.recipe(model={"hidden_size": 0})],
     lambda c: [c.tmp / "r.yaml", "'model.hidden_size' = 0", "at least 1"]),
    ("hidden_size_0_dry_run", lambda c: ["pretrain", c.recipe(model={"hidden_size": 0}), "--dry-run"],
     lambda c: [c.tmp / "r.yaml", "'model.hidden_size' = 0"]),
    ("batch_size_0_set", lambda c: ["pretrain", "--set", "train.batch_size=0"],
     lambda c: ["--set", "'train.batch_size' = 0"]),
    ("steps_negative_set", lambda c: ["pretrain", c.recipe(), "--set", "train.steps=-5"],
     lambda c: ["--set", "'train.steps' = -5", "at least 1"]),
    ("steps_negative_dry_run", lambda c: ["pretrain", "--set", "train.steps=-5", "--dry-run"],
     lambda c: ["--set", "'train.steps' = -5"]),
    ("learning_rate_0", lambda c: ["pretrain", c.recipe(train={"learning_rate": 0})],
     lambda c: [c.tmp / "r.yaml", "'train.learning_rate' = 0.0", "more than 0"]),
    ("learning_rate_negative", lambda c: ["pretrain", c.recipe(train={"learning_rate": -1})],
     lambda c: ["'train.learning_rate' = -1.0"]),
    ("learning_rate_nan", lambda c: ["pretrain", c.recipe(), "--set", "train.learning_rate=.nan"],
     lambda c: ["--set", "'train.learning_rate' = nan"]),
    ("masked_lm_prob_above_1", lambda c: ["pretrain", c.recipe(objective={"masked_lm_prob": 1.5})],
     lambda c: ["'objective.masked_lm_prob' = 1.5", "(0, 1]"]),
    ("masked_lm_prob_in_data", lambda c: ["pretrain", c.recipe(data={"masked_lm_prob": 0.2})],
     lambda c: [c.tmp / "r.yaml", "'data.masked_lm_prob' has moved to 'objective.masked_lm_prob'"]),
    ("field_of_another_family", lambda c: ["pretrain", c.recipe(model={"sgu": "linear"})],
     lambda c: [c.tmp / "r.yaml", "'model.sgu' is not an option of model.arch 'bigs'", "gmlp"]),
    ("unknown_objective", lambda c: ["pretrain", c.recipe(objective={"kind": "mlmm"})],
     lambda c: ["'objective.kind' = 'mlmm'", "did you mean 'mlm'"]),
    ("dropout_1", lambda c: ["pretrain", c.recipe(model={"dropout": 1.0})], lambda c: ["'model.dropout' = 1.0"]),
    ("warmup_ratio_2", lambda c: ["pretrain", c.recipe(), "--set", "train.warmup_ratio=2"],
     lambda c: ["--set", "'train.warmup_ratio' = 2.0", "[0, 1]"]),
    ("log_every_0", lambda c: ["pretrain", c.recipe(train={"log_every": 0})], lambda c: ["'train.log_every' = 0"]),
    ("keep_checkpoints_0", lambda c: ["pretrain", c.recipe(), "--set", "train.keep_checkpoints=0"],
     lambda c: ["'train.keep_checkpoints' = 0"]),
    ("max_seq_length_4", lambda c: ["pretrain", c.recipe(model={"max_seq_length": 4})],
     lambda c: ["'model.max_seq_length' = 4", "at least 8"]),
    ("mesh_axis_0", lambda c: ["pretrain", c.recipe(), "--set", "mesh.data=0"], lambda c: ["--set", "'mesh.data' = 0"]),
    ("empty_name", lambda c: ["pretrain", c.recipe(), "--set", "name="], lambda c: ["--set", "'name' = ''"]),
    # --- recipe values: rules between fields
    ("heads_do_not_divide_hidden", lambda c: ["pretrain", c.recipe(model={"arch": "bert", "num_heads": 5})],
     lambda c: [c.tmp / "r.yaml", "'model.num_heads' = 5", "divisor of model.hidden_size = 16"]),
    ("batch_not_divisible_by_grad_accum", lambda c: ["pretrain", c.recipe(), "--set", "train.grad_accum=3"],
     lambda c: ["--set", "'train.batch_size' = 8", "multiple of train.grad_accum = 3"]),
    ("batch_not_divisible_by_mesh", lambda c: ["pretrain", c.recipe(), "--set", "mesh.data=3"],
     lambda c: ["--set", "'train.batch_size' = 8", "mesh.data"]),
    ("two_mesh_axes_free", lambda c: ["pretrain", c.recipe(), "--set", "mesh.fsdp=-1"],
     lambda c: ["--set", "at most one axis to be -1", "mesh.fsdp = -1"]),
    ("data_longer_than_model", lambda c: ["pretrain", c.recipe(data={"max_seq_length": 64})],
     lambda c: ["'data.max_seq_length' = 64", "at most model.max_seq_length = 32"]),
    ("gmlp_odd_split_width", lambda c: ["pretrain", c.recipe(model={"arch": "gmlp", "intermediate_size": 33})],
     lambda c: ["'model.intermediate_size' = 33", "even"]),
    # --- recipe files and --set syntax
    ("set_section_typo", lambda c: ["pretrain", "--set", "modell.hidden_size=3"],
     lambda c: ["--set", "'modell'", "did you mean 'model'"]),
    ("set_key_typo", lambda c: ["pretrain", c.recipe(), "--set", "model.hiden_size=3"],
     lambda c: ["--set", "'model.hiden_size'", "did you mean 'hidden_size'"]),
    ("set_wrong_type", lambda c: ["pretrain", c.recipe(), "--set", "train.steps=ten"],
     lambda c: ["--set", "'train.steps' = 'ten'", "expected int"]),
    ("set_without_value", lambda c: ["pretrain", "--set", "train.steps"], lambda c: ["--set", "KEY=VALUE"]),
    ("empty_recipe", lambda c: ["pretrain", c.write("empty.yaml", "")], lambda c: [c.tmp / "empty.yaml", "empty"]),
    ("comment_only_recipe", lambda c: ["pretrain", c.write("c.yaml", "# todo\n")], lambda c: [c.tmp / "c.yaml"]),
    ("missing_base", lambda c: ["pretrain", c.write("child.yaml", "base: no_such_parent.yaml\n")],
     lambda c: [c.tmp / "child.yaml", "base", "no_such_parent"]),
    ("yaml_error_line", lambda c: ["pretrain", c.write("y.yaml", "name: x\nmodel: [1\n")],
     lambda c: [c.tmp / "y.yaml", "line 2"]),
    ("unknown_key_in_file", lambda c: ["pretrain", c.write("k.yaml", "base: default\ntrain: {stpes: 3}\n")],
     lambda c: [c.tmp / "k.yaml", "'train.stpes'", "did you mean 'steps'"]),
    ("missing_recipe", lambda c: ["pretrain", "defualt"], lambda c: ["'defualt'", "did you mean 'default'"]),
    # --- data
    ("missing_corpus", lambda c: ["pretrain", c.recipe(data={"source": str(c.tmp / "nope.txt")})],
     lambda c: [c.tmp / "nope.txt", "no such file"]),
    ("unsupported_corpus_type", lambda c: ["pretrain", c.recipe(data={"source": str(c.write("a.docx", "x"))})],
     lambda c: [c.tmp / "a.docx", "unsupported"]),
    ("malformed_jsonl", lambda c: ["pretrain", c.recipe(data={"source": str(c.write(
        "bad.jsonl", '{"text": "fine"}\n{"text": "broken\n{"text": "fine"}\n'))})],
     lambda c: [c.tmp / "bad.jsonl", "line 2", "not valid JSON"]),
    ("jsonl_line_not_an_object", lambda c: ["preprocess", c.recipe(data={"source": str(c.write(
        "list.jsonl", '{"text": "fine"}\n\n[1, 2]\n'))})],
     lambda c: [c.tmp / "list.jsonl", "line 3", "JSON object"]),
    ("jsonl_without_text_field", lambda c: ["preprocess", c.recipe(data={"source": str(c.write(
        "body.jsonl", '{"body": "fine"}\n'))})],
     lambda c: [c.tmp / "body.jsonl", "'text'", "body"]),
    ("txt_not_utf8", lambda c: ["preprocess", c.recipe(data={"source": str(c.tmp / "latin.txt")})],
     lambda c: [c.tmp / "latin.txt", "UTF-8"]),
    ("hub_offline", lambda c: ["pretrain", c.recipe(data={"source": "hub:wikitext:wikitext-2-raw-v1"})],
     lambda c: ["hub:wikitext", "offline"]),
    ("missing_tokenizer", lambda c: ["pretrain", c.recipe(data={"tokenizer": str(c.tmp / "vocab.txt")})],
     lambda c: ["data.tokenizer", c.tmp / "vocab.txt"]),
    ("batch_larger_than_data", lambda c: ["pretrain", c.recipe(train={"batch_size": 4096})],
     lambda c: ["train.batch_size = 4096", "training examples"]),
    # --- command-line options
    ("stop_after_negative", lambda c: ["pretrain", c.recipe(), "--stop-after", "-3"],
     lambda c: ["--stop-after = -3", "at least 1"]),
    ("stop_after_zero", lambda c: ["pretrain", c.recipe(), "--stop-after", "0"], lambda c: ["--stop-after = 0"]),
    ("stop_after_not_a_number", lambda c: ["pretrain", c.recipe(), "--stop-after", "abc"],
     lambda c: ["'--stop-after'"]),
    ("unknown_option", lambda c: ["pretrain", "--stpo-after", "3"], lambda c: ["--stpo-after", "--stop-after"]),
    ("name_with_slash", lambda c: ["pretrain", c.recipe(), "--name", "a/b"], lambda c: ["--name = 'a/b'"]),
    ("seeds_not_numbers", lambda c: ["finetune", "--ckpt", c.run, "--task", "builtin-order", "--seeds", "a,b"],
     lambda c: ["--seeds = 'a,b'"]),
    ("seeds_repeated", lambda c: ["finetune", "--ckpt", c.run, "--task", "builtin-order", "--seeds", "1,1"],
     lambda c: ["--seeds = '1,1'", "distinct"]),
    ("num_labels_0", lambda c: ["finetune", "--ckpt", c.run, "--train-file", write_task(c.tmp / "t.csv", 8, 0),
                                "--num-labels", "0"], lambda c: ["--num-labels = 0"]),
    ("three_text_fields", lambda c: ["finetune", "--ckpt", c.run, "--train-file", write_task(c.tmp / "t.csv", 8, 0),
                                     "--text-fields", "a,b,c"], lambda c: ["--text-fields = 'a,b,c'"]),
    ("finetune_without_ckpt", lambda c: ["finetune", "--task", "sst2"], lambda c: ["--ckpt"]),
    ("finetune_ckpt_missing", lambda c: ["finetune", "--ckpt", c.tmp / "nope", "--task", "sst2"],
     lambda c: ["--ckpt", c.tmp / "nope", "not an ssmlm run directory"]),
    ("finetune_unknown_task", lambda c: ["finetune", "--ckpt", c.run, "--task", "mnlii"],
     lambda c: ["'mnlii'", "did you mean 'mnli'"]),
    ("finetune_train_file_missing", lambda c: ["finetune", "--ckpt", c.run, "--train-file", c.tmp / "none.csv"],
     lambda c: ["task.train_file", c.tmp / "none.csv"]),
    ("finetune_malformed_jsonl_task", lambda c: ["finetune", "--ckpt", c.run, "--train-file", c.write(
        "task.jsonl", '{"sentence": "a", "label": 1}\n{"sentence": "b", "label": 0\n')],
     lambda c: [c.tmp / "task.jsonl", "line 2"]),
    ("finetune_epochs_0", lambda c: ["finetune", "--ckpt", c.run, "--task", "builtin-order", "--set", "train.epochs=0"],
     lambda c: ["--set", "'train.epochs' = 0.0"]),
    ("evaluate_batch_size_0", lambda c: ["evaluate", "--ckpt", c.run, "--batch-size", "0"],
     lambda c: ["--batch-size = 0"]),
    ("evaluate_missing_ckpt_option", lambda c: ["evaluate"], lambda c: ["--ckpt"]),
    ("evaluate_not_a_run", lambda c: ["evaluate", "--ckpt", c.corpus], lambda c: [c.corpus, "not an ssmlm run"]),
    ("evaluate_damaged_run_json", lambda c: ["evaluate", "--ckpt", damaged_run(c, "run.json")],
     lambda c: [c.tmp / "damaged" / "run.json", "damaged run directory"]),
    ("evaluate_recipe_edited_in_run", lambda c: ["evaluate", "--ckpt", edited_run(c)],
     lambda c: [c.tmp / "edited", "no usable checkpoint", "steps 4, 2", "does not fit the model"]),
    ("analyze_window_0", lambda c: ["analyze", "kernels", "--ckpt", c.run, "--window", "0"],
     lambda c: ["--window = 0"]),
    ("extend_without_source", lambda c: ["extend-length", c.recipe()], lambda c: ["--from"]),
    ("extend_from_missing_run", lambda c: ["extend-length", c.recipe(), "--from", c.tmp / "gone"],
     lambda c: ["--from", c.tmp / "gone"]),
    # --- output paths: checked before any data work (a root user passes permission bits, so /proc stands in
    # for a place nobody can create a directory)
    ("out_dir_cannot_be_created", lambda c: ["pretrain", c.recipe(train={"out_dir": "/proc/ssmlm-x"})],
     lambda c: ["train.out_dir '/proc/ssmlm-x'", "cannot write"]),
    ("out_dir_is_a_file", lambda c: ["pretrain", c.recipe(train={"out_dir": str(c.write("f", "x"))})],
     lambda c: [f"train.out_dir '{c.tmp / 'f'}'", "Not a directory"]),
    ("finetune_out_dir_is_a_file", lambda c: ["finetune", "--ckpt", c.run, "--task", "builtin-order", "--set",
                                              f"train.out_dir={c.write('f', 'x')}"],
     lambda c: ["train.out_dir", "Not a directory"]),
    ("experiment_out_is_a_file", lambda c: ["experiment", ROOT / "experiments" / "smoke.yaml", "--out",
                                            c.write("f", "x")], lambda c: ["--out", "is a file"]),
    ("evaluate_out_under_a_file", lambda c: ["evaluate", "--ckpt", c.run, "--out", c.write("f", "x") / "m.json"],
     lambda c: ["--out", f"'{c.tmp / 'f'}' is a file"]),
    ("evaluate_out_is_a_directory", lambda c: ["evaluate", "--ckpt", c.run, "--out", c.corpus],
     lambda c: ["--out", "is a directory"]),
    ("results_out_cannot_be_created", lambda c: ["results", c.run, "--out", "/proc/ssmlm-x/t.md"],
     lambda c: ["--out", "/proc/ssmlm-x"]),
    ("analyze_out_is_a_file", lambda c: ["analyze", "kernels", "--ckpt", c.run, "--out", c.write("f", "x")],
     lambda c: ["--out", "is a file"]),
    ("import_bigs_out_is_a_file", lambda c: ["import-bigs", c.corpus, "--out", c.write("f", "x")],
     lambda c: ["--out", "is a file"]),
    # --- a key written twice (PyYAML would keep the last one silently)
    ("recipe_duplicate_section", lambda c: ["pretrain", c.write(
        "d.yaml", "base: default\ntrain:\n  steps: 20\nmodel:\n  num_layers: 2\ntrain:\n  learning_rate: 0.001\n")],
     lambda c: [c.tmp / "d.yaml", "key 'train' appears twice (lines 2 and 6)"]),
    ("recipe_duplicate_field", lambda c: ["pretrain", c.write("d.yaml",
                                                              "base: default\ntrain: {steps: 2, steps: 3}\n")],
     lambda c: [c.tmp / "d.yaml", "key 'steps' appears twice"]),
    ("set_duplicate_key", lambda c: ["pretrain", "--set", "train={steps: 1, steps: 2}"],
     lambda c: ["--set", "key 'steps' appears twice"]),
    ("experiment_duplicate_key", lambda c: ["experiment", c.write(
        "e.yaml", "metric: accuracy\nseeds: [0]\narms: {a: {}}\nseeds: [1, 2]\n")],
     lambda c: [c.tmp / "e.yaml", "key 'seeds' appears twice (lines 2 and 4)"]),
]  # fmt: skip


@pytest.mark.parametrize("args, culprits", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_input(c, args, culprits):
    (c.tmp / "latin.txt").write_bytes("café au lait\n".encode("latin-1"))
    before = snapshot(c.run)
    result = invoke(*args(c), code=None)
    assert_user_error(result, *culprits(c))
    assert not c.runs.exists(), "a failed command left a run directory behind"
    assert snapshot(c.run) == before, "a failed command changed an existing run"


def test_battery_is_large_enough():
    assert len(CASES) >= 40


def test_every_numeric_recipe_field_has_a_range():
    """A new int/float recipe field needs a line in ssmlm.checks.FIELDS (its allowed values); every line there
    names a real field."""
    import dataclasses
    import typing

    from ssmlm.checks import FIELDS
    from ssmlm.models.config import ModelConfig, all_config_classes
    from ssmlm.recipe import Recipe

    def fields(cls, prefix=""):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            if tp is ModelConfig:  # the model section's fields are each family's
                for family in all_config_classes():
                    yield from fields(family, f"{prefix}{f.name}.")
            elif dataclasses.is_dataclass(tp):
                yield from fields(tp, f"{prefix}{f.name}.")
            elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
                yield from fields(typing.get_args(tp)[0], f"{prefix}{f.name}[].")  # every item's fields
            else:
                yield prefix + f.name, set(typing.get_args(tp) or (tp,))

    everything = dict(fields(Recipe))
    assert [k for k, types in everything.items() if {int, float} & types and k not in FIELDS] == []
    assert [k for k in FIELDS if k not in everything] == []


# ----------------------------------------------------------------------------- half-made runs


def test_failure_after_the_run_directory_is_made_leaves_nothing(c, monkeypatch):
    """Training fails after the run directory was written: the directory goes (it held no checkpoint), so the
    corrected command is not refused as 'a different recipe'."""
    from ssmlm.errors import UserError
    from ssmlm.train import loop

    def boom(stage, recipe, run_dir, **kw):
        assert (run_dir / "recipe.yaml").is_file()
        raise UserError("simulated failure during training")

    recipe = c.recipe(train={"steps": 2})
    monkeypatch.setattr(loop, "run", boom)
    assert_user_error(invoke("pretrain", recipe, "-q", code=None), "simulated failure")
    assert not c.runs.exists()
    monkeypatch.undo()
    monkeypatch.chdir(c.tmp)
    invoke("pretrain", recipe, "-q", "--set", "train.learning_rate=1e-3")  # a different recipe, same name
    assert json.loads((c.runs / "r" / "summary.json").read_text())["final_step"] == 2


def test_existing_run_with_another_recipe_is_refused_and_kept(trained):
    before = snapshot(trained.run)
    r = invoke("pretrain", trained.recipe, "-q", "--set", "train.learning_rate=1e-3", code=None)
    assert_user_error(r, trained.run, "different recipe", "train.learning_rate")
    assert snapshot(trained.run) == before


def test_finished_run_asked_again_reports_its_own_metrics(trained):
    # the final checkpoint keeps training and validation metrics apart (for an LM both have a "loss"), so the
    # summary of a finished run started again shows the same numbers under the same names
    run = trained.run.parent / "again"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(trained.run, run)
    before = json.loads((run / "summary.json").read_text())
    invoke("pretrain", trained.recipe, "--name", "again", "-q")
    after = json.loads((run / "summary.json").read_text())
    assert after["start_step"] == after["final_step"] == 4
    assert before["validation"] and after["validation"] == before["validation"]
    assert after["train"] == before["train"] and set(after["train"]).isdisjoint(after["validation"])


# ----------------------------------------------------------------------------- damaged checkpoints


def broken_copy(trained, name: str, damage) -> Path:
    run = trained.run.parent / name
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(trained.run, run)
    damage(run / "checkpoints" / "4")
    return run


@pytest.mark.parametrize("damage", [truncate_files, empty_dir], ids=["truncated", "emptied"])
def test_resume_falls_back_to_the_previous_checkpoint(trained, damage):
    run = broken_copy(trained, f"resume-{damage.__name__}", damage)
    broken = snapshot(run / "checkpoints" / "4")
    r = invoke("pretrain", trained.recipe, "--name", run.name, "-q")
    assert "Traceback" not in r.output
    warning = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "checkpoint 4" in warning[0] and "using step 2" in warning[0], r.output
    assert "from step 2" in r.output
    # the broken checkpoint is kept, moved aside; training went on to the end and saved step 4 again
    assert snapshot(run / "broken-checkpoints" / "4") == broken
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in rows if "split" not in x] == [1, 2, 3, 4]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["start_step"] == 2 and summary["final_step"] == 4
    from ssmlm.runs import open_run

    _, meta = open_run(run).load_model()
    assert meta["step"] == 4


@pytest.mark.parametrize("damage", [truncate_files, empty_dir], ids=["truncated", "emptied"])
def test_evaluate_and_analyze_fall_back_without_touching_the_broken_one(trained, damage):
    run = broken_copy(trained, f"eval-{damage.__name__}", damage)
    broken = snapshot(run / "checkpoints" / "4")
    r = invoke("evaluate", "--ckpt", run)
    assert "warning: checkpoint 4" in r.output and "using step 2" in r.output
    assert json.loads((run / "eval" / "mlm-validation.json").read_text())["step"] == 2
    r = invoke("analyze", "kernels", "--ckpt", run, "--out", run / "analysis")
    assert "using step 2" in r.output
    assert snapshot(run / "checkpoints" / "4") == broken  # read-only commands leave it where it is


def test_the_fallback_warning_says_why_in_words(trained):
    """Array chunks cut short (the metadata intact): Orbax's error formats TensorStore's `spec` method, not its
    text; the warning gives TensorStore's own reason instead of "<bound method pybind11_...>"."""

    def truncate_chunks(step_dir: Path) -> None:
        for p in (step_dir / "params" / "ocdbt.process_0" / "d").iterdir():
            with p.open("r+b") as f:
                f.truncate(p.stat().st_size // 2)

    run = broken_copy(trained, "eval-chunks", truncate_chunks)
    r = invoke("evaluate", "--ckpt", run)
    warning = [ln for ln in r.output.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "using step 2" in warning[0], r.output
    assert "<" not in warning[0] and "TensorStore details" not in warning[0], warning
    assert "Error reading" in warning[0], warning  # TensorStore's words: which array, which file


def test_no_usable_checkpoint_is_one_line(trained):
    run = broken_copy(trained, "all-broken", truncate_files)
    truncate_files(run / "checkpoints" / "2")
    before = snapshot(run)
    assert_user_error(invoke("evaluate", "--ckpt", run, code=None), run, "no usable checkpoint", "steps 4, 2")
    assert_user_error(invoke("pretrain", trained.recipe, "--name", run.name, "-q", code=None), "no usable checkpoint")
    assert snapshot(run) == before


def test_finetune_from_a_damaged_run_uses_the_previous_checkpoint(trained, tmp_path):
    run = broken_copy(trained, "ft-source", truncate_files)
    train, val = write_task(tmp_path / "train.csv", 32, 1), write_task(tmp_path / "val.csv", 16, 2)
    r = invoke(
        "finetune",
        "--ckpt",
        run,
        "--train-file",
        train,
        "--validation-file",
        val,
        "--text-fields",
        "sentence",
        "--label-field",
        "label",
        "--set",
        f"train.out_dir={tmp_path / 'runs'}",
        "--set",
        "train.batch_size=8",
        "--set",
        "train.epochs=1",
        "--name",
        "ft",
        "-q",
    )
    assert "warning: checkpoint 4" in r.output and "using step 2" in r.output
    assert json.loads((tmp_path / "runs" / "ft" / "summary.json").read_text())["final_step"] == 4


def cut_in_half(run: Path) -> None:
    text = (run / "run.json").read_text()
    (run / "run.json").write_text(text[: len(text) // 2])


def without_kind(run: Path) -> None:
    info = json.loads((run / "run.json").read_text())
    del info["kind"]
    (run / "run.json").write_text(json.dumps(info))


@pytest.mark.parametrize("damage", [cut_in_half, without_kind], ids=["truncated", "missing-key"])
def test_a_damaged_run_json_is_one_line_for_every_command_that_reads_it(trained, tmp_path, damage):
    """run.json cut short or missing a key: evaluate, analyze and finetune --ckpt each name the file and exit 2
    (not a KeyError or JSONDecodeError traceback), and leave the run as it was; pretrain rewrites it."""
    run = trained.run.parent / f"json-{damage.__name__}"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(trained.run, run)
    damage(run)
    before = snapshot(run)
    train = write_task(tmp_path / "train.csv", 16, 1)
    commands = [
        ["evaluate", "--ckpt", run],
        ["analyze", "kernels", "--ckpt", run, "--out", tmp_path / "analysis"],
        ["analyze", "report", "--ckpt", run, "--out", tmp_path / "report"],
        ["finetune", "--ckpt", run, "--train-file", train, "--validation-file", train, "--text-fields", "sentence",
         "--label-field", "label", "--set", f"train.out_dir={tmp_path / 'runs'}", "-q"],
    ]  # fmt: skip
    for args in commands:
        r = invoke(*args, code=2)
        assert_user_error(r, run / "run.json")
    assert snapshot(run) == before
    # Re-running pretrain writes run.json afresh from the recipe and the data (nothing in it is the run's own).
    invoke("pretrain", trained.recipe, "--name", run.name, "-q")
    assert json.loads((run / "run.json").read_text()) == json.loads((trained.run / "run.json").read_text())


# ----------------------------------------------------------------------------- real processes: stderr and speed


def run_cli(*args, env=None, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    t = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "ssmlm", *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd
    )
    return p, time.perf_counter() - t


def test_recipe_error_is_one_line_on_stderr(tmp_path):
    """Fast because it needs no jax and reads no data (test_error_path_does_not_import_jax); its time is measured
    by benchmarks/refusals.py, not asserted here, where a busy machine would fail it."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: default\nmodel: {hidden_size: 0}\n")
    p, _ = run_cli("pretrain", bad, cwd=tmp_path)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [f"error: {bad}: 'model.hidden_size' = 0: expected at least 1"]
    assert not (tmp_path / "runs").exists()


def test_error_path_does_not_import_jax(tmp_path):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from ssmlm.cli import app\n"
        "r = CliRunner().invoke(app, ['pretrain', '--set', 'train.steps=-5'])\n"
        "assert r.exit_code == 2, r.output\n"
        "print(sorted(m for m in ('jax', 'flax', 'datasets', 'orbax') if m in sys.modules))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args",
    [
        ["pretrain", "--set", "train.out_dir=/proc/ssmlm-x"],
        ["experiment", ROOT / "experiments" / "smoke.yaml", "--out", "/proc/ssmlm-x"],
    ],
    ids=["run_directory", "experiment_out"],
)
def test_unwritable_output_is_refused_before_jax_is_loaded(tmp_path, args):
    """The output check comes before the slow imports and any data work: no jax, nothing created."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from ssmlm.cli import app\n"
        f"r = CliRunner().invoke(app, {[str(a) for a in args]!r})\n"
        "assert r.exit_code == 2 and r.output.startswith('error: ') and 'cannot write' in r.output, r.output\n"
        "print(sorted(m for m in ('jax', 'flax', 'datasets', 'orbax') if m in sys.modules))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
    assert list(tmp_path.iterdir()) == []


def test_usage_error_is_one_line_in_a_real_process(tmp_path):
    p, _ = run_cli("pretrain", "--stop-after", "abc", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.splitlines()) == 1 and "--stop-after" in p.stderr


def test_unreachable_hub_fails_at_once(tmp_path, corpus_file):
    """Without the offline variables, an unreachable hub is noticed by one connection attempt, not minutes of
    retries; datasets then only looks in its (empty) cache."""
    recipe = tiny_recipe(tmp_path / "r.yaml", corpus_file, data={"source": "hub:wikitext:wikitext-2-raw-v1"})
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", PYTHONPATH=str(ROOT))  # port 9 (discard): refused at once
    p = subprocess.run(  # the timeout guards against minutes of retries (a hang), not a speed
        [sys.executable, "-m", "ssmlm", "preprocess", str(recipe)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and "127.0.0.1 is not reachable" in lines[0] and "hub:wikitext" in lines[0], p.stderr


# ----------------------------------------------------------------------------- refused before any data work


def assert_refused_early(result, *culprits):
    """One error line, last, naming the culprits; before it only the command's start lines (its imports), no
    line of data work."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert lines[-1].startswith("error: "), lines
    data_work = ("tokenizing", "packing:", "configurations", "parameter rules")
    assert not any(w in ln for ln in lines[:-1] for w in data_work), lines
    assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:], lines
    for c in culprits:
        assert str(c) in lines[-1], (c, lines[-1])


def cache_dirs() -> set[str]:
    d = Path(os.environ["SSMLM_HOME"]) / "data"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def test_another_recipe_is_refused_before_any_data_work(trained):
    """A recipe whose data differs (a new cache key) into the existing run: refused before tokenising (no new
    cache directory, no data-work line), as the first thing the run does."""
    before, caches = snapshot(trained.run), cache_dirs()
    r = invoke(
        "pretrain", trained.recipe, "--set", "data.vocab_size=120", "--set", "train.learning_rate=1e-3", code=None
    )
    assert_refused_early(r, trained.run, "different recipe", "data.vocab_size: 150 -> 120", "train.learning_rate")
    assert "tokenizing" not in r.output and cache_dirs() == caches
    assert snapshot(trained.run) == before


@pytest.mark.parametrize(
    "task, advice",
    [
        (
            "phonebook",
            [
                "is for language models",
                "is an encoder (bigs)",
                "ssmlm pretrain birdie_gated_ssm",
                "--task phonebook --recipe phonebook_tiny",
            ],
        ),
        ("lm-eval:hellaswag", ["is for language models", "ssmlm pretrain birdie_gated_ssm"]),
        ("sst2", ["pretraining run", "finetune it on 'sst2' first", "ssmlm finetune --ckpt"]),
        ("phonebok", ["unknown task", "builtin-order"]),
    ],
)
def test_evaluate_a_task_an_encoder_run_cannot_do_gives_advice_that_works(trained, task, advice):
    """Refused at once (the model is not loaded) with advice that works: the recipes it names exist, and
    phone-book finetuning is a language model's task."""
    from ssmlm.data.lm_tasks import LM_TASKS
    from ssmlm.recipe import load_recipe

    r = invoke("evaluate", "--ckpt", trained.run, "--task", task, code=None)
    assert_refused_early(r, *advice)
    assert not (trained.run / "eval").exists() or not list((trained.run / "eval").glob(f"{task}*"))
    if "birdie_gated_ssm" in r.output:
        assert load_recipe("birdie_gated_ssm").objective.kind == "lm" and load_recipe("phonebook_tiny")
        assert "phonebook" in LM_TASKS


def test_finetune_an_encoder_on_a_language_model_task_says_what_would_work(c):
    r = invoke("finetune", "--ckpt", c.run, "--task", "phonebook", code=None)
    assert_user_error(r, "'phonebook' is for language models", "encoder", "ssmlm pretrain birdie_gated_ssm")
    assert not c.runs.exists()
