"""A new Birdie LM block is one module plus one registry line (ssmlm.models.config.FAMILIES), added as
docs/developing.md says, through the package as shipped (tests/plugins.py): a throwaway block module in
ssmlm/models/ dry-runs, trains a step through `ssmlm pretrain`, decodes with `ssmlm generate`, and is counted,
described, named and given its parameter rules by its own declaration (the module's ARCHS)."""

import json

import pytest
from plugins import plug_in, python, ssmlm

BLOCK = '''
"""A token-shift toy: each position adds a projection of the previous token of its own sample."""
import jax.numpy as jnp
from flax import nnx

from ssmlm.models.lm import Config, LanguageModel, LMBlock, at_last, linear, mixing_flops, param_rules, rms_norm


class ShiftBlock(nnx.Module):
    def __init__(self, cfg, bidirectional, *, rngs):
        self.norm = rms_norm(cfg, cfg.hidden_size, rngs)
        self.shift = linear(cfg, cfg.hidden_size, cfg.hidden_size, rngs, bias=False)

    def mix(self, x, previous):
        return x + self.shift(self.norm(previous))

    def __call__(self, x, ctx):
        previous = jnp.pad(x, ((0, 0), (1, 0), (0, 0)))[:, :-1]
        return self.mix(x, jnp.where(ctx.fwd_reset[..., None], 0, previous))  # a sample's first token: none

    def init_cache(self, batch, max_len):
        return {"last": jnp.zeros((batch, self.shift.in_features), jnp.float32)}

    def prefill(self, x, ctx, cache):
        return self(x, ctx), {"last": at_last(x, ctx).astype(jnp.float32)}

    def step(self, x, cache, pos):
        return self.mix(x, cache["last"].astype(x.dtype)), {"last": x.astype(jnp.float32)}


ARCHS = {
    "toyshift": LMBlock(
        name="token shift (toy)",
        block=ShiftBlock,
        per_layer_params=lambda cfg: cfg.hidden_size + cfg.hidden_size**2,  # norm scale, W_shift
        mixing_flops=lambda cfg, seq_len: 0.0,
        no_decay=r"(^|/)shift/",
        describe=lambda cfg: ["shift 1"],
    )
}
MODELS = dict.fromkeys(ARCHS, LanguageModel)
'''


def toyshift(tmp_path):
    """The package with the block's module and its registry line."""
    return plug_in(
        tmp_path,
        {"models/toyshift.py": BLOCK},
        {"models/config.py": ("FAMILIES = {", '"toyshift": "ssmlm.models.toyshift",')},
    )


def toy_recipe(tmp_path, corpus):
    import yaml

    recipe = {
        "base": "lm_tiny",
        "name": "toy",
        "model": {"arch": "toyshift", "hidden_size": 16, "num_layers": 2, "max_seq_length": 64},
        "data": {"source": str(corpus), "vocab_size": 300},
        "objective": {"mixture": "clm", "min_sample_space": 16},
        "train": {
            "steps": 1,
            "batch_size": 2,
            "eval_every": 0,
            "checkpoint_every": 0,
            "out_dir": str(tmp_path / "runs"),
        },
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.mark.slow  # ~60 s: three fresh processes, two compiling
def test_a_block_module_dry_runs_trains_and_decodes(tmp_path, corpus_file):
    root = toyshift(tmp_path)
    recipe = toy_recipe(tmp_path, corpus_file)
    assert "shift 1" in ssmlm(root, "pretrain", recipe, "--dry-run")
    ssmlm(root, "pretrain", recipe, "-q")
    run = tmp_path / "runs/toy"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == 1 and summary["kind"] == "pretrain"
    ssmlm(root, "generate", "--ckpt", run, "--prompt", "The cat saw", "--max-tokens", 4)


def test_the_block_is_known_by_its_declaration(tmp_path):
    assert "declared" in python(toyshift(tmp_path), "-c", DECLARED)


DECLARED = """
import dataclasses

from ssmlm.models import build_lm, count_params, family_rules
from ssmlm.models.config import LMConfig, facts, is_lm, lm_archs
from ssmlm.models.flops import abstract
from ssmlm.models.lm import layer_is_bidirectional, param_count_formula

cfg = LMConfig(arch="toyshift", hidden_size=8, num_layers=3, vocab_size=50)
assert is_lm("toyshift") and "toyshift" in lm_archs() and facts("toyshift").name == "token shift (toy)"
assert count_params(abstract(lambda: build_lm(cfg))) == param_count_formula(cfg)["total"]
assert family_rules(cfg)[0].name == "recurrence"  # its no_decay pattern, first
assert [layer_is_bidirectional(cfg, i) for i in range(3)] == [True, False, True]
assert not any(layer_is_bidirectional(dataclasses.replace(cfg, bidirectional="none"), i) for i in range(3))
print('declared')
"""


def test_the_jax_free_index_agrees_with_the_declarations():
    """CONFIGS (optional for a new family: it only keeps recipe checking free of jax) and LMConfig.ATTENTION let a
    recipe be read and a decode length checked without jax: each shipped module's own declarations say the same."""
    from ssmlm.models.config import CONFIGS, FAMILIES, LMConfig, facts, family, lm_archs
    from ssmlm.models.lm import attention_flops, block_spec

    for arch, module in FAMILIES.items():
        assert CONFIGS.get(module, family(arch).Config) is family(arch).Config, arch
        assert facts(arch) is family(arch).ARCHS[arch], arch  # every shipped arch declares its facts
    attention = {a for a in lm_archs() if block_spec(a).mixing_flops is attention_flops}
    assert LMConfig.ATTENTION == attention
