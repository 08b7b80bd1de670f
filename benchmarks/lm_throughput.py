"""Language models: training tokens/s of each family at equal parameters (paper Table 4 compares the Gated
SSM with the Transformer), and recurrent decoding at constant memory per generated token.

Training: the loop's own jitted step (ssmlm.train.loop.make_train_step with the LM loss and AdamW) on one
packed batch at L = 2048, median of --repeats timed steps after a warm-up, all families in one process, so
the ratios are what to read (absolute numbers move ±20% on a shared machine). Sizes keep the paper's 1.4B
proportions shrunk: Gated SSM N = 1.25 d with twice the Transformer's blocks, Hawk N = 1.25 d with an MLP
and 20/24 of the Transformer's blocks; the table prints each model's parameter count.

Decoding: prefill a 16-token prompt, then generate --decode tokens (1k and 8k by default) with the jitted
recurrent step; tokens/s and the bytes of the decoding state (the cache pytree: O(1) for the recurrences,
growing with the length for the Transformer's KV cache) and the process's peak RSS.

    python benchmarks/lm_throughput.py                    # d=256, L=2048, batch 2
    python benchmarks/lm_throughput.py --only decode --decode 1024,8192
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import time

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

VOCAB = 4096


def configs(d: int, layers: int) -> dict[str, ModelConfig]:
    """Equal-parameter families in the paper's proportions (Table 7), ``layers`` = the Transformer's."""
    common = dict(hidden_size=d, vocab_size=VOCAB, max_seq_length=2048, dropout=0.0, num_heads=max(1, d // 64))
    n = int(1.25 * d) // 2 * 2
    return {
        "gated_ssm": ModelConfig(arch="gated_ssm", num_layers=2 * layers, state_size=n, **common),
        "hawk": ModelConfig(arch="hawk", num_layers=max(1, round(layers * 20 / 24)), state_size=n, **common),
        "transformer_lm": ModelConfig(arch="transformer_lm", num_layers=layers, bidirectional="all", **common),
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


def train_tokens_per_s(cfg: ModelConfig, batch: int, length: int, repeats: int) -> tuple[int, float]:
    model = build_pretraining_model(cfg)
    graphdef, params = nnx.split(model, nnx.Param)
    opt = make_optimizer(TrainConfig(steps=100, learning_rate=1e-3), 100, params, cfg)
    opt_state = opt.tx.init(params)
    step_fn = make_train_step(LMObjective.loss, opt.tx, graphdef, 0)
    b = jax.device_put(a_batch(batch, length))
    params, opt_state, m = step_fn(params, opt_state, b, jnp.int32(0))  # compile + warm-up
    jax.block_until_ready(m)
    times = []
    for i in range(repeats):
        t = time.perf_counter()
        params, opt_state, m = step_fn(params, opt_state, b, jnp.int32(i + 1))
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    return count_params(model), batch * length / statistics.median(times)


def decode(cfg: ModelConfig, n_tokens: int, measure: int = 0) -> tuple[float, int]:
    """Tokens/s of recurrent decoding with room for ``n_tokens``, timed over ``measure`` steps (0: all of them;
    a step's cost does not depend on its position: the Transformer reads every cache slot, masked), and the
    bytes of the decoding state."""
    from ssmlm.models.decode import Stepper

    run = Stepper(build_pretraining_model(cfg))
    prompt = jnp.arange(1, 17, dtype=jnp.int32)[None]
    cache = run.init_cache(1, 16 + n_tokens)
    logits, cache = run.prefill(prompt, jnp.full_like(prompt, 3), cache)
    tok = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
    logits, cache = run.step(tok, cache)  # compile
    jax.block_until_ready(logits)
    steps = min(measure or n_tokens - 1, n_tokens - 1)
    t = time.perf_counter()
    for _ in range(steps):
        logits, cache = run.step(jnp.argmax(logits, -1).astype(jnp.int32), cache)
    jax.block_until_ready(logits)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(cache))
    return steps / (time.perf_counter() - t), state_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4, help="the Transformer's blocks (the others scale from it)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode", default="1024,8192")
    ap.add_argument("--only", default="train,decode")
    ap.add_argument("--measure", type=int, default=0, help="decoding steps timed per run (0: all)")
    ap.add_argument("--families", default="gated_ssm,gated_ssm_plus,hawk,transformer_lm")
    a = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {jax.device_count()} {jax.devices()[0].platform} "
          f"device(s), jax {jax.__version__}")  # fmt: skip
    cfgs = configs(a.d, a.layers)
    if "train" in a.only:
        print(f"\n## training step, L = {a.length}, batch {a.batch}, d = {a.d}")
        print("| family | blocks | params | tokens/s | vs transformer_lm |\n|---|---:|---:|---:|---:|")
        rows = {k: train_tokens_per_s(c, a.batch, a.length, a.repeats) for k, c in cfgs.items()}
        base = rows["transformer_lm"][1]
        for k, (n, tps) in rows.items():
            print(f"| {k} | {cfgs[k].num_layers} | {n / 1e6:.2f}M | {tps:,.0f} | {tps / base:.2f}× |")
    if "decode" in a.only:
        lengths = [int(x) for x in a.decode.split(",")]
        print(f"\n## decoding, batch 1, d = {a.d} (state = bytes of the decoding cache)")
        print("| family | generated | tokens/s | state | peak RSS |\n|---|---:|---:|---:|---:|")
        for k in a.families.split(","):
            c = cfgs.get(k) or ModelConfig(arch=k, **{f: getattr(cfgs["hawk"], f) for f in
                                                       ("hidden_size", "vocab_size", "max_seq_length", "dropout",
                                                        "num_layers", "state_size")})  # fmt: skip
            for n in lengths:
                tps, state = decode(c, n, a.measure)
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(f"| {k} | {n:,} | {tps:,.0f} | {state / 2**20:.2f} MiB | {rss:,.0f} MiB |")


if __name__ == "__main__":
    main()
