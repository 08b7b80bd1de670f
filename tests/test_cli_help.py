"""The names a command's --help lists are the registries' (mixtures, encoder and language-model tasks, analyses):
every registered name is in the help of the command that takes it, so a new one needs no edit of the CLI."""

from conftest import invoke

from ssmlm.analyze import registry
from ssmlm.data.lm_tasks import LM_TASKS, default_recipe, evaluation_tasks, finetuning_tasks
from ssmlm.data.tasks import TASKS
from ssmlm.objectives.config import MIXTURES


def help_words(*command: str) -> set[str]:
    """The words of `ssmlm COMMAND --help`, wide (rich wraps no name), without their punctuation."""
    out = invoke(*command, "--help", env={"COLUMNS": "200"}).output
    return {w.strip(".,;:()") for w in out.split()}


def test_every_registered_name_is_in_its_commands_help():
    assert set(MIXTURES) - help_words("pretrain") == set()
    finetune = {*TASKS, *finetuning_tasks(), *map(default_recipe, finetuning_tasks())}
    assert finetune - help_words("finetune") == set()
    assert {*evaluation_tasks(), "lm-eval:TASKS"} - help_words("evaluate") == set()
    assert set(finetuning_tasks()) | set(evaluation_tasks()) == set(LM_TASKS)  # each task is in one of the two
    assert set(registry()) - help_words("analyze") == set()
