"""A new Birdie objective in a new mixture, added as docs/developing.md says: its module in
ssmlm/objectives/birdie/ (the objective function and the mixture's function), a line in
``functions.OBJECTIVES`` and a line in ``ssmlm.objectives.config.MIXTURES``. Through the registries as shipped
(tests/plugins.py), the mixture is a value `objective.mixture` takes and `pretrain --help` lists, and a short
`ssmlm pretrain` on it samples the new objective."""

import json

import pytest
import yaml
from conftest import TINY_LM_SEQ_LEN, corpus_dir
from plugins import plug_in, ssmlm

MODULE = '''
"""Reversal: the prefix is a stretch of the document, the target the same stretch backwards."""
import os

import numpy as np

from ssmlm.objectives.birdie.functions import Sample
from ssmlm.objectives.birdie.mixtures import Config


def reverse(src, space, rng, ids, *, max_len=None, min_len=2):
    n = min(len(src), space // 2, max_len or space)
    if n < min_len:
        return None
    with open(os.environ["REVERSED"], "a") as f:  # the test's witness that this objective was sampled
        f.write(f"{n}\\n")
    x = np.asarray(src[:n], np.int32)
    return Sample(x, x[::-1].copy(), n)


def mixture():
    return [Config("copying", "reverse", {"max_len": 64}), Config("next_token", "next_token")], np.array([0.5, 0.5])
'''


@pytest.mark.slow  # ~30 s: a tokenizer, a compile and 2 steps in a fresh process
def test_an_objective_in_a_new_mixture_is_sampled(tmp_path):
    root = plug_in(
        tmp_path,
        {"objectives/birdie/reverse.py": MODULE},
        {
            "objectives/birdie/functions.py": (
                "OBJECTIVES = {",
                '"reverse": "ssmlm.objectives.birdie.reverse:reverse",',
            ),
            "objectives/config.py": ("MIXTURES = {", '"reversal": "ssmlm.objectives.birdie.reverse:mixture",'),
        },
    )
    assert "reversal" in ssmlm(root, "pretrain", "--help")
    recipe = {
        "base": "lm_tiny",
        "name": "reversal",
        "model": {"arch": "gated_ssm", "hidden_size": 32, "num_layers": 2, "state_size": 32, "num_heads": 2},
        "data": {"source": str(corpus_dir(tmp_path / "corpus", 20, 20)), "vocab_size": 300},
        "objective": {"mixture": "reversal", "min_sample_space": 16},
        "train": {"steps": 2, "batch_size": 2, "eval_every": 0, "checkpoint_every": 0, "out_dir": str(tmp_path)},
    }
    recipe["model"]["max_seq_length"] = TINY_LM_SEQ_LEN
    (tmp_path / "reversal.yaml").write_text(yaml.safe_dump(recipe))
    witness = tmp_path / "reversed.txt"
    ssmlm(root, "pretrain", tmp_path / "reversal.yaml", "-q", env={"REVERSED": str(witness)}, cwd=tmp_path)
    assert json.loads((tmp_path / "reversal/summary.json").read_text())["final_step"] == 2
    assert witness.exists() and witness.read_text().split(), "the new objective was never sampled"
    refused = ssmlm(root, "pretrain", tmp_path / "reversal.yaml", "--set", "objective.mixture=reversl", code=2)
    assert "did you mean 'reversal'?" in refused, refused
