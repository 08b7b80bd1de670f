"""Training throughput of BiGS vs BERT at equal parameter count, across sequence lengths.

Both models are timed with ssmlm's own jitted training step (forward, backward, AdamW update) on MLM
batches of the same number of tokens per step, in this process, on this machine. Equal parameter
count follows the paper's accounting: a gated layer is ≈13d², a stacked one ≈12d², so 12 gated layers
match 13 stacked ones.

    python benchmarks/throughput.py                      # d=128, lengths 128..4096
    python benchmarks/throughput.py --hidden 256 --tokens 16384 --lengths 128,512
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ssmlm.models import build_mlm, count_params
from ssmlm.objectives import make_batch
from ssmlm.objectives.losses import token_prediction_loss
from ssmlm.recipe import ModelConfig, TrainConfig
from ssmlm.train.loop import make_train_step
from ssmlm.train.optim import make_optimizer


def model_cfg(arch: str, d: int, layers: int, seq_len: int, vocab: int) -> ModelConfig:
    return ModelConfig(arch=arch, vocab_size=vocab, hidden_size=d, num_layers=layers, max_seq_length=seq_len,
                       intermediate_size=(3 if arch == "bigs" else 4) * d, num_heads=max(1, d // 64))  # fmt: skip


def tokens_per_second(cfg: ModelConfig, batch: int, seq_len: int, steps: int) -> tuple[float, int]:
    model = build_mlm(cfg)
    graphdef, params = nnx.split(model, nnx.Param)
    tx, _, _ = make_optimizer(TrainConfig(steps=1000, warmup_steps=0), 1000, params, cfg)
    opt_state = tx.init(params)
    step_fn = make_train_step(token_prediction_loss, tx, graphdef, seed=0)
    rng = np.random.default_rng(0)
    preds = max(1, round(0.15 * seq_len))
    b = make_batch(
        rng.integers(5, cfg.vocab_size, (batch, seq_len)),
        rng.integers(5, cfg.vocab_size, (batch, preds)),
        np.ones((batch, preds)),
        target_positions=np.sort(rng.integers(1, seq_len, (batch, preds)), axis=1),
    )
    params, opt_state, out = step_fn(params, opt_state, b, 0)  # compile
    jax.block_until_ready(out["loss"])
    t = time.perf_counter()
    for s in range(steps):
        params, opt_state, out = step_fn(params, opt_state, b, s + 1)
    jax.block_until_ready(out["loss"])
    return batch * seq_len * steps / (time.perf_counter() - t), count_params(model)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--gated-layers", type=int, default=12)
    ap.add_argument("--stacked-layers", type=int, default=13)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--tokens", type=int, default=8192, help="tokens per step (batch = tokens / length)")
    ap.add_argument("--lengths", default="128,512,1024,4096")
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    dev = jax.devices()[0]
    print(
        f"device: {len(jax.devices())} x {dev.platform} ({dev.device_kind}); "
        f"{platform.processor() or platform.machine()}"
    )
    print(f"d={a.hidden}; BiGS {a.gated_layers} gated layers vs BERT {a.stacked_layers} stacked layers; "
          f"{a.tokens} tokens/step; mean over {a.steps} timed steps after compile")  # fmt: skip
    print(
        f"{'length':>7} {'batch':>6} {'BiGS tok/s':>11} {'BERT tok/s':>11} {'BiGS/BERT':>10} {'params BiGS/BERT':>18}"
    )
    for seq_len in (int(x) for x in a.lengths.split(",")):
        batch = max(1, a.tokens // seq_len)
        bigs, n_bigs = tokens_per_second(
            model_cfg("bigs", a.hidden, a.gated_layers, seq_len, a.vocab), batch, seq_len, a.steps
        )
        bert, n_bert = tokens_per_second(
            model_cfg("bert", a.hidden, a.stacked_layers, seq_len, a.vocab), batch, seq_len, a.steps
        )
        print(f"{seq_len:>7} {batch:>6} {bigs:>11,.0f} {bert:>11,.0f} {bigs / bert:>10.2f} "
              f"{n_bigs / 1e6:>8.2f}M/{n_bert / 1e6:.2f}M")  # fmt: skip


if __name__ == "__main__":
    jnp.zeros(1)
    main()
