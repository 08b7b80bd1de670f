"""A new model family is one module plus one registry line (ssmlm.models.config.FAMILIES), added as
docs/developing.md says, through the package as shipped (tests/plugins.py): a throwaway family module in
ssmlm/models/ trains a step through `ssmlm pretrain`, is pooled, labelled and named by its own declarations,
evaluates, and has its own field checked by its FIELD_RANGES."""

import json

import pytest
from plugins import plug_in, python, ssmlm

FAMILY = '''
"""A token-mixing toy: each block adds the mean of the sequence (over real tokens) to every position."""
import dataclasses
from typing import ClassVar, Literal

import jax.numpy as jnp
from flax import nnx

from ssmlm.models.config import ArchFacts, ModelConfig
from ssmlm.models.layers import Encoder, dense, gelu, layer_norm
from ssmlm.models.rules import common_rules
from ssmlm.schema import above


@dataclasses.dataclass(frozen=True)
class Config(ModelConfig):
    arch: Literal["toymix"] = "toymix"
    mix_scale: float = 1.0  # a field of this family alone
    POOLERS: ClassVar[dict] = {"toymix": "cls"}
    ROUTES: ClassVar[dict] = {"toymix": "toy / mean"}
    FIELD_RANGES: ClassVar[dict] = {**ModelConfig.FIELD_RANGES, "mix_scale": above(0)}


class Block(nnx.Module):
    def __init__(self, cfg, *, rngs):
        self.norm = layer_norm(cfg, cfg.hidden_size, rngs)
        self.up = dense(cfg, cfg.hidden_size, cfg.intermediate_size, rngs)
        self.down = dense(cfg, cfg.intermediate_size, cfg.hidden_size, rngs)
        self.act, self.scale = gelu(cfg), cfg.mix_scale

    def __call__(self, x, mask=None, rng=None, *, intermediates=False):
        m = jnp.ones(x.shape[:2]) if mask is None else mask.astype(x.dtype)
        mean = (x * m[..., None]).sum(1, keepdims=True) / jnp.maximum(m.sum(1)[:, None, None], 1)
        out = x + self.scale * mean + self.down(self.act(self.up(self.norm(x))))
        return (out, {}) if intermediates else out


class ToyEncoder(Encoder):
    def __init__(self, cfg, *, rngs):
        super().__init__(cfg, Block, rngs=rngs)


MODELS = {"toymix": ToyEncoder}
ARCHS = {"toymix": ArchFacts(name="toy mix")}


def mixing_flops(cfg, seq_len):
    return 0.0


def param_rules(cfg):
    return common_rules()
'''


def toymix(tmp_path):
    """The package with the family's module and its registry line."""
    return plug_in(
        tmp_path,
        {"models/toymix.py": FAMILY},
        {"models/config.py": ("FAMILIES = {", '"toymix": "ssmlm.models.toymix",')},
    )


@pytest.mark.slow  # ~40 s: two fresh processes, each compiling
def test_a_family_module_trains_through_the_cli(tmp_path, corpus_file):
    root = toymix(tmp_path)
    sets = [
        "model.arch=toymix",
        "model.mix_scale=0.5",
        "model.hidden_size=16",
        "model.num_layers=2",
        "model.intermediate_size=32",
        "model.max_seq_length=32",
        "data.vocab_size=150",
        "data.validation_fraction=0.1",
        f"data.source={corpus_file}",
        "objective.duplicate_factor=1",
        "train.steps=1",
        "train.batch_size=4",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        f"train.out_dir={tmp_path / 'runs'}",
    ]
    ssmlm(root, "pretrain", "--name", "toy", "-q", *[x for s in sets for x in ("--set", s)])
    run = tmp_path / "runs/toy"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_step"] == 1 and summary["kind"] == "pretrain"
    assert "mix_scale: 0.5" in (run / "recipe.yaml").read_text()
    ssmlm(root, "evaluate", "--ckpt", run)
    assert json.loads(next((run / "eval").glob("*.json")).read_text())["metrics"]["mlm_loss"] > 0


def test_the_family_is_known_by_its_declarations(tmp_path):
    root = toymix(tmp_path)
    code = (
        "from ssmlm.evaluate.tables import _model_label\n"
        "from ssmlm.models.config import config_class, default_pooler, facts, is_lm\n"
        "cfg = config_class('toymix')(arch='toymix')\n"
        "print(is_lm('toymix'), default_pooler(cfg), _model_label({'arch': 'toymix'}), facts('toymix').name)"
    )
    assert "False cls toy / mean toy mix" in python(root, "-c", code)


def test_the_new_family_checks_its_own_field(tmp_path):
    root = toymix(tmp_path)
    out = ssmlm(root, "pretrain", "--dry-run", "--set", "model.arch=toymix", "--set", "model.mix_scale=-1.0", code=2)
    assert "'model.mix_scale' = -1.0: expected more than 0" in out, out
    out = ssmlm(root, "pretrain", "--dry-run", "--set", "model.mix_scale=0.5", code=2)
    assert "mix_scale" in out and "toymix" in out, out
