"""Can each language model learn, from scratch, to copy k tokens across a gap of filler tokens?

The phone-book probes of experiments/birdie_budget.yaml ask a pretrained model to write a number that appeared
some tokens earlier. This isolates that one skill from pretraining, language and the phone-book format: rows of

    x_1 … x_k   f_1 … f_gap   SEP   x_1 … x_k          x: random tokens of the payload alphabet, f: filler

trained by next-token prediction with the loss on the second x_1 … x_k only, for every arch at the same small
size, learning rate and steps. Reported: the exact-token accuracy on those k positions over fresh rows no step
trained on, per seed, with the mean and a Student-t 95% interval over seeds; chance is 1 / the payload alphabet.

    python benchmarks/copy_gap.py                                   # 4 archs x gaps 0, 20 x 3 seeds
    python benchmarks/copy_gap.py --archs hawk --gaps 0,5,10,20 --steps 1000

Every model is ssmlm.models.lm.LanguageModel as the recipes build it (causal, no bidirectional prefix).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

SEP, FILLER, PAYLOAD_FROM = 2, range(3, 10), 10  # token ids: separator, filler alphabet, payload alphabet from here


def rows(rng: np.random.Generator, n: int, k: int, gap: int, vocab: int) -> np.ndarray:
    x = rng.integers(PAYLOAD_FROM, vocab, size=(n, k))
    f = rng.integers(FILLER.start, FILLER.stop, size=(n, gap))
    return np.concatenate([x, f, np.full((n, 1), SEP), x], axis=1)


def set_forget_bias(model, bias: float) -> None:
    """The Gated SSMs' f_t = σ(W_f u + b_f) then starts near σ(bias) instead of σ(0) = 1/2 (flax's zero bias, as
    the paper's listings leave it): a state that keeps ~σ(bias) of itself per token rather than half."""
    import jax.numpy as jnp

    for block in model.blocks:
        block.w_f.bias[...] = jnp.full_like(block.w_f.bias[...], bias)


def run(arch: str, gap: int, seed: int, a) -> float:
    """Train one model; its copy accuracy on fresh rows."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from ssmlm.models.config import LMConfig
    from ssmlm.models.lm import LanguageModel

    k, length = a.k, 2 * a.k + gap + 1
    cfg = LMConfig(
        arch=arch,
        hidden_size=a.width,
        num_layers=a.layers,
        state_size=a.width,
        num_heads=2,
        max_seq_length=length,
        vocab_size=a.vocab,
        bidirectional="none",
    )
    model = LanguageModel(cfg, rngs=nnx.Rngs(seed))
    if a.forget_bias is not None:
        set_forget_bias(model, a.forget_bias)
    opt = nnx.Optimizer(model, optax.adam(a.lr), wrt=nnx.Param)

    def scores(m, toks):
        inp, tgt = toks[:, :-1], toks[:, 1:]
        logits = m(inp, segment_ids=jnp.ones_like(inp))[:, -k:]
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[:, -k:, None], -1)[..., 0]
        return nll.mean(), (logits.argmax(-1) == tgt[:, -k:]).mean()

    @nnx.jit
    def step(m, opt, toks):
        (loss, _), g = nnx.value_and_grad(scores, has_aux=True)(m, toks)
        opt.update(m, g)
        return loss

    score = nnx.jit(lambda m, toks: scores(m, toks)[1])
    train, test = np.random.default_rng([seed, 0]), np.random.default_rng([seed, 1])
    for _ in range(a.steps):
        step(model, opt, jnp.asarray(rows(train, a.batch, k, gap, a.vocab)))
    return float(np.mean([score(model, jnp.asarray(rows(test, 256, k, gap, a.vocab))) for _ in range(4)]))


def interval(v: list[float]) -> str:
    from ssmlm.experiment.stats import t_interval

    iv = t_interval(v)
    return f"[{iv.low:.3f}, {iv.high:.3f}]" if iv.estimable else f"not estimable ({iv.reason})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", default="gated_ssm_plus,gated_ssm,hawk,transformer_lm")
    ap.add_argument("--gaps", default="0,20")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--k", type=int, default=4, help="tokens to copy")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--width", type=int, default=64, help="hidden and state size")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--forget-bias", type=float, default=None, help="gated_ssm(_plus) only: W_f's starting bias")
    a = ap.parse_args(argv)
    if a.forget_bias is not None and not set(a.archs.split(",")) <= {"gated_ssm", "gated_ssm_plus"}:
        print(f"error: --forget-bias: only for gated_ssm and gated_ssm_plus, not {a.archs!r}", file=sys.stderr)
        return 2
    try:
        gaps, seeds = [int(g) for g in a.gaps.split(",")], [int(s) for s in a.seeds.split(",")]
    except ValueError:
        print(f"error: --gaps {a.gaps!r}, --seeds {a.seeds!r}: expected comma-separated whole numbers", file=sys.stderr)
        return 2
    if a.vocab <= PAYLOAD_FROM:
        print(
            f"error: --vocab {a.vocab}: expected more than {PAYLOAD_FROM} (ids below are separator and filler)",
            file=sys.stderr,
        )
        return 2
    from ssmlm.cli import cpu_only_host
    from ssmlm.targets import quiet_cuda_plugin

    if "JAX_PLATFORMS" not in os.environ and cpu_only_host():
        os.environ["JAX_PLATFORMS"] = "cpu"  # as the CLI does: the CPU backend, without probing the others
    quiet_cuda_plugin()
    chance = 1 / (a.vocab - PAYLOAD_FROM)
    bias = "" if a.forget_bias is None else f", forget bias {a.forget_bias:g}"
    print(f"copy {a.k} tokens across a gap, {a.steps} steps of {a.batch} rows, d {a.width}, {a.layers} layers, "
          f"lr {a.lr}{bias}; chance {chance:.3f}", flush=True)  # fmt: skip
    print("| arch | gap | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | 95% CI (t) | seconds |")
    print("|---|---:|" + "---:|" * len(seeds) + "---:|---|---:|", flush=True)
    for arch in a.archs.split(","):
        for gap in gaps:
            t0 = time.time()
            acc = [run(arch, gap, s, a) for s in seeds]
            cells = " | ".join(f"{v:.3f}" for v in acc)
            mean = statistics.mean(acc)
            print(f"| {arch} | {gap} | {cells} | {mean:.3f} | {interval(acc)} | {time.time() - t0:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
