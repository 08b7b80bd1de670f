"""The Birdie language models (docs/faithfulness.md#birdie-models): one model for gated_ssm, gated_ssm_plus,
hawk and transformer_lm, which differ only in their block, each declared by its own module.

    h_0 = Embed(tokens)                                  V × d, N(0, initializer_range²)
    h_ℓ = Block_ℓ(h_{ℓ−1}, ctx)                          residual inside the block
    logits = W_head RMSNorm(h_L)                         d → V, no bias (or tied: Embedᵀ)

``ctx`` (ssmlm.models.lm_context) describes a packed row: samples, their bidirectional prefixes and the two
reset masks the recurrences use. Layer ℓ processes the prefix bidirectionally per ``cfg.bidirectional``:
alternate (ℓ = 0, 2, 4, …, the paper's Table 7), all, or none ("Birdie – Causal").

Every block has the interface
    Block(cfg, bidirectional, *, rngs)
    block(x, ctx) -> x                    (B, L, d)
    block.init_cache(batch, max_len)      a pytree of arrays (O(1) in max_len for recurrences)
    block.prefill(x, ctx, cache)          a prompt, one sample per row, padding (segment 0) only after it
                                          -> (x, cache after the prompt's last real token)
    block.step(x, cache, pos)             one causal token (B, d) at positions pos (B,) -> (x, cache)
A block's module is the family module of its archs (one line in ssmlm.models.config.FAMILIES names it): it
declares each arch once in ``ARCHS`` (arch -> LMBlock: the block class, its name in reports, its parameter
count, its FLOPs, its parameters kept out of weight decay, its bidirectional layers) and re-exports the shared
family interface below (``Config``, ``mixing_flops``, ``param_rules``), so one block's module never needs another's.

``cfg.scan_layers`` (ssmlm.models.config.layers_scanned: auto scans from SCAN_LAYERS_FROM blocks on, as the
encoders do) runs the blocks under one ``jax.lax.scan``, so tracing and compiling a step no longer grow with the
depth (benchmarks/lm_scan_compile.py). The blocks are not all alike: a layer's bidirectional flag is a static attribute
of its block, and with ``alternate`` the recurrences' flags repeat every 2 layers. So the scan runs over groups of
p consecutive blocks, p the period of the flags (layer_period: 2 for alternate in the recurrences, else 1):
``self.blocks`` is then a LayerStack of groups, one group of p blocks whose parameters carry a leading axis of
num_layers / p (paths ``blocks/block/<j>/…``, member j = 0..p−1; unrolled ``blocks/<i>/…``, block i = row i // p of
member i mod p; ssmlm.models.layout converts). A depth that is not whole groups (alternate with an odd number of
layers) keeps the loop. Both layouts compute the same function of the same parameters and initialise alike (the
stack is built from the unrolled blocks); ``cfg.remat`` rematerialises each block in the loop and each group in
the scan. Decoding scans the groups too: a scanned model's cache holds, per member j, its cache stacked over the
groups (``cache["layers"]`` has p entries rather than num_layers; callers treat the cache as opaque). Dropout is
applied to the embeddings only, so the blocks take no key. The tied head is Embedᵀ without v1's 1/√d logit scale.

Dense layers and RMSNorms come from ssmlm.models.layers, shared with the Transformer LM, so every LM normalises
the same way: statistics, rsqrt and scale in float32, cast to the compute dtype at the end (flax's nnx.RMSNorm
rounds the scale and the input to the compute dtype first; docs/faithfulness.md#birdie-departures).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models.config import FAMILIES, ArchFacts, LMConfig, family, layers_scanned
from ssmlm.models.layers import DTYPES, LayerStack, RMSNorm, dense, dropout, fold, gelu
from ssmlm.models.lm_context import Context, make_context
from ssmlm.models.rules import ParamRule, common_rules


@dataclasses.dataclass(frozen=True, kw_only=True)
class LMBlock(ArchFacts):
    """One Birdie LM arch, as its block's module declares it in ``ARCHS``: everything the rest of ssmlm asks of it."""

    block: type  # Block(cfg, bidirectional, *, rngs), the interface of the module docstring
    per_layer_params: Callable[[LMConfig], int]  # closed-form parameters of one block (param_count_formula)
    mixing_flops: Callable[[LMConfig, int], float]  # training FLOPs per token beyond 6 per dense parameter
    no_decay: str | None = None  # regex of the parameters kept out of weight decay (the "recurrence" group)
    prefix_every_layer: bool = False  # a bidirectional prefix in every layer (attention), not every other one
    describe: Callable[[LMConfig], list[str]] = lambda cfg: []  # its width, in the dry run's model line


def mlp_text(cfg: LMConfig) -> str:
    """The separate gated MLP's width, as the dry run describes it."""
    return f"mlp {cfg.mlp_expansion:.3g}x"


def block_spec(arch: str) -> LMBlock:
    """The declaration of an LM arch (ValueError for an arch that is not a Birdie LM block)."""
    spec = getattr(family(arch), "ARCHS", {}).get(arch) if arch in FAMILIES else None
    if not isinstance(spec, LMBlock):
        raise ValueError(f"unknown LM arch {arch!r}")
    return spec


def block_class(arch: str):
    return block_spec(arch).block


def layer_is_bidirectional(cfg: LMConfig, layer: int) -> bool:
    """The recurrences split their state in every other layer (paper Table 7); the Transformer is a prefix LM
    in every layer (docs/faithfulness.md#birdie-scan), unless ``bidirectional`` is none."""
    if block_spec(cfg.arch).prefix_every_layer:
        return cfg.bidirectional != "none"
    return cfg.bidirectional == "all" or (cfg.bidirectional == "alternate" and layer % 2 == 0)


def layer_period(cfg: LMConfig) -> int:
    """p, the smallest period of the layers' bidirectional flags: the blocks a scanned model's group holds."""
    flags = [layer_is_bidirectional(cfg, i) for i in range(cfg.num_layers)]
    return next(p for p in range(1, len(flags) + 1) if flags[p:] == flags[:-p])


def blocks_scanned(cfg: LMConfig) -> bool:
    """Whether the LM runs its blocks under one scan: model.scan_layers (auto by depth), when the depth is a whole
    number of groups (else the loop)."""
    return layers_scanned(cfg) and cfg.num_layers % layer_period(cfg) == 0


# ---- layers shared by the blocks ----


def linear(cfg: LMConfig, d_in: int, d_out: int, rngs: nnx.Rngs, bias: bool = True) -> nnx.Linear:
    """Dense layer (ssmlm.models.layers.dense): kernel N(0, initializer_range²), bias 0, cfg.compute_dtype."""
    return dense(cfg, d_in, d_out, rngs, bias=bias)


def rms_norm(cfg: LMConfig, dim: int, rngs: nnx.Rngs) -> RMSNorm:
    """The shared float32-accumulating RMSNorm (ssmlm.models.layers.RMSNorm), eps cfg.norm_eps, output in
    cfg.compute_dtype. ``rngs`` draws the key flax's nnx.RMSNorm (used here before) drew, so seeded inits hold."""
    return RMSNorm(dim, cfg.norm_eps, dtype=DTYPES[cfg.compute_dtype], param_dtype=DTYPES[cfg.param_dtype], rngs=rngs)


def mlp_width(cfg: LMConfig) -> int:
    return round(cfg.mlp_expansion * cfg.hidden_size)


class GatedMLP(nnx.Module):
    """Pre-norm gated MLP residual block: x + W_down(GeLU(W_gate u) ⊙ W_up u), u = RMSNorm(x), no biases.
    The paper gives only the expansion (8/3) for Hawk; the gated form is Griffin's."""

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        d, m = cfg.hidden_size, mlp_width(cfg)
        self.norm = rms_norm(cfg, d, rngs)
        self.w_gate = linear(cfg, d, m, rngs, bias=False)
        self.w_up = linear(cfg, d, m, rngs, bias=False)
        self.w_down = linear(cfg, m, d, rngs, bias=False)
        self.act = gelu(cfg)

    def __call__(self, x):
        u = self.norm(x)
        return x + self.w_down(self.act(self.w_gate(u)) * self.w_up(u))


class CausalConv1D(nnx.Module):
    """Causal convolution y_t = b + Σ_k w_k · x_{t−k}, k < width, over (B, L, C): depthwise (w_k ⊙ x, C
    channels out) by default, or dense (x W_k, C -> ``features``) when ``features`` is given.

    A tap whose source position belongs to another sample (different segment id) or lies before the row
    contributes 0, so a packed sample never sees its neighbour's tail. The paper instead leaves width−1 pad
    tokens between samples (A.11); that is a data option and gives the same values."""

    def __init__(self, cfg: LMConfig, channels: int, *, features: int | None = None, rngs: nnx.Rngs):
        self.width = cfg.conv_width
        self.dense = features is not None
        shape = (self.width, channels, features) if self.dense else (self.width, channels)
        init = nnx.initializers.normal(cfg.initializer_range)
        self.kernel = nnx.Param(init(rngs.params(), shape, DTYPES[cfg.param_dtype]))
        self.bias = nnx.Param(jnp.zeros((features if self.dense else channels,), DTYPES[cfg.param_dtype]))

    def tap(self, x, k: int):
        w = self.kernel[k].astype(x.dtype)
        return x @ w if self.dense else x * w

    def __call__(self, x, segment_ids):
        y = self.bias[...].astype(x.dtype)
        for k in range(self.width):
            src = jnp.pad(x, ((0, 0), (k, 0), (0, 0)))[:, : x.shape[1]]
            src_seg = jnp.pad(segment_ids, ((0, 0), (k, 0)), constant_values=-1)[:, : x.shape[1]]
            same = (src_seg == segment_ids)[..., None]
            y = y + self.tap(jnp.where(same, src, 0), k)
        return y

    def tail(self, x, ends=None):
        """(B, width−1, C): the width−1 inputs of a prompt before ``ends`` (B,) (default: its length; zeros before
        its start), the decoding cache."""
        keep = self.width - 1
        if keep == 0:
            return x[:, :0]
        if ends is None:
            ends = jnp.full((x.shape[0],), x.shape[1], jnp.int32)
        x = jnp.pad(x, ((0, 0), (keep, 0), (0, 0)))  # x[t] is now at t + keep: the window before ``ends`` starts there
        return jax.vmap(lambda row, end: jax.lax.dynamic_slice_in_dim(row, end, keep, axis=0))(x, ends)

    def step(self, x, tail):
        """One new input (B, C) after ``tail`` (B, width−1, C) of the same sample -> (y, new tail)."""
        window = jnp.concatenate([tail, x[:, None]], axis=1)  # oldest first: window[-1-k] is x_{t−k}
        y = self.bias[...].astype(x.dtype) + sum(self.tap(window[:, -1 - k], k) for k in range(self.width))
        return y, window[:, 1:]


def prompt_lengths(ctx: Context):
    """(B,) int32: the real (non-padding) tokens of each prompt row, padding being after them (decoding)."""
    return jnp.sum(ctx.segment_ids != 0, axis=1).astype(jnp.int32)


def at_last(h, ctx: Context):
    """(B, …): each prompt row's value at its last real token (the state after the prompt), padding after it."""
    return h[jnp.arange(h.shape[0]), prompt_lengths(ctx) - 1]


# ---- the model ----


def run_block(graphdef, state, h, ctx: Context):
    """One block from its graph definition and state: a pure function of arrays (for jax.checkpoint)."""
    return nnx.merge(graphdef, state)(h, ctx)


def run_group(graphdef, state, h, ctx: Context):
    """A scanned model's group of blocks, in order, from its graph definition and one row of its state."""
    for block in nnx.merge(graphdef, state):
        h = block(h, ctx)
    return h


class LanguageModel(nnx.Module):
    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        if not cfg.vocab_size:
            raise ValueError("model.vocab_size is not set (take it from the tokenizer)")
        self.cfg = cfg
        d = cfg.hidden_size
        self.embeddings = nnx.Embed(
            cfg.vocab_size,
            d,
            embedding_init=nnx.initializers.normal(cfg.initializer_range),
            dtype=DTYPES[cfg.compute_dtype],
            param_dtype=DTYPES[cfg.param_dtype],
            rngs=rngs,
        )
        cls = block_class(cfg.arch)
        blocks = [cls(cfg, layer_is_bidirectional(cfg, i), rngs=rngs) for i in range(cfg.num_layers)]
        if blocks_scanned(cfg):  # stacked from the unrolled blocks, so a seed initialises both layouts alike
            p = layer_period(cfg)
            self.blocks = LayerStack([nnx.List(blocks[g : g + p]) for g in range(0, len(blocks), p)])
        else:
            self.blocks = nnx.List(blocks)
        self.final_norm = rms_norm(cfg, d, rngs)
        self.head = None if cfg.tie_embeddings else linear(cfg, d, cfg.vocab_size, rngs, bias=False)

    def logits(self, h):
        h = self.final_norm(h)
        out = self.embeddings.attend(h) if self.head is None else self.head(h)
        return out.astype(jnp.float32)

    def __call__(self, tokens, segment_ids=None, token_types=None, positions=None, rng=None, *, embedded=None):
        """Logits (B, L, V) float32 of a packed batch. ``embedded`` (B, L, d) replaces the token embeddings
        (for gradients with respect to the inputs)."""
        ctx = make_context(tokens, segment_ids, token_types, positions)
        h = self.embeddings(tokens) if embedded is None else embedded.astype(DTYPES[self.cfg.compute_dtype])
        h = dropout(h, self.cfg.dropout, fold(rng, 0))
        scanned = isinstance(self.blocks, LayerStack)
        run = run_group if scanned else run_block
        if self.cfg.remat:
            run = jax.checkpoint(run, static_argnums=(0,))
        if scanned:
            graphdef, state = nnx.split(self.blocks.block)
            h, _ = jax.lax.scan(lambda h, s: (run(graphdef, s, h, ctx), None), h, state)
        else:
            for block in self.blocks:
                h = run(*nnx.split(block), h, ctx)
        return self.logits(h)

    def through_blocks(self, h, caches: list, fn: Callable) -> tuple[jax.Array, list]:
        """h through every block by ``fn(block, h, cache) -> (h, cache)`` (prefill or step), with the blocks'
        caches (init_cache's ``layers``): in a loop, or scanned over the groups."""
        if not isinstance(self.blocks, LayerStack):
            out = []
            for block, c in zip(self.blocks, caches, strict=True):
                h, c = fn(block, h, c)
                out.append(c)
            return h, out
        graphdef, state = nnx.split(self.blocks.block)

        def body(h, xs):
            out = []
            for block, c in zip(nnx.merge(graphdef, xs[0]), xs[1], strict=True):
                h, c = fn(block, h, c)
                out.append(c)
            return h, out

        return jax.lax.scan(body, h, (state, caches))

    def init_cache(self, batch: int, max_len: int) -> dict:
        """The decoding cache: ``pos`` (B,) and ``layers``, one cache per block (unrolled), or per member of the
        group with a leading group axis (scanned)."""
        if isinstance(self.blocks, LayerStack):
            graphdef, state = nnx.split(self.blocks.block)
            # vmap over the groups' parameters gives each member's cache its leading group axis
            per_group = lambda s: [b.init_cache(batch, max_len) for b in nnx.merge(graphdef, s)]  # noqa: E731
            layers = jax.vmap(per_group)(state)
        else:
            layers = [block.init_cache(batch, max_len) for block in self.blocks]
        return {"pos": jnp.zeros((batch,), jnp.int32), "layers": layers}

    def prefill(self, tokens, token_types, cache: dict, segment_ids=None) -> tuple[jax.Array, dict]:
        """A prompt (B, L) (one sample per row; token_types 1 on its prefix, 3 after) -> its logits (B, L, V) and
        the cache after it. The prompt starts afresh: ``cache`` gives only shapes and dtypes. ``segment_ids`` 0
        marks padding after a row's prompt (1 elsewhere; default: none): padded prompts share one compiled
        prefill, and the padding changes nothing before it (every block is causal past the prefix, the
        recurrences' state and the convolutions' tail are taken at the last real token, no key is a padding one)."""
        ctx: Context = make_context(tokens, segment_ids, token_types)
        h, layers = self.through_blocks(self.embeddings(tokens), cache["layers"], lambda b, h, c: b.prefill(h, ctx, c))
        return self.logits(h), {"pos": prompt_lengths(ctx), "layers": layers}

    def step(self, tokens, cache: dict) -> tuple[jax.Array, dict]:
        """One causal token per row (B,) -> its logits (B, V) and the advanced cache."""
        pos = cache["pos"]
        h, layers = self.through_blocks(self.embeddings(tokens), cache["layers"], lambda b, h, c: b.step(h, c, pos))
        return self.logits(h), {"pos": pos + 1, "layers": layers}


# ---- the family interface every block module re-exports (ssmlm.models.config) ----

Config = LMConfig


def mixing_flops(cfg: LMConfig, seq_len: int) -> float:
    """Training FLOPs per token beyond 6 per dense parameter (ssmlm.models.flops): the block's declaration's."""
    return block_spec(cfg.arch).mixing_flops(cfg, seq_len)


def attention_flops(cfg: LMConfig, seq_len: int) -> float:
    """Attention's scores and mixing, roughly: 12·L·d per layer (forward + backward)."""
    return 12.0 * seq_len * cfg.hidden_size * cfg.num_layers


def recurrence_flops(cfg: LMConfig, seq_len: int) -> float:
    """A recurrence's elementwise gates and scan, roughly: ≈10 per state element per layer (a few multiply-adds
    forward, twice that backward)."""
    return 10.0 * cfg.state_size * cfg.num_layers


def param_rules(cfg: LMConfig) -> list[ParamRule]:
    """Optimizer rules (ssmlm.models.rules): the recurrence's gate/decay parameters undecayed (the block's
    ``no_decay``), then no decay on biases and norm scales, then everything else."""
    pattern = block_spec(cfg.arch).no_decay
    own = [ParamRule(pattern, weight_decay=False, name="recurrence")] if pattern else []
    return own + common_rules()


def mlp_params(cfg: LMConfig) -> int:
    """Parameters of a GatedMLP: norm scale, W_gate, W_up, W_down."""
    d = cfg.hidden_size
    return d + 3 * d * mlp_width(cfg)


def param_count_formula(cfg: LMConfig) -> dict[str, int]:
    """Closed-form parameter counts of every LM arch (a test holds each to its module's count)."""
    d, v = cfg.hidden_size, cfg.vocab_size
    per_layer = block_spec(cfg.arch).per_layer_params(cfg)
    embeddings = v * d
    head = 0 if cfg.tie_embeddings else d * v
    non_embedding = per_layer * cfg.num_layers + d  # + final norm
    return {
        "per_layer": per_layer,
        "non_embedding": non_embedding,
        "embeddings": embeddings,
        "total": non_embedding + embeddings + head,
    }
