"""A new language-model task is one module plus one declaration line (ssmlm.data.lm_tasks.LM_TASKS): a throwaway
task written to a temporary module, with its reader and its evaluation, is finetuned on for a step through
`ssmlm finetune` (the CLI's quick task check, the training code, the run directory) and evaluated by
`ssmlm evaluate --task`."""

import json
import shutil
import sys
import textwrap

import pytest
from conftest import invoke

TASK = '''
"""Echo: the response repeats the prompt's word."""
WORDS = ["cat", "dog", "bird", "fish", "tree", "lake", "hill", "road"]


def pairs(recipe, tokenizer, seq_len, quiet):
    pairs = [{"prompt": f"Say {w}.", "response": w} for w in WORDS * 2]
    return pairs[:-2], pairs[-2:]


def evaluate(run, gen, request):
    return {"metrics": {"words": float(request.limit or len(WORDS))}, "records": [], "seen": run.recipe.task.name}
'''


@pytest.fixture
def echo(tmp_path, monkeypatch):
    from ssmlm.data import lm_tasks

    (tmp_path / "echo_task.py").write_text(textwrap.dedent(TASK))
    monkeypatch.syspath_prepend(str(tmp_path))
    declared = lm_tasks.LMTask("echo the prompt's word", reader="echo_task:pairs", evaluation="echo_task:evaluate")
    monkeypatch.setitem(lm_tasks.LM_TASKS, "echo", declared)  # the one declaration line
    yield
    sys.modules.pop("echo_task", None)


def test_a_task_module_finetunes_and_evaluates(echo, tiny_lm, tmp_path):
    run = tmp_path / "runs" / tiny_lm.name
    shutil.copytree(tiny_lm, run)
    sets = [
        "train.epochs=null",
        "train.steps=1",
        "train.batch_size=2",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        "task.max_seq_length=64",
        f"train.out_dir={tmp_path / 'runs'}",
    ]
    invoke(
        "finetune", "--ckpt", run, "--task", "echo", "--name", "echo", "-q", *[x for s in sets for x in ("--set", s)]
    )
    ft = tmp_path / "runs" / "echo"
    assert json.loads((ft / "run.json").read_text())["task"] == "echo"
    assert json.loads((ft / "summary.json").read_text())["final_step"] == 1
    invoke("evaluate", "--ckpt", ft, "--task", "echo", "--limit", 3)
    result = json.loads((ft / "eval" / "echo-validation.json").read_text())
    assert result["metrics"]["words"] == 3 and result["seen"] == "echo" and result["step"] == 1


def test_an_unknown_task_is_refused_by_the_declarations(echo, tiny_lm, tmp_path):
    r = invoke("finetune", "--ckpt", tiny_lm, "--task", "ech", code=None)
    assert r.exit_code != 0 and "phonebook, instruct, echo" in r.output


def test_every_declared_function_exists():
    from ssmlm.data.lm_tasks import LM_TASKS, function

    for name, task in LM_TASKS.items():
        for ref in (task.reader, task.evaluation):
            assert ref is None or callable(function(ref)), (name, ref)
