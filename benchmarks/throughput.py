"""Training throughput of ssmlm's encoders against their peers, and of BiGS against BERT, measured interleaved.

Every side is one jitted AdamW training step (forward, backward, update; parameters and optimizer state
donated) on MLM batches of the same tokens, timed with benchmarks/paired.py: the sides take turns step by step
(the order rotates each round), so neighbouring steps see the same load, and the ratio of each round is paired.
Reported per length: tokens/s of each side (median step of the first pass), the paired ratio ssmlm / peer with
its range, for each of two passes, and the parameter counts.

Parts (--only, comma-separated):

  bigs    ssmlm BiGS vs the official BiGS code (github jxiw/BiGS, modeling_flax_bigs.FlaxBiGSForMaskedLM, a
          flax.linen model), imported from --bigs-repo (default /tmp/peers/BiGS when it exists; skipped with a
          line otherwise). Same size and function as far as ssmlm's options allow: the official layer's tanh
          GELU (gelu: tanh), no LayerNorm after the last layer (final_norm: false), padding not masked before
          the SSMs (mask_padding: false; the batches have no padding anyway), HiPPO A, one shared S4D kernel,
          N = 64, embedding dropout 0.1, tied MLM head with exact GELU. The optimizer is the official
          pretrain.py's: optax.adamw with its decay mask (no decay on biases and LayerNorm scales), same lr,
          betas, eps and decay as ssmlm's step (train defaults, no clipping, SSM multiplier 1).
          The loss is each code's own: the official train step (pretrain.py) computes the logits at every
          position and weights the masked ones; ssmlm gathers the masked positions (15%) before its MLM head.
          That is a design difference of ssmlm, kept by default: it is part of what its step costs. At d 256
          the vocabulary projection dominates the step, so it also hides how the bodies compare:
          --peer-head masked runs the official model's own body (s4_bert), gathers the masked positions as
          ssmlm does, and applies the official model's own MLM head (cls: transform, tied decoder, bias) to
          those only, through linen's apply(method=...) on the official module (nothing re-implemented), with
          the same loss on the gathered targets. --peer-head all,masked times both official steps against
          ssmlm in the same interleaved rounds, one ratio column per official step.
  bert    ssmlm BERT (post-LN, stack_norm: post, final_norm: false, as HuggingFace's) vs HuggingFace
          transformers' FlaxBertForMaskedLM at the same shape (heads d/64, FFN 4d, dropout 0.1 on hidden
          states and attention probabilities, exact GELU), the loss of transformers' run_mlm_flax.py (logits
          at every position, masked ones weighted), optax.adamw with the same decay mask. Skipped with a line
          when transformers' Flax models are not importable (transformers is no dependency of ssmlm).
  family  ssmlm BiGS (12 gated layers) vs ssmlm BERT (13 stacked layers) at equal parameter count (a gated
          layer ≈13d², a stacked one ≈12d²): the paper's speed comparison, ssmlm against itself.

ssmlm's layers are laid out as ``model.scan_layers: auto`` picks (unrolled below SCAN_LAYERS_FROM blocks);
``--layouts unrolled,scanned`` times both layouts against the peer in the same interleaved rounds.

No compatibility shims are needed for the official BiGS code on jax 0.10 / flax 0.12 linen / transformers
4.57 (it imports and runs unmodified; transformers warns that its Flax classes are deprecated).
The peers live outside ssmlm's venv: run this with an interpreter that has both ssmlm and them, e.g.

    /tmp/peervenv/bin/python benchmarks/throughput.py                       # bigs + bert, d=256, L 128, 512
    ... throughput.py --lengths 128,512,1024,4096 --hidden 256 --layers 4
    ... throughput.py --only bigs --peer-head all,masked --lengths 128,512,1024,4096
    ... throughput.py --only family --hidden 128 --lengths 128,512,1024,4096

or with ssmlm's venv and transformers installed apart (pip install --target /tmp/peerlib transformers==4.57.6
and those of its dependencies the venv lacks or has at other versions):

    PYTHONPATH=/tmp/peerlib .venv/bin/python benchmarks/throughput.py ...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired import compare, machine_line, ratio_cell, summarise  # noqa: E402

from ssmlm.models import build_mlm, count_params  # noqa: E402
from ssmlm.objectives import make_batch  # noqa: E402
from ssmlm.objectives.losses import token_prediction_loss  # noqa: E402
from ssmlm.recipe import ModelConfig, TrainConfig  # noqa: E402
from ssmlm.train.loop import make_train_step  # noqa: E402
from ssmlm.train.optim import make_optimizer  # noqa: E402

TRAIN = TrainConfig(steps=1000, warmup_steps=0)  # ssmlm's defaults: AdamW, no clipping, SSM multiplier 1
DEFAULT_BIGS_REPO = "/tmp/peers/BiGS"
PEER_HEADS = {"all": "MLM head at every position (its own loss)",
              "masked": "MLM head at the masked positions only (ssmlm's gather)"}  # fmt: skip


@dataclasses.dataclass
class Data:
    """One length's MLM batch: the same tokens and masked positions for every side."""

    tokens: np.ndarray  # (B, L) ids >= 5 (no padding)
    positions: np.ndarray  # (B, P) distinct masked positions, sorted
    targets: np.ndarray  # (B, P)

    @classmethod
    def make(cls, batch: int, length: int, vocab: int, seed: int = 0) -> Data:
        rng = np.random.default_rng(seed)
        preds = max(1, round(0.15 * length))
        pos = np.sort(np.stack([rng.choice(np.arange(1, length), preds, replace=False) for _ in range(batch)]), 1)
        return cls(rng.integers(5, vocab, (batch, length)), pos, rng.integers(5, vocab, (batch, preds)))

    def labels(self) -> np.ndarray:
        """(B, L): the target at masked positions, 0 elsewhere (the official loss masks labels > 0)."""
        out = np.zeros_like(self.tokens)
        np.put_along_axis(out, self.positions, self.targets, axis=1)
        return out


class Side:
    """A jitted train step with its state, run one step per call (a zero-argument step for paired.compare)."""

    def __init__(self, step_fn: Callable, params, opt_state, batch, n_params: int):
        self.step_fn, self.params, self.opt_state, self.batch = step_fn, params, opt_state, batch
        self.n_params, self.count = n_params, 0

    def __call__(self) -> None:
        self.count += 1
        self.params, self.opt_state, out = self.step_fn(self.params, self.opt_state, self.batch, self.count)
        jax.block_until_ready(out)  # the loss (peers) or the metrics (ssmlm)


# ----------------------------------------------------------------------------- ssmlm


def ssmlm_side(cfg: ModelConfig, data: Data) -> Side:
    model = build_mlm(cfg)
    graphdef, params = nnx.split(model, nnx.Param)
    tx = make_optimizer(TRAIN, TRAIN.steps, params, cfg).tx
    step = make_train_step(token_prediction_loss, tx, graphdef, seed=0)
    b = make_batch(data.tokens, data.targets, np.ones(data.targets.shape), target_positions=data.positions)
    b = jax.device_put(b)
    return Side(step, params, tx.init(params), b, count_params(model))


# ----------------------------------------------------------------------------- peers (flax.linen)


def peer_adamw() -> optax.GradientTransformation:
    """optax.adamw as the official pretrain.py / transformers' run_mlm_flax.py build it: no decay on biases
    and LayerNorm scales; ssmlm's learning rate, betas, eps and decay."""
    from flax import traverse_util

    def decay_mask_fn(params):
        flat = traverse_util.flatten_dict(params)
        return traverse_util.unflatten_dict({p: p[-1] != "bias" and p[-2:] != ("LayerNorm", "scale") for p in flat})

    return optax.adamw(TRAIN.learning_rate, b1=TRAIN.beta1, b2=TRAIN.beta2, eps=TRAIN.eps,
                       weight_decay=TRAIN.weight_decay, mask=decay_mask_fn)  # fmt: skip


def bigs_masked_logits(module, input_ids, positions, deterministic: bool):
    """FlaxBiGSForMaskedLMModule's forward with ssmlm's gather between its body and its head, for
    ``module.apply(..., method=bigs_masked_logits)``: the official submodules (s4_bert, cls) and tied embedding
    do all the work; (B, P, vocab) logits at ``positions`` (B, P)."""
    hidden = module.s4_bert(input_ids, jnp.ones_like(input_ids), None, None, deterministic=deterministic,
                            return_dict=False)[0]  # fmt: skip
    hidden = jnp.take_along_axis(hidden, positions[..., None], axis=1)
    tied = module.config.tie_word_embeddings
    shared = module.s4_bert.variables["params"]["embeddings"]["word_embeddings"]["embedding"] if tied else None
    return module.cls(hidden, shared_embedding=shared)


def linen_side(model, data: Data, head: str = "all") -> Side:
    """The train step of the official pretrain.py (also run_mlm_flax.py's) under jit: cross-entropy weighted by
    label > 0, mean over the masked tokens; dropout on (train=True). head "all": the model's own forward, logits
    at every position. head "masked" (official BiGS only): bigs_masked_logits, logits at the masked positions,
    the loss's labels the gathered targets (all > 0)."""
    tx = peer_adamw()
    params = model.params
    vocab = model.config.vocab_size

    def logits_fn(p, batch, rng):
        if head == "all":
            return model(batch["input_ids"], params=p, dropout_rng=rng, train=True)[0]
        return model.module.apply({"params": p}, batch["input_ids"], batch["positions"], False,
                                  method=bigs_masked_logits, rngs={"dropout": rng})  # fmt: skip

    def train_step(params, opt_state, batch, step):
        def loss_fn(p):
            logits = logits_fn(p, batch, jax.random.fold_in(jax.random.key(0), step))
            label_mask = batch["labels"] > 0
            loss = optax.softmax_cross_entropy(logits, jax.nn.one_hot(batch["labels"], vocab)) * label_mask
            return loss.sum() / label_mask.sum()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    if head == "all":
        batch = {"input_ids": data.tokens, "labels": data.labels()}
    else:
        batch = {"input_ids": data.tokens, "positions": data.positions, "labels": data.targets}
    batch = jax.device_put({k: v.astype(np.int32) for k, v in batch.items()})
    n = sum(x.size for x in jax.tree.leaves(params))
    return Side(jax.jit(train_step, donate_argnums=(0, 1)), params, tx.init(params), batch, n)


def import_official_bigs(repo: str | None):
    """(BiGSConfig, FlaxBiGSForMaskedLM) from the official repository, or None with a reason printed."""
    repo = repo or (DEFAULT_BIGS_REPO if os.path.isdir(DEFAULT_BIGS_REPO) else None)
    if repo is None:
        print(f"  (official BiGS skipped: no --bigs-repo given and {DEFAULT_BIGS_REPO} does not exist; "
              "git clone https://github.com/jxiw/BiGS)")  # fmt: skip
        return None
    sys.path.insert(0, repo)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from BiGS.configuration_bigs import BiGSConfig
            from BiGS.modeling_flax_bigs import FlaxBiGSForMaskedLM
    except ImportError as e:
        print(f"  (official BiGS skipped: cannot import BiGS.modeling_flax_bigs from {repo}: {e})")
        return None
    return BiGSConfig, FlaxBiGSForMaskedLM


def import_hf_bert():
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from transformers import BertConfig, FlaxBertForMaskedLM
    except ImportError as e:
        print(f"  (HF BERT skipped: transformers with Flax models is not importable: {e})")
        return None
    return BertConfig, FlaxBertForMaskedLM


# ----------------------------------------------------------------------------- configurations


def bigs_cfg(a, length: int, layout) -> ModelConfig:
    """ssmlm BiGS computing the official layer's function (module docstring)."""
    return ModelConfig(arch="bigs", vocab_size=a.vocab, hidden_size=a.hidden, num_layers=a.layers,
                       intermediate_size=3 * a.hidden, max_seq_length=length, num_ssm=64, a_init="hippo",
                       gelu="tanh", final_norm=False, mask_padding=False, gate_norm=False, dropout=0.1,
                       scan_layers=layout)  # fmt: skip


def bert_cfg(a, length: int, layout, layers: int | None = None, norm: str = "post") -> ModelConfig:
    return ModelConfig(arch="bert", vocab_size=a.vocab, hidden_size=a.hidden, num_layers=layers or a.layers,
                       intermediate_size=4 * a.hidden, num_heads=max(1, a.hidden // 64), max_seq_length=length,
                       stack_norm=norm, final_norm=norm == "pre", dropout=0.1, scan_layers=layout)  # fmt: skip


LAYOUTS = {"auto": "auto", "unrolled": False, "scanned": True}


def layout_label(cfg: ModelConfig) -> str:
    from ssmlm.models.config import layers_scanned

    scanned = layers_scanned(cfg)
    return ("scanned" if scanned else "unrolled") + (" (auto)" if cfg.scan_layers == "auto" else "")


def print_header(what: str, refs: list[str] | None = None) -> None:
    """One ratio column per reference side (several: each row's speed over that side's, paired by round)."""
    print(f"{what}")
    cols = (["ratio ssmlm / peer, per pass: median (range)"] if not refs or len(refs) == 1
            else [f"ratio side / {r}, per pass: median (range)" for r in refs])  # fmt: skip
    print(f"| length | batch | side | tok/s | {' | '.join(cols)} | params |")
    print(f"|---:|---:|---|---:|{'---|' * len(cols)}---:|")


def print_rows(length: int, batch: int, sides: dict[str, Side], refs: list[str], res: dict) -> None:
    """``res`` is compare()'s result against refs[0]; the other references' ratios come from the same rounds."""
    passes = [{n: r["times"][i] for n, r in res.items()} for i in range(len(res[refs[0]]["times"]))]
    by_ref = [res] + [summarise(passes, ref) for ref in refs[1:]]
    for name, side in sides.items():
        tps = batch * length / res[name]["median_s"][0]
        cells = " | ".join("" if name == ref else ratio_cell(r[name]) for ref, r in zip(refs, by_ref, strict=True))
        print(f"| {length:,} | {batch} | {name} | {tps:,.0f} | {cells} | {side.n_params / 1e6:.2f}M |", flush=True)


def peer_config(part: str, config_cls, a, length: int):
    """The peer's config at the size of ``a`` for part bigs or bert."""
    if part == "bigs":
        return config_cls(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                          intermediate_size=3 * a.hidden, max_position_embeddings=length, num_ssm=64,
                          hidden_dropout_prob=0.1, pre_norm=True, scaling="hippo")  # fmt: skip
    return config_cls(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                      num_attention_heads=max(1, a.hidden // 64), intermediate_size=4 * a.hidden,
                      max_position_embeddings=length)  # fmt: skip


def peer_names(part: str, a) -> list[tuple[str, str]]:
    """[(side name, head)] of the peer's steps: one per --peer-head for bigs; bert's peer keeps its own head."""
    if part == "bigs":
        return [(f"official BiGS, head {h}", h) for h in a.peer_heads]
    return [("HF FlaxBertForMaskedLM", "all")]


def run_part(part: str, a, peer) -> None:
    for length in (int(x) for x in a.lengths.split(",")):
        batch = max(1, a.tokens // length)
        data = Data.make(batch, length, a.vocab)
        sides: dict[str, Side] = {}
        for lay in a.layouts.split(","):
            cfg = bigs_cfg(a, length, LAYOUTS[lay]) if part == "bigs" else bert_cfg(a, length, LAYOUTS[lay])
            sides[f"ssmlm {part} {layout_label(cfg)}"] = ssmlm_side(cfg, data)
        config_cls, model_cls = peer
        pc = peer_config(part, config_cls, a, length)
        for name, head in peer_names(part, a):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sides[name] = linen_side(model_cls(pc, input_shape=(1, length), seed=0), data, head)
        refs = [name for name, _ in peer_names(part, a)]
        res = compare(sides, reference=refs[0], rounds=a.rounds, warmup=a.warmup)
        print_rows(length, batch, sides, refs, res)


def run_family(a) -> None:
    for length in (int(x) for x in a.lengths.split(",")):
        batch = max(1, a.tokens // length)
        data = Data.make(batch, length, a.vocab)
        big = ModelConfig(arch="bigs", vocab_size=a.vocab, hidden_size=a.hidden, num_layers=a.gated_layers,
                          intermediate_size=3 * a.hidden, max_seq_length=length)  # fmt: skip
        sides = {"ssmlm bigs": ssmlm_side(big, data),
                 "ssmlm bert": ssmlm_side(bert_cfg(a, length, "auto", a.stacked_layers, "pre"), data)}  # fmt: skip
        res = compare(sides, reference="ssmlm bert", rounds=a.rounds, warmup=a.warmup)
        print_rows(length, batch, sides, ["ssmlm bert"], res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="bigs,bert", help="bigs, bert, family (comma-separated)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4, help="layers of both sides in the bigs and bert parts")
    ap.add_argument("--gated-layers", type=int, default=12, help="family part: BiGS layers")
    ap.add_argument("--stacked-layers", type=int, default=13, help="family part: BERT layers")
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per step (batch = tokens / length)")
    ap.add_argument("--lengths", default="128,512")
    ap.add_argument("--layouts", default="auto", help="ssmlm's layer layouts: auto, unrolled, scanned")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per pass (two passes)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per side after compiling")
    ap.add_argument("--bigs-repo", default=None, help=f"official BiGS checkout (default {DEFAULT_BIGS_REPO})")
    ap.add_argument("--peer-head", default="all",
                    help="official BiGS's MLM head: all (every position, its own loss), masked (the masked "
                         "positions only, as ssmlm), or all,masked (both, timed in the same rounds)")  # fmt: skip
    a = ap.parse_args()
    a.peer_heads = list(dict.fromkeys(a.peer_head.split(",")))
    if not a.peer_heads or any(h not in PEER_HEADS for h in a.peer_heads):
        ap.error(f"--peer-head: comma-separated {', '.join(PEER_HEADS)}, got {a.peer_head!r}")
    parts = a.only.split(",")
    print(f"d={a.hidden}, vocab {a.vocab:,}, {a.tokens:,} tokens/step, float32; paired.compare: {a.warmup} "
          f"warm-up steps, 2 passes x {a.rounds} interleaved rounds; tok/s from pass 1's median step")  # fmt: skip
    if "bigs" in parts:
        peer = import_official_bigs(a.bigs_repo)
        if peer is not None:
            heads = "; ".join(f"head {h}: {PEER_HEADS[h]}" for h in a.peer_heads)
            print_header(f"ssmlm BiGS vs the official BiGS code, {a.layers} gated layers, N=64; official {heads}:",
                         [name for name, _ in peer_names("bigs", a)])  # fmt: skip
            run_part("bigs", a, peer)
    if "bert" in parts:
        peer = import_hf_bert()
        if peer is not None:
            print_header(f"ssmlm BERT vs HuggingFace FlaxBertForMaskedLM, {a.layers} post-LN layers; "
                         f"HF's {PEER_HEADS['all']}:")  # fmt: skip
            run_part("bert", a, peer)
    if "family" in parts:
        print_header(f"ssmlm BiGS ({a.gated_layers} gated layers) vs ssmlm BERT ({a.stacked_layers} pre-LN "
                     "stacked layers), equal parameter count; ratio = BiGS / BERT:")  # fmt: skip
        run_family(a)
    print(machine_line())


if __name__ == "__main__":
    jnp.zeros(1)
    main()
