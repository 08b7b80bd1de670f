"""Every shipped pretraining recipe builds abstractly at its own size through `ssmlm pretrain --dry-run` (its own
file, so that pytest-xdist's per-file scheduling runs it beside the recipe training smoke test)."""

import os

import pytest
from conftest import invoke

from ssmlm.recipe import builtin_recipes

FINETUNE = {"finetune_default", "glue_bigs", "squad_bigs", "scrolls_bigs"}
PRETRAIN = sorted(set(builtin_recipes()) - FINETUNE)

# paper-size Birdie recipes: the parameter counts the README's table quotes (``--dry-run``)
PAPER_SIZE = {
    "birdie_gated_ssm_1b4": "1,390,053,376",
    "birdie_gated_ssm_plus_1b4": "1,386,735,616",
    "birdie_hawk_1b4": "1,379,330,048",
    "birdie_transformer_1b4": "1,339,082,752",
}


# the largest gMLP/aMLP builds take 20-60 s each on 2 cores (test_gmlp dry-runs gmlp_base/amlp_base by default)
SLOW_DRY = {"gmlp_xlarge", "gmlp_large", "amlp_large", "gmlp_depth144", "gmlp_depth72"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_DRY else n for n in PRETRAIN])
def test_recipe_dry_runs_as_shipped(name, tmp_path):
    """Every recipe builds abstractly at its own size (nothing allocated, read or written)."""

    os.chdir(tmp_path)
    r = invoke("pretrain", name, "--dry-run", "--set", f"train.out_dir={tmp_path / 'runs'}")
    assert "parameters" in r.output
    if name in PAPER_SIZE:
        assert PAPER_SIZE[name] in r.output, r.output
    assert not (tmp_path / "runs").exists()
