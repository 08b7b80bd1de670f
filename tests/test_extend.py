"""extend-length for every encoder family: what is kept, what grows, and that training runs at 4x."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import invoke
from flax import nnx

from ssmlm.models import build_mlm, extend_hook
from ssmlm.models.config import fields_of
from ssmlm.recipe import ModelConfig
from ssmlm.runs import open_run
from ssmlm.train.transplant import transplant


def cfg(arch, n, **kw):
    base = dict(
        arch=arch,
        vocab_size=40,
        hidden_size=16,
        num_layers=2,
        intermediate_size=32,
        max_seq_length=n,
        num_ssm=8,
        num_heads=2,
        tiny_attention_size=8,
        dropout=0.0,
    )
    return ModelConfig(**{k: v for k, v in base.items() if k in fields_of(arch)}, **kw)


def extended(arch, n_old=8, n_new=32, position_init="tile"):
    src = build_mlm(cfg(arch, n_old), seed=1)
    tgt = build_mlm(cfg(arch, n_new), seed=2)
    report = transplant(tgt, nnx.state(src, nnx.Param), position_init, extend_hook(arch))
    return src, tgt, report


def test_bigs_forward_direction_is_unchanged_on_the_prefix():
    """The forward SSM is causal and its kernel is evaluated, not stored, so after extending 8 → 32 the
    forward stream on the first 8 positions is exactly what the 8-token model computed."""
    src, tgt, report = extended("bigs")
    assert report["extended"] == 1 and report["fresh"] == 0  # only the position table grows
    for ls, lt in zip(src.encoder.layers, tgt.encoder.layers, strict=True):
        np.testing.assert_allclose(np.asarray(lt.ssm_f.kernel(32))[:8], np.asarray(ls.ssm_f.kernel(8)), rtol=1e-6)
    x = jax.random.normal(jax.random.key(0), (2, 32, 16))
    short = src.encoder.layers[0]
    long = tgt.encoder.layers[0]
    fwd = lambda layer, x: layer.w_u1(layer.ssm_f(jax.nn.gelu(layer.w_f(layer.norm(x)), approximate=False)))  # noqa: E731
    np.testing.assert_allclose(np.asarray(fwd(long, x))[:, :8], np.asarray(fwd(short, x[:, :8])), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("position_init", ["tile", "random"])
def test_bert_position_table_keeps_learned_rows(position_init):
    src, tgt, report = extended("bert", position_init=position_init)
    old = np.asarray(src.encoder.embeddings.position.embedding[...])
    new = np.asarray(tgt.encoder.embeddings.position.embedding[...])
    np.testing.assert_array_equal(new[:8], old)
    if position_init == "tile":
        np.testing.assert_array_equal(new[8:16], old)
    else:
        assert not np.allclose(new[8:16], old)


def test_gmlp_spatial_weights_grow_with_zero_offsets_and_unit_bias():
    src, tgt, report = extended("gmlp")
    # spatial weight and bias of each of the 2 layers (unrolled: model.scan_layers auto keeps 2 layers apart)
    assert report["extended"] == 4
    ids = jnp.arange(8, dtype=jnp.int32)[None] % 40 + 5
    # With the new offsets at zero, an 8-token input sees exactly the old weights.
    np.testing.assert_allclose(np.asarray(tgt(ids)), np.asarray(src(ids)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "gmlp"])
@pytest.mark.slow  # 25-35 s each (CI time); BiGS extends by default in test_cli_pipeline
def test_extend_length_trains_at_4x(arch, tmp_path, corpus_file):
    os.chdir(tmp_path)
    heads = ", num_heads: 2" if arch == "bert" else ""  # gMLP has no num_heads
    (tmp_path / "r.yaml").write_text(
        f"""
base: default
model: {{arch: {arch}, hidden_size: 16, num_layers: 1, intermediate_size: 32, max_seq_length: 16{heads}}}
data: {{source: "{corpus_file}", vocab_size: 150}}
objective: {{duplicate_factor: 1}}
train: {{steps: 2, batch_size: 4, log_every: 1, eval_every: 0, checkpoint_every: 0, out_dir: "{tmp_path / "runs"}"}}
"""
    )
    (tmp_path / "x.yaml").write_text("base: r.yaml\nmodel: {max_seq_length: 64}\n")
    invoke("pretrain", tmp_path / "r.yaml", "--name", "src", "-q")
    invoke("extend-length", tmp_path / "x.yaml", "--from", tmp_path / "runs/src", "-q")
    run = open_run(tmp_path / "runs/src-L64")
    assert run.recipe.model.max_seq_length == 64 and run.recipe.model.arch == arch
    summary = json.loads((run.dir / "summary.json").read_text())
    assert summary["final_step"] == 2 and np.isfinite(summary["train"]["loss"])
