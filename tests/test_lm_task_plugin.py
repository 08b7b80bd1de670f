"""A new language-model task is one module plus one declaration line (ssmlm.data.lm_tasks.LM_TASKS), added as
docs/developing.md says, through the package as shipped (tests/plugins.py): a throwaway task module in
ssmlm/data/, with its reader and its evaluation, is listed by the commands' --help, finetuned on for a step
through `ssmlm finetune` (the CLI's quick task check, the training code, the run directory) and evaluated by
`ssmlm evaluate --task`."""

import json
import shutil

import pytest
from plugins import plug_in, ssmlm

TASK = '''
"""Echo: the response repeats the prompt's word."""
WORDS = ["cat", "dog", "bird", "fish", "tree", "lake", "hill", "road"]


def pairs(recipe, tokenizer, seq_len, quiet):
    pairs = [{"prompt": f"Say {w}.", "response": w} for w in WORDS * 2]
    return pairs[:-2], pairs[-2:]


def evaluate(run, gen, request):
    return {"metrics": {"words": float(request.limit or len(WORDS))}, "records": [], "seen": run.recipe.task.name}
'''


def echo(tmp_path):
    """The package with the task's module and its declaration line."""
    entry = 'LMTask("echo the prompt", reader="ssmlm.data.echo:pairs", evaluation="ssmlm.data.echo:evaluate"),'
    entry = f'"echo": {entry}'
    return plug_in(tmp_path, {"data/echo.py": TASK}, {"data/lm_tasks.py": ("LM_TASKS: dict[str, LMTask] = {", entry)})


@pytest.mark.slow  # ~40 s: two fresh processes, each compiling
def test_a_task_module_finetunes_and_evaluates(tiny_lm, tmp_path):
    root = echo(tmp_path)
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
    ssmlm(
        root,
        "finetune",
        "--ckpt",
        run,
        "--task",
        "echo",
        "--name",
        "echo",
        "-q",
        *[x for s in sets for x in ("--set", s)],
    )
    ft = tmp_path / "runs" / "echo"
    assert json.loads((ft / "run.json").read_text())["task"] == "echo"
    assert json.loads((ft / "summary.json").read_text())["final_step"] == 1
    ssmlm(root, "evaluate", "--ckpt", ft, "--task", "echo", "--limit", 3)
    result = json.loads((ft / "eval" / "echo-validation.json").read_text())
    assert result["metrics"]["words"] == 3 and result["seen"] == "echo" and result["step"] == 1


def test_the_task_is_listed_and_an_unknown_one_refused_by_the_declarations(tiny_lm, tmp_path):
    root = echo(tmp_path)
    assert "echo" in ssmlm(root, "finetune", "--help") and "echo" in ssmlm(root, "evaluate", "--help")
    out = ssmlm(root, "finetune", "--ckpt", tiny_lm, "--task", "ech", code=2)
    assert "echo, phonebook, instruct" in out, out


def test_every_declared_function_exists():
    from ssmlm.data.lm_tasks import LM_TASKS
    from ssmlm.schema import named

    for name, task in LM_TASKS.items():
        for ref in (task.reader, task.evaluation):
            assert ref is None or callable(named(ref)), (name, ref)
