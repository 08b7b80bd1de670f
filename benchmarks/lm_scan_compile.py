"""Compile time of a language model's forward + backward pass, blocks in a Python loop vs scanned
(model.scan_layers; ssmlm.models.lm runs the scan over groups of p blocks, p = 2 for bidirectional: alternate).

The function compiled is value_and_grad of the mean logit with respect to every parameter, jitted; the model is
built abstractly (nnx.eval_shape) and the function lowered and compiled on jax.ShapeDtypeStruct arguments, so
nothing big is allocated. Times per side: wall seconds of .lower() (tracing) and .compile() (XLA), and the process
CPU seconds of both (steadier on a shared machine). The sides are interleaved, rotating order each round, each
round a fresh jit of a freshly built model; the persistent compilation cache is off.

    python benchmarks/lm_scan_compile.py                          # gated_ssm, d 256, 24 layers, alternate
    python benchmarks/lm_scan_compile.py --depths 4,12,24,48 --rounds 2
    python benchmarks/lm_scan_compile.py --arch hawk --bidirectional none
    python benchmarks/lm_scan_compile.py --hidden 2048 --state 2560 --depths 48 --batch 1 --length 2048 \
        --rounds 1 --sides scan                                   # recipes/birdie_gated_ssm_1b4.yaml's size
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models import build_lm
from ssmlm.models.lm import blocks_scanned, layer_period
from ssmlm.objectives.lm import LMObjective
from ssmlm.recipe import ModelConfig, TrainConfig
from ssmlm.train.loop import make_train_step
from ssmlm.train.optim import make_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_throughput  # noqa: E402
from paired import machine_line  # noqa: E402

SIDES = {"loop": False, "scan": True}


def config(a, layers: int, scan: bool) -> ModelConfig:
    return ModelConfig(arch=a.arch, vocab_size=a.vocab, hidden_size=a.hidden, state_size=a.state, num_layers=layers,
                       num_heads=max(1, a.hidden // 64), max_seq_length=a.length, dropout=0.0, gelu="tanh",
                       bidirectional=a.bidirectional, scan_impl=a.scan_impl, compute_dtype=a.dtype,
                       scan_layers=scan)  # fmt: skip


def lower(graphdef, params, batch: int, length: int):
    """The lowered value_and_grad of the mean logit, with respect to ``params``, of the model ``graphdef``."""
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    prefix = length // 4  # a bidirectional prefix, then causal tokens: the layout of a Birdie sample
    types = jnp.asarray([[1] * prefix + [3] * (length - prefix)] * batch, jnp.int32)

    def loss(p, tokens):
        return nnx.merge(graphdef, p)(tokens, token_types=types).mean()

    return jax.jit(jax.value_and_grad(loss)).lower(params, tokens)


def lower_train(cfg: ModelConfig, graphdef, params, batch: int, length: int):
    """The lowered training step of the loop (ssmlm.train.loop.make_train_step: the LM loss, AdamW)."""
    opt = make_optimizer(TrainConfig(steps=100, learning_rate=1e-3), 100, params, cfg)
    shapes = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)  # noqa: E731
    args = (params, jax.eval_shape(opt.tx.init, params), shapes(lm_throughput.a_batch(batch, length)))
    return make_train_step(LMObjective.loss, opt.tx, graphdef, 0).lower(*args, jax.ShapeDtypeStruct((), jnp.int32))


def timed(cfg: ModelConfig, batch: int, length: int, what: str) -> tuple[float, float, float]:
    """(lower wall s, compile wall s, CPU s of both) for a fresh abstract model of ``cfg`` (built untimed)."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: build_lm(cfg)), nnx.Param)
    c0, t0 = time.process_time(), time.perf_counter()
    if what == "train":
        lowered = lower_train(cfg, graphdef, params, batch, length)
    else:
        lowered = lower(graphdef, params, batch, length)
    t1 = time.perf_counter()
    lowered.compile()
    return t1 - t0, time.perf_counter() - t1, time.process_time() - c0


def measure(a, layers: int) -> dict[str, list[tuple[float, float, float]]]:
    names = a.sides.split(",")
    times = {n: [] for n in names}
    for r in range(a.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            times[n].append(timed(config(a, layers, SIDES[n]), a.batch, a.length, a.what))
    return times


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="gated_ssm")
    p.add_argument("--bidirectional", default="alternate", choices=["alternate", "all", "none"])
    p.add_argument("--scan-impl", default="auto", choices=["auto", "associative", "sequential"],
                   help="the recurrences' time scan (auto: sequential on CPU, associative on GPU/TPU)")  # fmt: skip
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--state", type=int, default=320, help="state_size (the 1.4B recipes' 2560 / 2048 = 1.25 d)")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--depths", default="24", help="comma-separated numbers of layers")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--what",
        default="grad",
        choices=["grad", "train"],
        help="grad: value_and_grad of the mean logit; train: the training loop's step (LM loss, AdamW)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="model.compute_dtype")
    p.add_argument("--sides", default="loop,scan", help="loop, scan or both (a deep loop may take long to compile)")
    a = p.parse_args(argv)
    jax.config.update("jax_enable_compilation_cache", False)  # every round compiles afresh
    print(machine_line())
    model = f"{a.arch}, d {a.hidden}, state {a.state}, vocab {a.vocab}, bidirectional {a.bidirectional}, {a.dtype}"
    print(f"{model}, scan_impl {a.scan_impl}; {a.what}, batch {a.batch} x {a.length}; medians of {a.rounds} rounds")
    print("| layers | side | groups x p | lower s | compile s | CPU s | loop / scan (CPU) |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for layers in map(int, a.depths.split(",")):
        times = measure(a, layers)
        med = {n: [statistics.median(t[k] for t in times[n]) for k in range(3)] for n in times}
        for n, (lo, co, cpu) in med.items():
            cfg = config(a, layers, SIDES[n])
            shape = f"{layers // layer_period(cfg)} x {layer_period(cfg)}" if blocks_scanned(cfg) else "unrolled"
            ratio = f"{med['loop'][2] / cpu:.1f}" if n == "scan" and "loop" in med else ""
            print(f"| {layers} | {n} | {shape} | {lo:.1f} | {co:.1f} | {cpu:.1f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
