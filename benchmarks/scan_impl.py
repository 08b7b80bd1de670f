"""The recurrences' time scan, associative vs sequential (model.scan_impl), on this machine's backend.

One bidirectional Gated-SSM-shaped scan h_t = f_t h_{t-1} + x_t (forward half left to right, reverse half right
to left, resets at sample boundaries), forward and backward (value_and_grad of a weighted sum), jitted: the
compile time of each implementation and their step times, interleaved (benchmarks/paired.py). The result sets
``auto`` in ssmlm.models.scan: on CPU the sequential scan is the faster to run and to compile.

    python benchmarks/scan_impl.py                        # B 2, L 2048, N 320 (lm_throughput.py's d 256)
    python benchmarks/scan_impl.py --length 4096 --state 2560 --batch 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from ssmlm.models.lm_context import make_context
from ssmlm.models.scan import bidirectional_scan

sys.path.insert(0, str(Path(__file__).parent))
from paired import compare, machine_line, ratio_cell  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--state", type=int, default=320)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    k = jax.random.split(jax.random.key(0), 3)
    shape = (a.batch, a.length, a.state)
    f = jax.nn.sigmoid(jax.random.normal(k[0], shape))
    x = jax.random.normal(k[1], shape)
    w = jax.random.normal(k[2], shape)
    quarter = a.length // 4  # four packed samples, each half prefix, half causal
    seg = jnp.repeat(jnp.arange(1, 5), quarter)[None].repeat(a.batch, 0)
    types = jnp.where(jnp.tile(jnp.arange(quarter), 4) < quarter // 2, 1, 3)[None].repeat(a.batch, 0)
    steps, compile_s = {}, {}
    for impl in ("associative", "sequential"):
        # every array an argument: closed-over arrays become constants that XLA folds (seconds of compile)
        def loss(f, x, w, seg, types, impl=impl):
            ctx = make_context(jnp.ones_like(seg), seg, types)
            return jnp.sum(w * bidirectional_scan(f, x, ctx, True, impl))

        t = time.perf_counter()
        fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(f, x, w, seg, types).compile()
        compile_s[impl] = time.perf_counter() - t
        steps[impl] = lambda fn=fn: jax.block_until_ready(fn(f, x, w, seg, types))
    res = compare(steps, "associative", rounds=a.rounds, warmup=2)
    print(f"# {machine_line()}")
    print(f"\n## one bidirectional scan, forward + backward, B {a.batch}, L {a.length}, N {a.state}")
    print("| scan_impl | compile s | step ms (pass 1 · 2) | speed vs associative, paired median (range) |")
    print("|---|---:|---:|---|")
    for impl, r in res.items():
        ms = " · ".join(f"{m * 1e3:.1f}" for m in r["median_s"])
        print(f"| {impl} | {compile_s[impl]:.2f} | {ms} | {ratio_cell(r)} |")


if __name__ == "__main__":
    main()
