"""Stacked (Transformer-style) encoders of the BiGS paper's ablations (Section 4, Figure 2 "stack").

Each layer is a routing sublayer followed by a feed-forward sublayer, each wrapped in a residual with
dropout and LayerNorm — before the sublayer with a final LayerNorm (pre-LN, ``stack_norm: pre``, the default:
academic-budget-bert's BERT, the controlled setting the BiGS paper's Table 1 cites) or after the residual
(post-LN, BERT's original, ``stack_norm: post``):

    stack/att = BERT:   route(X) = MultiHeadAttention(X)                                   4d² params
    stack/ssm:          route(X) = W_bo Flip(SSM_b(Flip(W_bi · W_fo SSM_f(W_fi X))))       4d² params
    FFN(X) = W_2 GELU(W_1 X)   (W_1: d → I, W_2: I → d; I = 4d at BERT-large)              8d² params

"We replace the attention block with two sequential SSM blocks to mimic the nature of bi-directional
self-attention": the paper gives no code for stack/ssm, so this reading uses two SSM blocks in sequence,
forward then backward, each an input and an output projection around one S4D (the same shared-kernel SSM
as BiGS). Their four d×d projections take the place of attention's Q, K, V, O, which keeps the ≈12d² per
layer of the paper's parameter accounting (BiGS's gated layer is ≈13d²; hence 24 stacked vs 23 gated
layers at the same size). The SSM inputs are zeroed at padded positions (``mask_padding``, as in BiGS).
"""

from __future__ import annotations

import math

import jax
from flax import nnx

from ssmlm.models.bigs import SSM, flip, layer_kernels
from ssmlm.models.config import ArchFacts, ModelConfig, StackConfig
from ssmlm.models.layers import Encoder, MultiHeadAttention, dense, dropout, fold, gelu, layer_norm, padding_mask
from ssmlm.models.rules import ParamRule, common_rules, ssm_rule


class SSMRoute(nnx.Module):
    """Two sequential SSM blocks: forward (causal) then backward (anti-causal)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d = cfg.hidden_size
        self.w_fi, self.ssm_f, self.w_fo = dense(cfg, d, d, rngs), SSM(cfg, rngs=rngs), dense(cfg, d, d, rngs)
        self.w_bi, self.ssm_b, self.w_bo = dense(cfg, d, d, rngs), SSM(cfg, rngs=rngs), dense(cfg, d, d, rngs)
        self.mask_padding = cfg.mask_padding

    def __call__(self, x, mask=None, rng=None, *, probs: bool = False):
        # probs: the attention route's interface; an SSM route's counterpart is its kernels (kernels())
        pad = lambda t: padding_mask(t, mask, self.mask_padding)  # noqa: E731
        h = self.w_fo(self.ssm_f(pad(self.w_fi(x))))
        out = self.w_bo(flip(self.ssm_b(flip(pad(self.w_bi(h))))))
        return (out, self.kernels(x.shape[1])) if probs else out

    def kernels(self, length: int) -> dict[str, jax.Array]:
        return {"ssm_kernel_forward": self.ssm_f.kernel(length), "ssm_kernel_backward": self.ssm_b.kernel(length)}


class StackLayer(nnx.Module):
    route_cls = MultiHeadAttention

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, i = cfg.hidden_size, cfg.intermediate_size
        self.route = self.route_cls(cfg, rngs=rngs)
        self.norm1 = layer_norm(cfg, d, rngs)
        self.ffn_in = dense(cfg, d, i, rngs)
        self.ffn_out = dense(cfg, i, d, rngs)
        self.norm2 = layer_norm(cfg, d, rngs)
        self.act = gelu(cfg)
        self.rate = cfg.dropout
        self.pre_norm = cfg.stack_norm == "pre"

    def __call__(self, x, mask=None, rng=None, *, intermediates: bool = False):
        # intermediates: also return the route's attention probabilities (B, heads, L, L) or SSM kernels
        ffn = lambda h: self.ffn_out(self.act(self.ffn_in(h)))  # noqa: E731
        route = self.route(self.norm1(x) if self.pre_norm else x, mask, fold(rng, 0), probs=intermediates)
        if intermediates:
            route, aux = route
            aux = aux if isinstance(aux, dict) else {"attention": aux}
        if self.pre_norm:
            x = x + dropout(route, self.rate, fold(rng, 1))
            out = x + dropout(ffn(self.norm2(x)), self.rate, fold(rng, 2))
        else:
            x = self.norm1(x + dropout(route, self.rate, fold(rng, 1)))
            out = self.norm2(x + dropout(ffn(x), self.rate, fold(rng, 2)))
        return (out, aux) if intermediates else out


class StackSSMLayer(StackLayer):
    route_cls = SSMRoute


class BertEncoder(Encoder):
    """stack/att: BERT (Devlin et al. 2019), post-LN by default."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, StackLayer, rngs=rngs, pre_norm=cfg.stack_norm == "pre")


class StackSSMEncoder(Encoder):
    """stack/ssm: the BERT layer with its attention replaced by two sequential SSM blocks."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg, StackSSMLayer, rngs=rngs, pre_norm=cfg.stack_norm == "pre")

    def kernels(self, length: int):
        return layer_kernels(self.layers, length, lambda layer: (layer.route.ssm_f, layer.route.ssm_b))


Config = StackConfig  # this family's `model:` fields (ssmlm.models.config)
MODELS = {"bert": BertEncoder, "stack_ssm": StackSSMEncoder}
ARCHS = {  # what the reports and analyses ask of each arch (ssmlm.models.config.ArchFacts)
    "stack_ssm": ArchFacts(name="stacked SSM (BiGS ablation)", ssm_kernels=True, table6="BiGS"),
    "bert": ArchFacts(name="BERT", table6="BERT", pad_blind=True),
}


def mixing_flops(cfg: StackConfig, seq_len: int) -> float:
    """Training FLOPs per token beyond 6 per dense parameter: attention scores and mixing (12·L·d per
    layer) for bert, two S4D FFT convolutions per layer for stack/ssm."""
    if cfg.arch == "bert":
        return 12.0 * seq_len * cfg.hidden_size * cfg.num_layers
    return 2 * cfg.num_layers * 30.0 * math.log2(2 * seq_len) * cfg.hidden_size


def param_rules(cfg: ModelConfig) -> list[ParamRule]:
    """Optimizer rules of stack/ssm and BERT (ssmlm.models.rules): stack/ssm's S4D parameters in their own
    rule and the ``ssm`` group (the recipe's SSM learning rate and decay), no decay on biases and LayerNorm scales."""
    return ([ssm_rule()] if cfg.arch == "stack_ssm" else []) + common_rules()
