"""A language model's finetuning and evaluations through the CLI, as a user runs them: phone-book and
instruction finetuning (prompt in the prefix, response the target, packed), then `evaluate --task` phonebook,
squad_v2 (local JSON), infilling (local JSONL) — on a tiny model and generated data, offline."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from conftest import invoke


@pytest.fixture(scope="module")
def lm_run(tiny_lm, tmp_path_factory):
    """The shared tiny LM, copied: these tests evaluate into the run and finetune beside it."""
    tmp = tmp_path_factory.mktemp("lmtasks")
    shutil.copytree(tiny_lm, tmp / "runs" / tiny_lm.name)
    return tmp, tmp / "runs" / tiny_lm.name


def tiny_phonebook(tmp):
    recipe = {
        "base": "phonebook_tiny",
        "task": {
            "max_seq_length": 256,
            "phonebook": {"train_books": 24, "validation_books": 6, "entries": [2, 5], "queries": [1, 2]},
        },
        "train": {
            "steps": 3,
            "batch_size": 4,
            "eval_every": 0,
            "checkpoint_every": 0,
            "log_every": 1,
            "out_dir": str(tmp / "runs"),
        },
    }
    path = tmp / "pb.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_phonebook_finetune_then_evaluate(lm_run):
    tmp, run = lm_run
    invoke("finetune", "--ckpt", run, "--task", "phonebook", "--recipe", tiny_phonebook(tmp), "-q")
    ft = tmp / "runs" / f"{run.name}-phonebook"
    rows = [json.loads(ln) for ln in (ft / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r.get("split") == "validation"]
    assert len([r for r in rows if "split" not in r]) == 3
    assert val and 0 <= val[-1]["exact_match"] <= 1 and val[-1]["samples"] == 6
    held_out = [json.loads(ln) for ln in (ft / "phonebook-validation.jsonl").read_text().splitlines()]
    assert len(held_out) == 6 and all(p["response"].count("-") == 2 * p["queries"] for p in held_out)
    invoke("evaluate", "--ckpt", ft, "--task", "phonebook", "--limit", 3)
    result = json.loads((ft / "eval" / "phonebook-validation.json").read_text())
    assert result["metrics"]["books"] == 3 and len(result["records"]) == 3
    assert result["step"] == 3
    # the books evaluated are not the validation books finetuning saw (their own seed stream)
    seen = {p["prompt"] for p in held_out}
    assert not any(r["numbers"] and any(n in s for s in seen for n in r["numbers"]) for r in result["records"])
    out = invoke("generate", "--ckpt", ft, "--prompt", held_out[0]["prompt"], "--max-tokens", 4)
    assert "<|end|>" not in out.output


def test_instruct_finetune_on_local_pairs(lm_run):
    tmp, run = lm_run
    pairs = tmp / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({"prompt": f"Say {w}.", "response": f"{w}!"}) + "\n"
            for w in ["yes", "no", "maybe", "hello", "goodbye", "thanks"] * 4
        )
    )
    invoke(
        "finetune",
        "--ckpt",
        run,
        "--task",
        "instruct",
        "--train-file",
        pairs,
        "--name",
        "inst",
        "-q",
        "--set",
        "train.epochs=null",
        "--set",
        "train.steps=2",
        "--set",
        "train.batch_size=2",
        "--set",
        "task.max_seq_length=64",
        "--set",
        f"train.out_dir={tmp / 'runs'}",
    )
    ft = tmp / "runs" / "inst"
    assert json.loads((ft / "run.json").read_text())["task"] == "instruct"
    assert (ft / "summary.json").is_file()


def test_lm_task_errors_are_one_line(lm_run, tmp_path):
    tmp, run = lm_run
    r = invoke("finetune", "--ckpt", run, "--task", "sst2", code=None)
    assert r.exit_code != 0 and "phonebook" in r.output and "Traceback" not in r.output
    r = invoke("finetune", "--ckpt", run, "--task", "instruct", code=None)
    assert r.exit_code != 0 and "--train-file" in r.output
    r = invoke("evaluate", "--ckpt", run, "--task", "infilling", code=None)
    assert r.exit_code != 0 and "--validation-file" in r.output and "Traceback" not in r.output
    r = invoke("evaluate", "--ckpt", run, "--task", "squad_v2", code=None)  # offline, no local files
    assert r.exit_code != 0 and "--data-dir" in r.output and "Traceback" not in r.output
    r = invoke("evaluate", "--ckpt", run, "--task", "lm-eval:hellaswag", "--limit", 2, code=None)  # hub task, offline
    assert r.exit_code != 0 and "--data-dir" in r.output and "Traceback" not in r.output


def test_squad_and_infilling_evaluations(lm_run, tmp_path):
    from ssmlm.data.infilling import synthetic_items, write_jsonl

    tmp, run = lm_run
    squad = {
        "version": "v2.0",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "The cat sat on the mat near the door.",
                        "qas": [
                            {
                                "id": "a",
                                "question": "Where did the cat sit?",
                                "is_impossible": False,
                                "answers": [{"text": "on the mat", "answer_start": 8}],
                            },
                            {
                                "id": "b",
                                "question": "Who is the king?",
                                "is_impossible": True,
                                "answers": [],
                                "plausible_answers": [{"text": "cat", "answer_start": 4}],
                            },
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(squad))
    invoke("evaluate", "--ckpt", run, "--task", "squad_v2", "--data-dir", tmp_path)
    result = json.loads((run / "eval" / "squad_v2-validation.json").read_text())
    assert result["metrics"]["items"] == 1  # the unanswerable question is dropped
    assert {"contains_label", "f1"} <= result["metrics"].keys() and result["by_length"]
    path = tmp_path / "infilling.jsonl"
    write_jsonl(synthetic_items(4, seed=0), path)
    invoke("evaluate", "--ckpt", run, "--task", "infilling", "--validation-file", path)
    result = json.loads((run / "eval" / "infilling-validation.json").read_text())
    assert result["metrics"]["items"] == 4 and 0 <= result["metrics"]["accuracy"] <= 1
