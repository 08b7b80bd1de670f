"""`--dry-run --target`: the run's own training step compiled for a TPU slice or a GPU node from this CPU machine
(ssmlm.train.aot), its report checked against independent computations, `--fit`, and the step's batch shapes
against batches the objectives really make. The compile tests skip without the extras (pip install 'ssmlm[tpu]',
'ssmlm[gpu-aot]')."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ssmlm.cli import app
from ssmlm.recipe import load_recipe

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
HAS_CUDA_PLUGIN = importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu not installed (pip install 'ssmlm[tpu]')")
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA_PLUGIN, reason="jax's CUDA plugin not installed (pip install 'ssmlm[gpu-aot]')"
)

# a small language model (the LM step: embeddings, blocks, an untied head over every position)
TINY_LM = ["model.hidden_size=32", "model.num_layers=2", "model.state_size=32", "model.max_seq_length=128",
           "train.batch_size=8", "data.vocab_size=512"]  # fmt: skip


def tiny(overrides=(), ref="lm_tiny"):
    return load_recipe(ref, [*TINY_LM, *overrides])


def report_of(recipe, target_text):
    from ssmlm.targets import parse_target
    from ssmlm.train import aot

    work = aot.pretraining_work(recipe, recipe.data.vocab_size)
    return aot.check_on_target(recipe, parse_target(target_text), work), work


def param_bytes(work) -> int:
    """Bytes of the parameters, counted from a model built for real (not the abstract one the report used)."""
    import jax
    from flax import nnx

    model = work.build(work.cfg)
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def opt_bytes(work) -> int:
    """Bytes of the optimizer state the recipe's optimizer makes for the model (its moments and counts)."""
    import jax
    from flax import nnx

    from ssmlm.train.optim import make_optimizer

    params = nnx.state(work.model, nnx.Param)
    tx = make_optimizer(load_recipe("lm_tiny").train, 10, params, work.cfg).tx
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(tx.init, params)))


# ----------------------------------------------------------------------------- batch shapes


def test_batch_shapes_match_real_batches():
    """The abstract batch the step is compiled for has the shapes and (device) dtypes of the batches the
    objectives make: MLM over token rows, the LM objective over documents, a classification task's rows."""
    import jax.numpy as jnp

    from ssmlm.data import reserved as R
    from ssmlm.objectives import build
    from ssmlm.objectives.lm import LMObjective
    from ssmlm.objectives.shapes import batch_shapes
    from ssmlm.objectives.tasks import task_batch

    def same(real, abstract):
        for f in dataclasses.fields(real):
            a, b = getattr(real, f.name), getattr(abstract, f.name)
            assert (a is None) == (b is None), f.name
            if a is not None:
                assert jnp.asarray(a).shape == b.shape and jnp.asarray(a).dtype == b.dtype, f.name

    r = load_recipe("default")
    mlm = build(r.objective, {"mask": 4, "cls": 2, "sep": 3, "pad": 0}, 1000, 128, 0)
    rows = {"tokens": np.random.default_rng(0).integers(5, 1000, (6, 128)), "row": np.arange(6), "copy": np.zeros(6)}
    same(mlm.train_batch(rows, 0), batch_shapes("mlm", 6, 128, mlm.predictions))

    reserved = {t: 1000 + i for i, t in enumerate(R.RESERVED)}
    docs = [np.random.default_rng(i).integers(1, 900, 400).astype(np.int32) for i in range(20)]
    lm = LMObjective(None, reserved, docs, docs[:5], 256, seed=3, mixture="ul2_decoder", batch_size=4)
    same(lm.train_batch(0), batch_shapes("lm", 4, 256))

    task = {"input_ids": np.ones((3, 64), np.int64), "attention_mask": np.ones((3, 64), np.int64),
            "token_type_ids": np.zeros((3, 64), np.int64), "labels": np.array([0, 1, 0])}  # fmt: skip
    same(task_batch(task), batch_shapes("classification", 3, 64))


# ----------------------------------------------------------------------------- TPU


@needs_libtpu
def test_tpu_report_against_independent_counts():
    """v5e, 4 chips, data parallel: every chip holds the parameters and AdamW's two moments (float32), a quarter
    of the batch; the data-parallel step all-reduces the gradients and gathers no parameters."""
    r = tiny(["mesh.data=4", "mesh.fsdp=1"])
    rep, work = report_of(r, "v5e:2x2")
    pb = param_bytes(work)
    assert rep["params"] * 4 == pb  # float32 parameters
    batch = 8 * 128 * (6 * 4) // 4  # tokens, segments, positions, targets, weights, token types: 4 bytes each
    expected = 3 * pb + batch
    # at least that; a TPU pads small arrays to its (8, 128) tiles, which at d 32 nearly doubles it (the GPU test
    # below holds the count exactly)
    assert expected <= rep["memory"]["arguments"] <= 2 * expected, (rep["memory"]["arguments"], expected)
    assert rep["memory"]["fits"] and rep["memory"]["total"] < rep["memory"]["hbm"]
    assert rep["collectives"]["all-reduce"]["runs"] > 0 and rep["collectives"]["all-gather"]["runs"] == 0
    flops = rep["model_flops_per_step"]
    assert flops >= 6 * (rep["params"] - 512 * 32) * 8 * 128  # 6 per parameter (but the embedding's) per token
    est = rep["roofline"]
    assert est["step_seconds_at_least"] >= flops / (4 * 197e12) and 0 < est["mfu_at_most"] <= 1
    assert rep["paths"]["scan"].startswith("associative")  # auto, for the TPU


@needs_libtpu
def test_tpu_fsdp_gathers_parameters_and_scatters_gradients():
    """Parameters fully sharded over 4 chips: each chip's arguments are a quarter of the dense kernels; the step
    all-gathers them and reduce-scatters their gradients. On one chip there is no collective at all."""
    r = tiny(["mesh.data=1", "mesh.fsdp=4"])
    rep, work = report_of(r, "v5e:2x2")
    dp, _ = report_of(tiny(["mesh.data=4"]), "v5e:2x2")
    assert rep["memory"]["arguments"] < 0.6 * dp["memory"]["arguments"]
    comm = rep["collectives"]
    assert comm["all-gather"]["runs"] > 0 and comm["reduce-scatter"]["runs"] > 0, comm
    one, _ = report_of(tiny(["mesh.data=1", "train.batch_size=2"]), "v5e-1")
    assert all(c["runs"] == 0 for c in one["collectives"].values()), one["collectives"]


@needs_libtpu
def test_tpu_out_of_memory_is_a_result():
    """A batch whose logits alone exceed a v5e chip's 16 GB: XLA refuses the program, the report says it does not
    fit and how much it needed (above the chip's HBM)."""
    r = tiny(["data.vocab_size=32000", "train.batch_size=64", "model.max_seq_length=2048", "mesh.data=1"])
    rep, _ = report_of(r, "v5e-1")
    m = rep["memory"]
    logits = 64 * 2048 * 32000 * 4
    assert not m["fits"] and (m["total"] is None or m["total"] > m["hbm"]) and logits > m["hbm"]


# ----------------------------------------------------------------------------- GPU


@needs_cuda
def test_gpu_report_and_accumulation_bounds_memory():
    """Two H100s, data parallel: the gradients are all-reduced; accumulating 4 micro-batches needs far fewer
    temporaries than the whole batch at once (each device keeps its own rows of every micro-batch)."""
    big = ["data.vocab_size=8192", "train.batch_size=32", "mesh.data=2"]
    whole, work = report_of(tiny(big), "h100-80gb:2")
    accum, _ = report_of(tiny([*big, "train.grad_accum=4"]), "h100-80gb:2")
    assert whole["memory"]["fits"] and whole["collectives"]["all-reduce"]["runs"] > 0
    pb, ob = param_bytes(work), opt_bytes(work)
    assert abs(ob - 2 * pb) < 0.01 * pb  # AdamW: two float32 moments
    # + the batch's share and the step number, less the inputs the model never reads (the gated SSM has no use for
    # positions): jit drops unused arguments
    assert pb + ob <= whole["memory"]["arguments"] <= pb + ob + 32 * 128 * 24 // 2 + 4
    assert accum["memory"]["temporaries"] < 0.5 * whole["memory"]["temporaries"], (accum["memory"], whole["memory"])


@needs_cuda
def test_fit_finds_the_accumulation_that_fits():
    """A batch whose logits exceed one H100's 80 GB: --fit finds the smallest grad_accum that fits and says it
    as --set overrides; the report of that setting fits."""
    from ssmlm.train import fit

    r = tiny(["data.vocab_size=32000", "train.batch_size=256", "model.max_seq_length=2048", "mesh.data=1"])
    from ssmlm.train import aot

    found = fit.fit_on_target(r, aot.pretraining_work(r, 32000), "h100-80gb", quiet=True)
    assert found["chosen"] is not None, found
    g = int(next(o for o in found["overrides"] if o.startswith("train.grad_accum=")).split("=")[1])
    assert g > 1 and found["report"]["memory"]["fits"]
    smaller = [t for t in found["tried"] if "remat off" in t["setting"] and f"grad_accum {g}" not in t["setting"]]
    assert any(not t["fits"] for t in smaller)  # something smaller was tried and did not fit


# ----------------------------------------------------------------------------- the command line


@needs_libtpu
def test_cli_target_json(tmp_path):
    args = ["pretrain", "lm_tiny", "--dry-run", "--target", "v5e:2x2", "--json", "-q"]
    out = CliRunner().invoke(app, [*args, *sum((["--set", s] for s in TINY_LM), [])])
    assert out.exit_code == 0, out.output
    rep = json.loads(out.output[out.output.index("{") :])
    assert rep["target"] == "v5e:2x2" and rep["chips"] == 4 and rep["memory"]["fits"]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--target", "v9z:2x2", "--dry-run"], "v5e"),  # an unknown target lists the known ones
        (["--target", "v5e:3x3", "--dry-run"], "v5e"),  # a shape the target does not have
        (["--target", "v5e:2x2"], "--dry-run"),
        (["--fit"], "--target"),
        (["--target", "paper", "--dry-run"], "paper_target"),  # lm_tiny records no paper hardware
    ],
)
def test_cli_target_errors(args, says):
    out = CliRunner().invoke(app, ["pretrain", "lm_tiny", *args])
    assert out.exit_code == 2 and says in out.output and "Traceback" not in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1, out.output


@needs_libtpu
def test_cli_batch_that_does_not_split():
    out = CliRunner().invoke(app, ["pretrain", "lm_tiny", "--dry-run", "--target", "v5e:2x2", "--set",
                                   "train.batch_size=6", "--set", "mesh.fsdp=-1", "--set", "mesh.data=1"])  # fmt: skip
    assert out.exit_code == 2 and "train.batch_size = 6" in out.output, out.output


@needs_cuda
def test_finetune_and_extend_length_compile_for_a_target(tiny_encoder, tiny_lm):
    """finetune (an encoder's classification head, a language model's prompt rows) and extend-length (the source's
    model at the new length) compile their own steps for a target too."""

    def report(*args):
        out = CliRunner().invoke(app, [*args, "--dry-run", "--target", "h100-80gb", "--json", "-q"])
        assert out.exit_code == 0, out.output
        return json.loads(out.output[out.output.index("{") :])

    clf = report("finetune", "--ckpt", str(tiny_encoder), "--task", "builtin-order")
    assert clf["kind"] == "classification" and clf["memory"]["fits"]
    lm = report("finetune", "--ckpt", str(tiny_lm), "--task", "phonebook", "--recipe", "phonebook_tiny")
    assert lm["kind"] == "lm" and lm["memory"]["fits"]
    ext = report("extend-length", "default_extend", "--from", str(tiny_encoder))
    assert ext["kind"] == "mlm" and ext["seq_len"] == load_recipe("default_extend").model.max_seq_length
