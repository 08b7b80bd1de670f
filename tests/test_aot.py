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


@pytest.mark.slow  # 50-100 s on 2 busy cores: out of the default suite's 15 minutes; .ci/run runs it
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


@needs_cuda
def test_cli_gpu_target_prints_nothing_of_the_cuda_plugin(tmp_path):
    """A real `ssmlm` process on this CPU machine with JAX_PLATFORMS=cpu set by the user (as the tests do): the
    plugin's "Could not find cuda drivers" and absl lines stay hidden under --target too."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    args = [
        "pretrain",
        "lm_tiny",
        "--dry-run",
        "--target",
        "h100-80gb:1",
        "-q",
        *sum((["--set", s] for s in TINY_LM), []),
    ]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "ssmlm", *args], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "h100" in done.stdout.lower()
    assert "cuda" not in done.stderr.lower() and "absl" not in done.stderr, done.stderr


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


@pytest.mark.slow  # 50-100 s on 2 busy cores: out of the default suite's 15 minutes; .ci/run runs it
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


# ----------------------------------------------------------------------------- loops' trip counts


# a report as check_on_target writes it, for the printout (its collectives and loops are the test's own)
SMALL_REPORT = {
    "target": "v5e:2x2", "chips": 4, "devices": 4, "hosts": 1, "accelerator": "TPU v5e", "recipe": "lm_tiny",
    "mesh": {"data": 4, "fsdp": 1, "tensor": 1}, "batch_size": 8, "seq_len": 128, "grad_accum": 1,
    "micro_batch_per_device": 2, "remat": False, "params": 1000, "compile_seconds": 1.0,
    "memory": {"fits": True, "total": 1, "hbm": 2}, "model_flops_per_step": 1e9,
    "roofline": {"step_seconds_at_least": 1e-3, "bound_by": "compute", "tokens_per_second_at_most": 1e6,
                 "mfu_at_most": 0.5},
}  # fmt: skip


def loop_hlo(cond_root: str, start: str = "0", update: str = "add(%i, %one)", known: str = "") -> str:
    """A program of one while loop holding one all-reduce, in the text form XLA prints (libtpu's: no
    known_trip_count unless ``known`` adds it): counter = element 0 of the loop's tuple."""
    return f"""HloModule m

%sum (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

%body (p: (s32[], f32[1024])) -> (s32[], f32[1024]) {{
  %p = (s32[]{{:T(128)}}, f32[1024]{{0:T(1024)}}) parameter(0)
  %one = s32[] constant(1)
  %two = s32[] constant(2)
  %g = s32[] get-tuple-element(%p), index=0
  %i = s32[] copy(%g)
  %x = f32[1024] get-tuple-element(%p), index=1
  %r = f32[1024] all-reduce(%x), channel_id=1, replica_groups={{{{0,1,2,3}}}}, to_apply=%sum
  %next = s32[] {update}
  ROOT %t = (s32[], f32[1024]) tuple(%next, %r)
}}

%cond (q: (s32[], f32[1024])) -> pred[] {{
  %q = (s32[], f32[1024]) parameter(0)
  %n = s32[] constant(6)
  %c = s32[] get-tuple-element(%q), index=0
  %f = f32[1024] get-tuple-element(%q), index=1
  ROOT %lt = pred[] {cond_root}
}}

ENTRY %main (x: f32[1024]) -> f32[1024] {{
  %x = f32[1024] parameter(0)
  %start = s32[] constant({start})
  %c0 = s32[] copy(%start)
  %init = (s32[], f32[1024]) tuple(%c0, %x)
  %w = (s32[], f32[1024]) while(%init), condition=%cond, body=%body, metadata={{op_name="jit(f)/while"}}{known}
  ROOT %out = f32[1024] get-tuple-element(%w), index=1
}}
"""


@pytest.mark.parametrize(
    "cond, start, update, trips",
    [
        ("compare(%c, %n), direction=LT", "0", "add(%i, %one)", 6),
        ("compare(%n, %c), direction=GT", "0", "add(%i, %one)", 6),  # the constant on the left: 6 > i
        ("compare(%c, %n), direction=LT", "2", "add(%i, %one)", 4),  # from 2
        ("compare(%c, %n), direction=LE", "0", "add(%one, %i)", 7),  # i <= 6, the constant first in the add
        ("compare(%c, %n), direction=LT", "1", "add(%i, %two)", 3),  # 1, 3, 5
        ("compare(%c, %n), direction=GE", "10", "subtract(%i, %two)", 3),  # 10, 8, 6: counting down
        ("compare(%c, %n), direction=NE", "0", "add(%i, %two)", 3),
        ("compare(%c, %n), direction=LT", "9", "add(%i, %one)", 0),  # never entered
    ],
)
def test_trip_count_read_from_the_condition(cond, start, update, trips):
    """A loop without known_trip_count is counted from its condition, its counter's start and its step: the
    all-reduce in its body runs once per trip, moving 2·(n−1)/n of its 4 KiB each time."""
    from ssmlm.train.aot import collectives

    comm, unknown = collectives(loop_hlo(cond, start, update), 4)
    assert unknown == [] and comm["all-reduce"]["ops"] == 1 and comm["all-reduce"]["runs"] == trips
    assert comm["all-reduce"]["bytes"] == trips * 2 * 4096 * 3 // 4


@pytest.mark.parametrize(
    "cond, update",
    [
        ("compare(%c, %c), direction=LT", "add(%i, %one)"),  # no constant bound
        ("compare(%f, %f), direction=LT", "add(%i, %one)"),
        ("and(%c, %n)", "add(%i, %one)"),  # not a comparison
        ("compare(%c, %n), direction=LT", "multiply(%i, %two)"),  # the counter does not step by a constant
        ("compare(%c, %n), direction=LT", "subtract(%i, %one)"),  # counts away from its bound: never ends
    ],
)
def test_unrecognised_loop_is_counted_once_and_named(cond, update):
    """A loop of another form is counted once, never silently: the report names it."""
    from ssmlm.display.printouts import target_rows
    from ssmlm.train.aot import collectives

    comm, unknown = collectives(loop_hlo(cond, update=update), 4)
    assert comm["all-reduce"]["runs"] == 1 and unknown == ["jit(f)/while"]
    # and the compiler's own count, where it wrote one, wins
    known = ', backend_config={"known_trip_count":{"n":"5"}}'
    assert collectives(loop_hlo(cond, update=update, known=known), 4) == (
        {**comm, "all-reduce": {"ops": 1, "runs": 5, "bytes": 5 * comm["all-reduce"]["bytes"]}},
        [],
    )
    rep = {**SMALL_REPORT, "collectives": comm, "loops_of_unknown_count": unknown}
    text = dict(target_rows(rep))["collectives per chip"]
    assert "jit(f)/while" in text and "at least" in text, text


def psum_loops(target_text: str, outer: int, inner: int):
    """A hand-written program: ``outer`` trips of (``inner`` trips of a psum, then one more psum), compiled for
    the target: its all-reduces run outer·(inner + 1) times."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from ssmlm.targets import devices, parse_target

    devs = devices(parse_target(target_text))
    mesh = Mesh(devs, ("d",))

    def f(x):
        def step_in(_, c):
            return c + jax.lax.psum(c * 2.0, "d")

        def step_out(_, c):
            c = jax.lax.fori_loop(0, inner, step_in, c)
            return c * jax.lax.psum(c, "d")

        return jax.lax.fori_loop(0, outer, step_out, x)

    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    x = jax.ShapeDtypeStruct((len(devs), 256), jnp.float32, sharding=NamedSharding(mesh, P("d")))
    return g.lower(x).compile().as_text(), len(devs)


@needs_libtpu
@pytest.mark.parametrize("outer, inner", [(3, 4), (5, 7)])
def test_tpu_nested_loops_multiply(outer, inner):
    """libtpu writes no known_trip_count: the counts come from the loops' conditions, and nested loops multiply."""
    from ssmlm.train.aot import collectives

    hlo, n = psum_loops("v5e:2x2", outer, inner)
    assert "known_trip_count" not in hlo  # what makes reading the condition necessary
    comm, unknown = collectives(hlo, n)
    assert unknown == [] and comm["all-reduce"]["ops"] == 2
    assert comm["all-reduce"]["runs"] == outer * (inner + 1)
    one_op = 2 * 256 * 4 * (n - 1) // n  # each chip's row of 256 float32, all-reduced over n chips
    assert comm["all-reduce"]["bytes"] == outer * (inner + 1) * one_op


@needs_cuda
def test_gpu_loops_keep_the_compilers_count():
    """The GPU compiler writes known_trip_count: that is what is used, and the condition read agrees with it."""
    from ssmlm.train import aot

    hlo, n = psum_loops("h100-80gb:2", 3, 4)
    loops = aot.while_loops(hlo)
    assert sorted(w["known_trip_count"] for w in loops) == [3, 4]
    assert all(w["read"] == w["known_trip_count"] for w in loops), loops
    comm, unknown = aot.collectives(hlo, n)
    assert unknown == [] and comm["all-reduce"]["runs"] == 3 * 5


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
@needs_libtpu
def test_tpu_accumulation_all_reduces_every_micro_batch():
    """Data parallel on 4 chips: the step all-reduces the gradients once per micro-batch, inside the accumulation
    loop, so 4 micro-batches move 4 times the bytes of one, and at least 2·(n−1)/n of the float32 parameters
    each time."""
    one, work = report_of(tiny(["mesh.data=4", "train.batch_size=16"]), "v5e:2x2")
    four, _ = report_of(tiny(["mesh.data=4", "train.batch_size=16", "train.grad_accum=4"]), "v5e:2x2")
    a1, a4 = one["collectives"]["all-reduce"], four["collectives"]["all-reduce"]
    assert one["loops_of_unknown_count"] == four["loops_of_unknown_count"] == []
    assert a4["ops"] == a1["ops"] and a4["runs"] == 4 * a1["runs"] and a4["bytes"] == 4 * a1["bytes"], (a1, a4)
    assert a1["bytes"] >= 2 * 3 / 4 * param_bytes(work)
    bound = lambda r: r["roofline"]["bounds_seconds"]["interconnect"]  # noqa: E731
    assert bound(four) == pytest.approx(4 * bound(one))


def step_hlo(recipe, target_text):
    """The compiled text of ``recipe``'s training step for the target, its device count and its work."""
    from ssmlm.targets import devices, parse_target
    from ssmlm.train import aot

    target = parse_target(target_text)
    work = aot.pretraining_work(recipe, recipe.data.vocab_size)
    spec = aot.step_spec(recipe, work, devices(target), target.hosts, target.accelerator.platform)
    compiled, oom, _ = aot.compile_step(spec)
    assert oom is None
    return compiled.as_text(), target.num_devices, work


@pytest.mark.slow  # out of the default suite's 15 minutes; .ci/run runs it with -m slow
@needs_libtpu
def test_tpu_layer_scan_runs_its_collectives_once_per_layer():
    """Parameters sharded over 4 chips, the blocks under one scan: the loops' trip counts read from the program
    are the scan's length (the stacked parameters' leading axis), and every kind of collective the step has runs
    more often and moves more bytes at depth 8 than at 4 (each layer's parameters are gathered and their gradients
    scattered once per layer), and so the interconnect bound grows."""
    import jax
    from flax import nnx

    from ssmlm.targets import parse_target
    from ssmlm.train import aot

    fsdp = ["mesh.data=1", "mesh.fsdp=4", "model.scan_layers=true"]
    comm, bound = {}, {}
    for depth in (4, 8):
        hlo, n, work = step_hlo(tiny([*fsdp, f"model.num_layers={depth}"]), "v5e:2x2")
        stacked = {v.shape[0] for v in jax.tree.leaves(nnx.state(work.model, nnx.Param)["blocks"])}
        loops = aot.while_loops(hlo)
        assert all(w["known_trip_count"] is None for w in loops)  # libtpu's: what the counts are read for
        trips = [w["read"] for w in loops]
        assert len(stacked) == 1 and trips == [*stacked] * 2, (trips, stacked)  # the forward and backward scans
        comm[depth], unknown = aot.collectives(hlo, n)
        assert unknown == []
        bound[depth] = aot.roofline(
            parse_target("v5e:2x2"), 1.0, False, {}, sum(c["bytes"] for c in comm[depth].values()), 1
        )
    kinds = [k for k, c in comm[4].items() if c["ops"]]
    assert "all-gather" in kinds and "reduce-scatter" in kinds
    for k in kinds:
        assert comm[8][k]["runs"] > comm[4][k]["runs"] and comm[8][k]["bytes"] > comm[4][k]["bytes"], k
    assert bound[8]["bounds_seconds"]["interconnect"] > bound[4]["bounds_seconds"]["interconnect"]
