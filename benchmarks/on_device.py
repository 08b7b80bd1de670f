"""Measured step time beside the roofline estimate, on whatever accelerator jax sees.

`ssmlm pretrain RECIPE --dry-run --target NAME` estimates a step's time from datasheet figures (ssmlm.train.aot:
FLOPs at peak, HBM traffic at full bandwidth, collectives at full interconnect bandwidth: a lower bound). This
script runs the same step (ssmlm.train.step.StepSpec, the run's own) on the device at hand and prints what it
really takes, so the estimates can be read against a measurement:

- ``gated_ssm_1b4_full``: birdie_gated_ssm_1b4 whole (48 blocks under the layer scan, 1.39B parameters), a batch of
  ``--full-rows`` × 2,048 tokens: its memory beside what `--dry-run --target h100-80gb` computed on a CPU machine;
- ``gated_ssm_1b4``: birdie_gated_ssm_1b4 with 1 of its 48 blocks (d 2048, state 2560, vocab 32,000), a batch of
  ``--rows`` × 2,048 tokens: one block of the 1.4B model and its embeddings and head;
- ``transformer_1b4``: birdie_transformer_1b4 likewise (1 block);
- ``default``: the embedded default recipe (BiGS d 256, batch 32 × 128), as a user's first run trains it.

Random token ids (the step's time does not depend on their values), one sample per row, every position scored.
The steps of the cases are interleaved (benchmarks/paired.py: one step each in turn, rotating order, two passes)
so that they see the same machine. Prints one row per case: parameters, tokens per step, per-chip memory from
the compiled program, the median step time of each pass, the roofline's lower bound and which term sets it,
measured ÷ bound, tokens/s and the measured MFU.

    python benchmarks/on_device.py                # on the accelerator jax sees (GPU or TPU)
    python benchmarks/on_device.py --rows 4 --only default --rounds 3    # a quick look (also runs on CPU)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from ssmlm.models.flops import flops_per_token
from ssmlm.recipe import load_recipe
from ssmlm.train import aot
from ssmlm.train.aot import memory_of, roofline

sys.path.insert(0, str(Path(__file__).parent))
from paired import compare, machine_line  # noqa: E402

CASES = {
    "gated_ssm_1b4_full": ("birdie_gated_ssm_1b4", []),  # all 48 blocks (scanned), --full-rows rows
    "gated_ssm_1b4": ("birdie_gated_ssm_1b4", ["model.num_layers=1"]),
    "transformer_1b4": ("birdie_transformer_1b4", ["model.num_layers=1"]),
    "default": ("default", []),
}


def case_recipe(name: str, rows: int, full_rows: int):
    ref, sets = CASES[name]
    batch = {"default": [], "gated_ssm_1b4_full": [f"train.batch_size={full_rows}"]}
    sets = [*sets, "train.grad_accum=1", "mesh.data=-1", *batch.get(name, [f"train.batch_size={rows}"])]
    return load_recipe(ref, sets)


def accelerator_here():
    """The ssmlm.targets entry of the device jax sees (None: not one the catalogue knows, e.g. the CPU)."""
    from ssmlm.targets import ACCELERATORS

    kind = jax.devices()[0].device_kind.lower()
    return next((a for a in ACCELERATORS.values() if a.device_kind.lower() == kind), None)


def batch_arrays(layout: str, b: int, length: int, vocab: int, predictions: int | None, seed: int = 0):
    from ssmlm.objectives.batch import Batch

    rng = np.random.default_rng(seed)
    tokens = rng.integers(5, vocab, (b, length), dtype=np.int32)
    ones = np.ones((b, length), np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (b, length)).copy()
    if layout == "lm":
        types = np.where(positions < length // 4, 1, 3).astype(np.int32)  # a quarter of each row a prefix
        targets = rng.integers(5, vocab, (b, length), dtype=np.int32)
        return Batch(tokens, ones, positions, targets, np.ones((b, length), np.float32), token_types=types)
    slots = np.sort(rng.choice(np.arange(1, length), (b, predictions)), axis=1).astype(np.int32)
    targets = rng.integers(5, vocab, (b, predictions), dtype=np.int32)
    weights = np.ones((b, predictions), np.float32)
    return Batch(tokens, ones, positions, targets, weights, target_positions=slots)


def build_case(name: str, rows: int, full_rows: int) -> dict:
    """The case's step on this machine's devices (the one `--dry-run --target` compiles, ssmlm.train.aot), with
    real parameters: compiled ahead of time (its memory), then placed for running."""
    from ssmlm.train.plan import vocab_size

    r = case_recipe(name, rows, full_rows)
    work = aot.pretraining_work(r, vocab_size(r))
    cfg, preds, layout = work.cfg, work.predictions, work.layout
    model = work.build(cfg)  # real parameters: this step runs
    spec = aot.step_spec(r, work, jax.devices(), 1, jax.default_backend())
    spec = dataclasses.replace(spec, params=nnx.split(model, nnx.Param)[1])
    params, tx = spec.params, spec.tx
    t0 = time.perf_counter()
    compiled = spec.lower().compile()
    compile_s = time.perf_counter() - t0
    p_sh, o_sh, b_sh = spec.shardings
    state = {"params": jax.device_put(params, p_sh)}
    state["opt"] = jax.jit(tx.init, out_shardings=o_sh)(state["params"])
    batch = jax.device_put(batch_arrays(layout, r.train.batch_size, r.seq_len, cfg.vocab_size, preds), b_sh)
    counter = {"step": 0}

    def step():
        state["params"], state["opt"], metrics = compiled(state["params"], state["opt"], batch, counter["step"])
        counter["step"] += 1
        jax.block_until_ready(metrics["loss"])

    tokens = r.train.batch_size * r.seq_len
    flops = flops_per_token(model, cfg, r.seq_len, preds) * tokens
    n_params = sum(x.size for x in jax.tree.leaves(params))
    return {"step": step, "compiled": compiled, "compile_s": compile_s, "tokens": tokens, "flops": flops,
            "params": int(n_params), "remat": bool(cfg.remat), "recipe": r}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=16, help="rows of 2,048 tokens per step for the 1b4 cases")
    ap.add_argument("--full-rows", type=int, default=2, help="rows of 2,048 tokens per step for the 48-block case")
    ap.add_argument("--only", default=",".join(CASES), help="cases, comma-separated: " + ", ".join(CASES))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    print(machine_line(), "|", jax.devices()[0].device_kind, "x", jax.device_count(), flush=True)
    acc = accelerator_here()
    cases = {}
    for name in args.only.split(","):
        print(f"compiling {name} ...", flush=True)
        cases[name] = build_case(name, args.rows, args.full_rows)
        print(f"  {cases[name]['compile_s']:.1f} s", flush=True)
    result = compare({n: c["step"] for n, c in cases.items()}, reference=next(iter(cases)), rounds=args.rounds)
    rows = []
    for name, c in cases.items():
        row = {
            "case": name,
            "params": c["params"],
            "tokens_per_step": c["tokens"],
            "compile_s": round(c["compile_s"], 1),
        }
        row["median_step_s"] = result[name]["median_s"]
        best = min(row["median_step_s"])
        row["tokens_per_s"] = c["tokens"] / best
        mem = memory_of(c["compiled"], None, acc.hbm_bytes if acc else 0)
        row["memory_gib"] = round(mem["total"] / 2**30, 2)
        if acc is not None:
            from ssmlm.targets import Target

            target = Target(acc, topology="1", chips=jax.device_count(), hosts=1, name=acc.name)
            est = roofline(target, c["flops"], c["remat"], mem, 0, c["tokens"])
            row.update(
                bound_s=est["step_seconds_at_least"],
                bound_by=est["bound_by"],
                measured_over_bound=best / est["step_seconds_at_least"],
                mfu=c["flops"] / (best * jax.device_count() * acc.peak_bf16_flops),
                mfu_bound=est["mfu_at_most"],
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:  # all cases together: at least the largest case's real peak
        print(f"peak device memory in use: {stats['peak_bytes_in_use'] / 2**30:.2f} GiB", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_line(), "device": jax.devices()[0].device_kind,
                                               "rows": rows}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
