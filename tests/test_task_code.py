"""lm-eval task folders that name Python (a !function tag, in the YAML itself or one it includes; a Jinja template
reaching Python's internals) are refused before any of their code is imported, unless --trust-task-code; with it,
the code runs. The task's Python writes a marker file when imported, so "not imported" is observed, not assumed."""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from conftest import invoke
from test_bad_inputs import assert_user_error, snapshot

pytest.importorskip("lm_eval")

ROWS = [{"question": "The cat saw", "choices": ["the garden", "a red ball"], "label": 0}] * 3


def task_folder(d, marker, **config):
    """A multiple-choice task over a local JSONL, its docs passed through utils.process_docs (a !function), whose
    module writes ``marker`` when it is imported."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (d / "utils.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n\n"
        "def process_docs(ds):\n    return ds\n"
    )
    spec = {
        "task": "tiny_fn",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(d / "rows.jsonl")}},
        "test_split": "test",
        "output_type": "multiple_choice",
        "doc_to_text": "{{question}}",
        "doc_to_choice": "choices",
        "doc_to_target": "label",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
        **config,
    }
    return yaml.safe_dump(spec)


def test_a_function_tag_is_refused_before_import(tiny_lm, tmp_path):
    d, marker = tmp_path / "tasks", tmp_path / "imported"
    text = task_folder(d, marker)
    (d / "tiny_fn.yaml").write_text(text + "process_docs: !function utils.process_docs\n")
    before = snapshot(tiny_lm)
    r = invoke("evaluate", "--ckpt", tiny_lm, "--task", "lm-eval:tiny_fn", "--data-dir", d, code=None)
    assert_user_error(r, d / "tiny_fn.yaml", "line", "!function", "--trust-task-code", "--data-dir")
    assert not marker.exists() and str(d / "utils") not in sys.modules  # nothing of the folder imported
    assert snapshot(tiny_lm) == before  # no eval/ file written


def test_an_included_yaml_is_scanned_too(tiny_lm, tmp_path):
    d, marker = tmp_path / "tasks", tmp_path / "imported"
    text = task_folder(d, marker)
    shared = tmp_path / "shared"  # outside the folder: lm-eval follows include paths anywhere
    shared.mkdir()
    (shared / "base.yaml").write_text("# a comment: !function in a comment is no code\nprocess_docs: !function x.y\n")
    (d / "tiny_fn.yaml").write_text(f"include: {shared / 'base.yaml'}\n" + text)
    r = invoke("evaluate", "--ckpt", tiny_lm, "--task", "lm-eval:tiny_fn", "--data-dir", d, code=None)
    assert_user_error(r, shared / "base.yaml", "line 2", "!function")


def test_a_jinja_template_reaching_python_is_refused(tiny_lm, tmp_path):
    d = tmp_path / "tasks"
    text = task_folder(d, tmp_path / "imported", doc_to_text="{{ question.__class__.__mro__ }}")
    (d / "tiny_fn.yaml").write_text(text)
    r = invoke("evaluate", "--ckpt", tiny_lm, "--task", "lm-eval:tiny_fn", "--data-dir", d, code=None)
    assert_user_error(r, d / "tiny_fn.yaml", "Jinja", "--trust-task-code")


def test_trusted_task_code_runs(tiny_lm, tmp_path):
    from ssmlm.checkpoint_eval.harness import run_harness

    d, marker = tmp_path / "tasks", tmp_path / "imported"
    text = task_folder(d, marker)
    (d / "tiny_fn.yaml").write_text(text + "process_docs: !function utils.process_docs\n")
    out = run_harness(tiny_lm, ["tiny_fn"], include_path=d, limit=2, bootstrap_iters=0, trust_task_code=True)
    assert marker.read_text() == "imported"
    assert 0 <= out["results"]["tiny_fn"]["acc,none"] <= 1


def test_the_lm_eval_command_line_refuses_too(tmp_path, monkeypatch, capsys):
    from ssmlm.checkpoint_eval.harness import lm_eval_cli

    d, marker = tmp_path / "tasks", tmp_path / "imported"
    text = task_folder(d, marker)
    (d / "tiny_fn.yaml").write_text(text + "process_docs: !function utils.process_docs\n")
    for where in (["--include_path", str(d), "--tasks", "tiny_fn"], ["--tasks", str(d / "tiny_fn.yaml")]):
        monkeypatch.setattr(sys, "argv", ["ssmlm-lm-eval", "run", "--model", "ssmlm", *where])
        with pytest.raises(SystemExit) as e:
            lm_eval_cli()
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
        assert str(d / "tiny_fn.yaml") in err and "--trust-task-code" in err
    assert not marker.exists()
