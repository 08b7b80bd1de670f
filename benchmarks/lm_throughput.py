"""Language models: training tokens/s of each family at equal parameters (paper Table 8 compares the Gated
SSM with the Transformer), compile time, and decoding speed and memory.

Training: the loop's own jitted step (ssmlm.train.loop.make_train_step with the LM loss and AdamW) on one
packed batch (four samples per row, half of each a bidirectional prefix) at L = 2048. All families run in one
process, steps interleaved (benchmarks/paired.py: rounds of one step per family, rotating order, two passes),
and the ratio to read is each family's paired speed against the reference peer, the Transformer with
segment-aware attention (model.attention auto: on CPU the blockwise path that skips query/key blocks of
other samples and of the causal future, as a careful user's attention would). The Transformer with the
dense masked L × L attention is reported beside it. Sizes keep the paper's 1.4B proportions shrunk: Gated SSM
N = 1.25 d with twice the Transformer's blocks, Gated SSM+ 21/24 and Hawk 20/24 of its blocks with an MLP;
the table prints each model's parameter count. Compile: wall seconds of lower() + compile() of the step.

Decoding: prefill a 16-token prompt, then generate --decode tokens with the jitted step, the families
interleaved in chunks of 256 tokens; tokens/s over the whole generation (the Transformer's step reads the
filled part of its cache, so it slows as the cache fills), the bytes of the decoding state (O(1) for the
recurrences, growing with the length for the KV cache) and the process's peak RSS.

    python benchmarks/lm_throughput.py                    # d=256, L=2048, batch 2
    python benchmarks/lm_throughput.py --d 1024 --layers 2 --batch 1   # where dense layers dominate
    python benchmarks/lm_throughput.py --only decode --decode 1024,8192
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ssmlm.models import build_pretraining_model, count_params
from ssmlm.models.config import ModelConfig
from ssmlm.objectives.batch import make_batch
from ssmlm.objectives.lm import LMObjective
from ssmlm.recipe import TrainConfig
from ssmlm.train.loop import make_train_step
from ssmlm.train.optim import make_optimizer

sys.path.insert(0, str(Path(__file__).parent))
from paired import compare, machine_line, ratio_cell  # noqa: E402

VOCAB = 4096
REFERENCE = "transformer_lm"


def configs(d: int, layers: int, length: int, dtype: str = "float32") -> dict[str, ModelConfig]:
    """Equal-parameter families in the paper's proportions (Table 7), ``layers`` = the Transformer's."""
    common = dict(hidden_size=d, vocab_size=VOCAB, max_seq_length=length, dropout=0.0, num_heads=max(1, d // 64),
                  compute_dtype=dtype)  # fmt: skip
    n = int(1.25 * d) // 2 * 2
    tf = ModelConfig(arch="transformer_lm", num_layers=layers, bidirectional="all", **common)
    return {
        "gated_ssm": ModelConfig(arch="gated_ssm", num_layers=2 * layers, state_size=n, **common),
        "gated_ssm_plus": ModelConfig(
            arch="gated_ssm_plus", num_layers=max(1, round(layers * 21 / 24)), state_size=n, **common
        ),  # fmt: skip
        "hawk": ModelConfig(arch="hawk", num_layers=max(1, round(layers * 20 / 24)), state_size=n, **common),
        REFERENCE: tf,
        "transformer_lm dense": dataclasses.replace(tf, attention="dense"),
    }


def a_batch(batch: int, length: int, seed: int = 0):
    """A packed batch of random tokens: four samples per row, each half prefix half target."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, VOCAB, (batch, length))
    quarter = length // 4
    seg = np.repeat(np.arange(1, 5), quarter)[None].repeat(batch, 0)
    pos = np.tile(np.arange(quarter), 4)[None].repeat(batch, 0)
    types = np.where(pos < quarter // 2, 1, 3)
    return make_batch(tokens, np.roll(tokens, -1, 1), types == 3, segment_ids=seg, positions=pos, token_types=types)


def build_step(cfg: ModelConfig, batch: int, length: int):
    """``cfg``'s training step lowered on its arguments (a fresh jit: ``.compile()`` compiles anew); the
    arguments and the parameter count are attached as ``.args`` and ``.n_params``."""
    model = build_pretraining_model(cfg)
    graphdef, params = nnx.split(model, nnx.Param)
    opt = make_optimizer(TrainConfig(steps=100, learning_rate=1e-3), 100, params, cfg)
    args = (params, opt.tx.init(params), jax.device_put(a_batch(batch, length)), jnp.int32(0))

    class Step:
        n_params = count_params(model)

        def __init__(self):
            self.args = args

        def compile(self):
            return make_train_step(LMObjective.loss, opt.tx, graphdef, 0).lower(*args).compile()

    return Step()


def train_step(cfg: ModelConfig, batch: int, length: int):
    """(one-step callable, parameter count, compile wall seconds) for ``cfg``'s training step."""
    built = build_step(cfg, batch, length)
    t = time.perf_counter()
    fn = built.compile()
    compile_s = time.perf_counter() - t
    params, opt_state, b, _ = built.args
    state = {"params": params, "opt": opt_state, "i": 0}

    def step():
        state["params"], state["opt"], m = fn(state["params"], state["opt"], b, jnp.int32(state["i"]))
        state["i"] += 1
        jax.block_until_ready(m)

    return step, built.n_params, compile_s


def train_table(cfgs: dict[str, ModelConfig], batch: int, length: int, rounds: int) -> None:
    steps, info = {}, {}
    for k, c in cfgs.items():
        steps[k], n, compile_s = train_step(c, batch, length)
        info[k] = (c.num_layers, n, compile_s)
        print(f"  compiled {k}: {compile_s:.1f} s", file=sys.stderr, flush=True)
    res = compare(steps, REFERENCE, rounds=rounds, warmup=2)
    print(f"| family | blocks | params | compile s | tokens/s (pass 1 · 2) | speed vs {REFERENCE}, paired "
          "median (range), pass 1 · pass 2 |\n|---|---:|---:|---:|---:|---|")  # fmt: skip
    for k, r in res.items():
        blocks, n, compile_s = info[k]
        tps = " · ".join(f"{batch * length / m:,.0f}" for m in r["median_s"])
        print(f"| {k} | {blocks} | {n / 1e6:.2f}M | {compile_s:.1f} | {tps} | {ratio_cell(r)} |")


def decoder(cfg: ModelConfig, n_tokens: int):
    """A callable that generates the next 256 tokens of one greedy generation (batch 1), and the cache."""
    from ssmlm.models.decode import Stepper

    run = Stepper(build_pretraining_model(cfg))
    prompt = jnp.arange(1, 17, dtype=jnp.int32)[None]
    cache = run.init_cache(1, 16 + n_tokens + 1)
    logits, cache = run.prefill(prompt, jnp.full_like(prompt, 3), cache, jnp.ones_like(prompt))
    state = {"logits": logits[:, -1], "cache": cache, "done": 0}

    def chunk(n=256):
        for _ in range(min(n, n_tokens - state["done"])):
            tok = jnp.argmax(state["logits"], -1).astype(jnp.int32)
            state["logits"], state["cache"] = run.step(tok, state["cache"])
        state["done"] += n
        jax.block_until_ready(state["logits"])

    return chunk, state


def decode_table(cfgs: dict[str, ModelConfig], lengths: list[int]) -> None:
    print("| family | generated | tokens/s | state | peak RSS |\n|---|---:|---:|---:|---:|")
    for n in lengths:
        runs = {k: decoder(c, n) for k, c in cfgs.items()}
        for chunk, _ in runs.values():
            chunk(1)  # compile
        spent = dict.fromkeys(runs, 0.0)
        for r in range(-(-n // 256)):
            names = list(runs)
            for k in names[r % len(names) :] + names[: r % len(names)]:
                t = time.perf_counter()
                runs[k][0]()
                spent[k] += time.perf_counter() - t
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        for k, (_, state) in runs.items():
            nbytes = sum(x.nbytes for x in jax.tree.leaves(state["cache"]))
            print(f"| {k} | {n:,} | {(n - 1) / spent[k]:,.0f} | {nbytes / 2**20:.2f} MiB | {rss:,.0f} MiB |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4, help="the Transformer's blocks (the others scale from it)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5, help="timed steps per family per pass (two passes)")
    ap.add_argument("--decode", default="1024,8192")
    ap.add_argument("--only", default="train,decode")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype (GPU: "
                    "bfloat16 lets the Transformer use cuDNN attention)")  # fmt: skip
    ap.add_argument("--families", default="gated_ssm,gated_ssm_plus,hawk,transformer_lm,transformer_lm dense")
    a = ap.parse_args()
    print(f"# {machine_line()}")
    cfgs = configs(a.d, a.layers, a.length, a.dtype)
    unknown = set(a.families.split(",")) - set(cfgs)
    if unknown:
        ap.error(f"--families: unknown {', '.join(sorted(unknown))}; expected some of {', '.join(cfgs)}")
    cfgs = {k: c for k, c in cfgs.items() if k in a.families.split(",") or k == REFERENCE}
    if "train" in a.only:
        print(f"\n## training step, L = {a.length}, batch {a.batch}, d = {a.d}, {a.dtype}, "
              f"{a.rounds} rounds × 2 passes")  # fmt: skip
        train_table(cfgs, a.batch, a.length, a.rounds)
    if "decode" in a.only:
        print(f"\n## decoding, batch 1, d = {a.d}, families interleaved in 256-token chunks")
        decode_table({k: c for k, c in cfgs.items() if k != "transformer_lm dense"},
                     [int(x) for x in a.decode.split(",")])  # fmt: skip


if __name__ == "__main__":
    main()
