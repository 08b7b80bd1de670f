"""Compile time of the full jitted MLM train step (forward, backward, AdamW), scanned vs unrolled blocks.

Nothing big is allocated: the model is built with nnx.eval_shape, and the step (ssmlm.train.loop's, with
the MLM loss and ssmlm.train.optim.make_optimizer, as benchmarks/throughput.py) is lowered
and compiled on abstract arguments (jax.ShapeDtypeStruct). Times are wall seconds of .lower() (tracing)
and .compile() (XLA), one process, this machine, and the process CPU seconds of both (steadier than wall time
on a shared machine). Rows:

  depth sweep     bigs / bert / gmlp at d=128 and 2, 8, 32 layers: does the time grow with depth?
  gmlp 144        the 144-block gMLP of "Pay Attention to MLPs" Table 4 (recipes/gmlp_depth144.yaml)
  bigs_full       recipes/bigs_full.yaml at paper size (23 layers, d=1024)
  peer            HuggingFace FlaxBertForMaskedLM vs ssmlm's bert at BERT-base size (skipped with a
                  message when transformers is not importable; it is no dependency of ssmlm)
  peers           ssmlm against each peer at the sizes benchmarks/throughput.py and lm_throughput.py time:
                  BiGS vs the official BiGS code and BERT vs HF FlaxBertForMaskedLM (d 256, 4 layers, 4,096
                  tokens a step; the same steps as throughput.py's, built by its functions), and every
                  language-model family vs the segment-aware Transformer (lm_throughput.py's d 256, L 2,048,
                  batch 2). Compiles interleaved (paired.compare_fresh: a fresh jit each round, rotating order,
                  --rounds rounds x 2 passes); the ratio is peer / ssmlm (above 1: ssmlm compiles faster).
  auto            what sets model.scan_layers: auto (models/config.SCAN_LAYERS_FROM): by depth, the compile
                  time of both layouts (interleaved) and the training step time of both (interleaved).

    python benchmarks/compile.py                        # sweep, paper, peer
    python benchmarks/compile.py --only sweep           # sweep | paper | peer | peers | auto (comma-separated)
    /tmp/peervenv/bin/python benchmarks/compile.py --only peers     # with the official BiGS and transformers
    python benchmarks/compile.py --depths 2,8,32,64 --batch 8 --length 128
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from ssmlm.models import build_mlm
from ssmlm.objectives.batch import Batch
from ssmlm.objectives.losses import token_prediction_loss
from ssmlm.recipe import ModelConfig, TrainConfig, load_recipe
from ssmlm.train.loop import make_train_step
from ssmlm.train.optim import make_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_throughput  # noqa: E402
import throughput  # noqa: E402
from paired import compare, compare_fresh, machine_line, ratio_cell  # noqa: E402

VOCAB = 30522
STEP = jax.ShapeDtypeStruct((), jnp.int32)


def abstract_batch(batch: int, length: int) -> dict:
    preds = max(1, round(0.15 * length))
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    return {
        "input_ids": i32(batch, length),
        "masked_lm_positions": i32(batch, preds),
        "masked_lm_ids": i32(batch, preds),
    }


def abstract_mlm_batch(batch: int, length: int) -> Batch:
    """The typed batch MLM training sees, as shapes only."""
    preds = max(1, round(0.15 * length))
    i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)  # noqa: E731
    return Batch(tokens=i32(batch, length), segment_ids=i32(batch, length), positions=i32(batch, length),
                 targets=i32(batch, preds), loss_weights=jax.ShapeDtypeStruct((batch, preds), jnp.float32),
                 target_positions=i32(batch, preds))  # fmt: skip


def timed(lower) -> tuple[float, float, float]:
    """(lower wall s, compile wall s, CPU s of both) of ``lower()`` then ``.compile()``."""
    c0, t0 = time.process_time(), time.perf_counter()
    lowered = lower()
    t1 = time.perf_counter()
    lowered.compile()
    return t1 - t0, time.perf_counter() - t1, time.process_time() - c0


def compile_ssmlm(cfg: ModelConfig, batch: int, length: int) -> tuple[float, float, float]:
    """timed() of ssmlm's train step for ``cfg``."""
    graphdef, params = nnx.split(nnx.eval_shape(lambda: build_mlm(cfg)), nnx.Param)
    tx = make_optimizer(TrainConfig(steps=1000, warmup_steps=0), 1000, params, cfg).tx
    opt_state = jax.eval_shape(tx.init, params)
    step = make_train_step(token_prediction_loss, tx, graphdef, seed=0)
    return timed(lambda: step.lower(params, opt_state, abstract_mlm_batch(batch, length), STEP))


def compile_hf_bert(cfg: ModelConfig, batch: int, length: int) -> tuple[float, float, float] | None:
    """The same step for HuggingFace's FlaxBertForMaskedLM: MLM loss at the masked positions, AdamW."""
    try:
        from transformers import BertConfig, FlaxBertForMaskedLM
    except ImportError as e:
        print(f"  (peer skipped: transformers with Flax models is not importable: {e})")
        return None
    hf_cfg = BertConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                        num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
                        max_position_embeddings=cfg.max_seq_length)  # fmt: skip
    model = FlaxBertForMaskedLM(hf_cfg, input_shape=(1, length), _do_init=False)
    params = jax.eval_shape(lambda: model.init_weights(jax.random.key(0), (1, length)))
    tx = optax.adamw(1e-4, weight_decay=0.01)
    opt_state = jax.eval_shape(tx.init, params)

    def train_step(params, opt_state, b, step):
        def loss_of(p):
            logits = model(b["input_ids"], params=p, dropout_rng=jax.random.fold_in(jax.random.key(0), step),
                           train=True).logits  # fmt: skip
            logits = jnp.take_along_axis(logits, b["masked_lm_positions"][..., None], axis=1)
            return optax.softmax_cross_entropy_with_integer_labels(logits, b["masked_lm_ids"]).mean()

        loss, grads = jax.value_and_grad(loss_of)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return timed(lambda: jax.jit(train_step).lower(params, opt_state, abstract_batch(batch, length), STEP))


def report(name: str, kind: str, lo: float, co: float, cpu: float) -> None:
    print(f"  {name:<44} {kind:<10} lower {lo:6.1f} s  compile {co:6.1f} s  total {lo + co:6.1f} s  "
          f"(CPU {cpu:6.1f} s)", flush=True)  # fmt: skip


def row(name: str, cfg: ModelConfig, batch: int, length: int, layouts=(False, True)) -> dict:
    out = {}
    for scan in layouts:
        lo, co, cpu = compile_ssmlm(dataclasses.replace(cfg, scan_layers=scan), batch, length)
        out[scan] = lo + co
        report(name, "scanned" if scan else "unrolled", lo, co, cpu)
    if len(out) == 2:
        print(f"  {name:<44} unrolled / scanned = {out[False] / out[True]:.1f}x", flush=True)
    return out


def small(arch: str, layers: int, d: int, length: int) -> ModelConfig:
    heads = {"num_heads": max(1, d // 64)} if arch == "bert" else {}
    width = (3 if arch == "bigs" else 6 if arch == "gmlp" else 4) * d
    return ModelConfig(arch=arch, vocab_size=VOCAB, hidden_size=d, num_layers=layers, max_seq_length=length,
                       intermediate_size=width, **heads)  # fmt: skip


def lower_compile(side) -> None:
    """Trace, lower and compile a throughput.Side's step (its jit is fresh: nothing cached)."""
    side.step_fn.lower(side.params, side.opt_state, side.batch, 1).compile()


def ssmlm_compile(cfg: ModelConfig, data):
    """A compare_fresh maker: build ssmlm's step for ``cfg`` (untimed), return its compile."""

    def build():
        side = throughput.ssmlm_side(cfg, data)
        return lambda: lower_compile(side)

    return build


def compile_table(title: str, makers: dict, reference: str, rounds: int) -> None:
    """Interleaved compile times of ``makers`` (name -> () -> one compile), the ratio against ``reference``."""
    res = compare_fresh(makers, reference, rounds=rounds)
    print(f"{title}\n| side | compile s, median (pass 1 · 2) | {reference} / side, paired median (range) |\n"
          "|---|---:|---|")  # fmt: skip
    for name, r in res.items():
        secs = " · ".join(f"{m:.1f}" for m in r["median_s"])
        print(f"| {name} | {secs} | {'' if name == reference else ratio_cell(r)} |", flush=True)


def encoder_peers(a) -> None:
    t = argparse.Namespace(hidden=256, layers=4, vocab=VOCAB)
    bigs, bert = throughput.import_official_bigs(None), throughput.import_hf_bert()
    for part, peer, lengths in (("bigs", bigs, (128, 4096)), ("bert", bert, (128, 512))):
        if peer is None:
            continue
        config_cls, model_cls = peer
        for length in lengths:
            data = throughput.Data.make(max(1, 4096 // length), length, VOCAB)
            cfg = throughput.bigs_cfg(t, length, "auto") if part == "bigs" else throughput.bert_cfg(t, length, "auto")
            pc, ref = throughput.peer_config(part, config_cls, t, length)

            def peer_side(pc=pc, data=data, length=length, model_cls=model_cls):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return throughput.linen_side(model_cls(pc, input_shape=(1, length), seed=0), data)

            def theirs(make=peer_side):
                side = make()
                return lambda: lower_compile(side)

            makers = {f"ssmlm {part}": ssmlm_compile(cfg, data), ref: theirs}
            compile_table(f"{part}, L {length}, d 256, 4 layers:", makers, ref, a.rounds)


def lm_peers(a) -> None:
    cfgs = lm_throughput.configs(256, 4, 2048)

    def maker(cfg):
        def build():
            step = lm_throughput.build_step(cfg, 2, 2048)
            return step.compile

        return build

    makers = {k: maker(c) for k, c in cfgs.items()}
    compile_table("language models, d 256, L 2,048, batch 2 (lm_throughput.py's sizes):", makers,
                  lm_throughput.REFERENCE, a.rounds)  # fmt: skip


def auto_rule(a) -> None:
    """Per depth: compile of both layouts (interleaved) and their step times (interleaved)."""
    print(f"scan_layers: unrolled vs scanned by depth, d {a.hidden}, batch {a.batch} x L {a.length}:")
    print("| model | layers | compile unrolled s | compile scanned s | step unrolled ms | step scanned ms | "
          "scanned / unrolled step time, paired (range) |\n|---|---:|---:|---:|---:|---:|---|")  # fmt: skip
    data = throughput.Data.make(a.batch, a.length, VOCAB)
    for arch in a.archs.split(","):
        for depth in (int(x) for x in a.depths.split(",")):
            cfg = small(arch, depth, a.hidden, a.length)
            lay = {"unrolled": dataclasses.replace(cfg, scan_layers=False),
                   "scanned": dataclasses.replace(cfg, scan_layers=True)}  # fmt: skip
            comp = compare_fresh({k: ssmlm_compile(c, data) for k, c in lay.items()}, "unrolled", rounds=1, passes=1)
            sides = {k: throughput.ssmlm_side(c, data) for k, c in lay.items()}
            steps = compare(sides, "unrolled", rounds=a.rounds, warmup=2)
            r = steps["scanned"]
            inv = " · ".join(f"{1 / m:.2f} ({1 / hi:.2f}–{1 / lo:.2f})"
                             for m, lo, hi in zip(r["ratio"], r["lo"], r["hi"], strict=True))  # fmt: skip
            cu, cs = comp["unrolled"]["median_s"][0], comp["scanned"]["median_s"][0]
            su, ss = steps["unrolled"]["median_s"][0] * 1e3, r["median_s"][0] * 1e3
            print(f"| {arch} | {depth} | {cu:.1f} | {cs:.1f} | {su:.0f} | {ss:.0f} | {inv} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="sweep,paper,peer")
    ap.add_argument("--depths", default="2,8,32")
    ap.add_argument("--archs", default="bigs,bert,gmlp")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--paper-unrolled", default="yes", help="also compile the paper-size models unrolled (slow)")
    ap.add_argument("--rounds", type=int, default=3, help="peers/auto: interleaved rounds per pass (2 passes)")
    a = ap.parse_args()
    parts = set(a.only.split(","))
    print(machine_line())
    dev = jax.devices()[0]
    print(f"device: {len(jax.devices())} x {dev.platform} ({dev.device_kind}); "
          f"{platform.processor() or platform.machine()}; jax {jax.__version__}; "
          f"batch {a.batch} x length {a.length}")  # fmt: skip

    if "sweep" in parts:
        print(f"depth sweep (d={a.hidden}):")
        for arch in a.archs.split(","):
            for depth in (int(x) for x in a.depths.split(",")):
                row(f"{arch} {depth} layers", small(arch, depth, a.hidden, a.length), a.batch, a.length)

    if "paper" in parts:
        print("paper sizes:")
        layouts = (False, True) if a.paper_unrolled == "yes" else (True,)
        for name in ("gmlp_depth144", "bigs_full"):
            cfg = dataclasses.replace(load_recipe(name).model, vocab_size=VOCAB)
            length = min(a.length, cfg.max_seq_length)
            cfg = dataclasses.replace(cfg, max_seq_length=length) if cfg.arch in ("gmlp", "amlp") else cfg
            label = f"{name} ({cfg.num_layers}L d={cfg.hidden_size} ffn={cfg.intermediate_size})"
            row(label, cfg, a.batch, length, layouts)

    if "peers" in parts:
        encoder_peers(a)
        lm_peers(a)

    if "auto" in parts:
        auto_rule(a)

    if "peer" in parts:
        print("peer at equal size (BERT-base shape, 12 layers d=768, post-LN as HuggingFace's):")
        cfg = ModelConfig(arch="bert", vocab_size=VOCAB, hidden_size=768, num_layers=12, intermediate_size=3072,
                          num_heads=12, max_seq_length=512, stack_norm="post", final_norm=False)  # fmt: skip
        ours = row("ssmlm bert", cfg, a.batch, a.length)
        hf = compile_hf_bert(cfg, a.batch, a.length)
        if hf is not None:
            lo, co, cpu = hf
            report("HF FlaxBertForMaskedLM", "(unrolled)", lo, co, cpu)
            print(f"  ssmlm scanned / HF = {ours[True] / (lo + co):.2f}x; ssmlm unrolled / HF = "
                  f"{ours[False] / (lo + co):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
