"""Every shipped pretraining recipe trains for two steps at a small size on generated data (its
architecture, options and optimizer settings as written; only sizes, steps and data are overridden)."""

import dataclasses
import json
import os

import pytest
from conftest import invoke

from ssmlm.models.config import fields_of
from ssmlm.recipe import builtin_recipes, load_recipe

FINETUNE = {"finetune_default", "glue_bigs", "squad_bigs", "scrolls_bigs"}
PRETRAIN = sorted(set(builtin_recipes()) - FINETUNE)

SMALL = [
    "model.hidden_size=16",
    "model.num_layers=1",
    "model.intermediate_size=32",
    "model.max_seq_length=32",
    "data.vocab_size=150",
    "data.validation_fraction=0.1",
    "objective.duplicate_factor=1",
    "objective.max_predictions=5",
    "train.steps=2",
    "train.batch_size=4",
    "train.eval_every=0",
    "train.checkpoint_every=0",
    "train.grad_accum=1",
]


FAMILY_SMALL = {"num_ssm": 8, "num_heads": 2, "tiny_attention_size": 8, "state_size": 8}


def test_every_recipe_is_listed():
    assert {"default", "bigs_full", "bert_large", "stack_ssm", "gated_att", "gmlp_base", "amlp_base"} <= set(PRETRAIN)
    for name in FINETUNE:
        assert load_recipe(name).train.epochs


def small_sets(name: str) -> list[str]:
    own = fields_of(load_recipe(name).model.arch)  # only the family's own size fields
    return [*SMALL, *(f"model.{k}={v}" for k, v in FAMILY_SMALL.items() if k in own)]


def distinct_at_small_size() -> list:
    """Every recipe; one whose small-size recipe equals an earlier one's but for its name (e.g. bigs_12l and
    bigs_12l_4096, whose sizes the overrides replace) trains the same program, so it runs only with -m slow."""
    seen, params = set(), []
    for name in PRETRAIN:
        key = dataclasses.replace(load_recipe(name, small_sets(name)), name="").to_yaml()
        params.append(pytest.param(name, marks=[pytest.mark.slow] if key in seen else [], id=name))
        seen.add(key)
    return params


@pytest.fixture(scope="module")
def shared_corpus(tmp_path_factory):
    """One corpus for the module: recipes with the same data settings then share its tokenizer and shards (the
    cache is keyed by the corpus files), so each test is mostly its own program's compilation."""
    from conftest import english_lines

    d = tmp_path_factory.mktemp("corpus")
    for i in range(40):
        (d / f"doc{i:02d}.txt").write_text("\n".join(english_lines(30, seed=i)) + "\n")
    return d


@pytest.mark.parametrize("name", distinct_at_small_size())
def test_recipe_trains_small(name, tmp_path, shared_corpus):

    os.chdir(tmp_path)
    sets = [*small_sets(name), f"data.source={shared_corpus}", f"train.out_dir={tmp_path / 'runs'}"]
    args = ["pretrain", name, "--name", "smoke", "-q"] + [x for s in sets for x in ("--set", s)]
    invoke(*args)
    summary = json.loads((tmp_path / "runs/smoke/summary.json").read_text())
    assert summary["final_step"] == 2
    recipe = load_recipe(name)
    written = load_recipe(str(tmp_path / "runs/smoke/recipe.yaml"))
    assert written.model.arch == recipe.model.arch and written.train.learning_rate == recipe.train.learning_rate
