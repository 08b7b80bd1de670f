"""gMLP and aMLP: Liu, Dai, So, Le, "Pay Attention to MLPs" (arXiv 2105.08050), Sections 2 and 4.

One block, with X ∈ R^{L×d} the block input, σ = GELU and s the spatial gating unit (SGU):

    X̂ = LayerNorm(X)
    Z  = σ(X̂ U)                     L × d_ffn                      (1)
    Z̃  = s(Z)                       L × e
    Y  = Z̃ V + X                    L × d        (pre-norm, residual)
    f(Z) = W Z + b                  W ∈ R^{n×n} mixes tokens, b ∈ R^n one bias per token    (2)
    s(Z) = Z1 ⊙ f(LN(Z2)),  Z = Z1 ‖ Z2   (SGU: the default, sgu="split_multiplicative")  (4)

The other rows of Table 3 (sgu=...; f always with its input LayerNorm, as the table's caption says):
    "multiplicative"  s(Z) = Z ⊙ f(LN(Z))       (3)
    "additive"        s(Z) = Z + f(LN(Z))
    "linear"          s(Z) = f(LN(Z))

Widths. U is d → d_ffn in every variant (d_ffn = cfg.intermediate_size). The split variant gates with
half of Z, so the gate, Z̃ and V's input have e = d_ffn/2 channels (paper: "d_out = d_ffn/2 due to the
channel split"); the non-split variants gate all of Z, so e = d_ffn and V is d_ffn → d. Per block that is
1.5·d·d_ffn channel weights for split and 2·d·d_ffn otherwise. Table 3 lists 102M for the split gMLP
and 92M for the three others, all at "d_ffn = 3072". The split count is reproduced (101.1M below); a
non-split model at d_ffn = 3072 would have 129.6M, while intermediate_size = 2048 gives 91.7M, so the
paper's non-split rows appear to use a narrower expansion (inferred from the counts; the paper does not
say). recipes/gmlp_ablation.yaml spells out both readings.

Spatial weights. The MLM experiments "restrict W to be a Toeplitz matrix" (Section 4): spatial="toeplitz"
keeps 2n-1 parameters w and W[i,j] = w[i-j+n-1]; spatial="dense" keeps all n×n (Section 2, vision).
Inputs shorter than n use W[:L, :L] and b[:L]. causal=True zeroes W[i,j] for j > i (token i never sees
a later token). Initialisation (Section 2.1, "critical for training stability"): b = 1 and W near zero,
here W ~ U(-ε/n, ε/n) with ε = 1e-3, so that |f(Z) - 1| ≤ ε·max|LN(Z)| whatever n is; every block
then starts as a plain FFN, Y ≈ σ(X̂U)_1 V + X. The same b = 1 is used for every variant of Table 3
(the paper's pseudo-code has one spatial projection with init_bias=1); for "additive" that start is an
FFN plus the constant V·1, for "linear" the block starts as a constant.

aMLP (arch="amlp", Section 4.3 and Figure 6): a single-head "tiny" attention of width a
(tiny_attention_size; Table 6: 64 for base, 128 for large) reads X̂, the normalised block input:
    q, k, v = X̂ W_q, X̂ W_k, X̂ W_v       d → a each (the paper's one d → 3a projection, same parameters)
    T = softmax(q kᵀ / √a) v W_o        W_o: a → e
and T is added to the spatial projection before the gating: s(Z) = Z1 ⊙ (f(LN(Z2)) + T). Padding
keys get no weight (attention_mask) and, with causal=True, neither do later tokens. The paper's SGU does
not mask padding (Section 4 finds it unnecessary); here LN(Z2) is zeroed at padded positions before W
(mask_padding, default), so a sentence's prediction does not depend on its batch's padding; mask_padding=false
is the paper's.

Embeddings: word + token type (for sentence pairs), LayerNorm, dropout (ssmlm.models.layers, with the
position table switched off): position information lives in W (Section 2). As in BiGS here, there is
no dropout inside the blocks; a final LayerNorm after the last block (final_norm, as every pre-norm
stack needs for its heads; see ssmlm.models.layers.Encoder); cfg.remat recomputes each block in the
backward pass (the shared Encoder does it).

Shapes: B batch, L input length (≤ n), n = max_seq_length, d = hidden_size, F = d_ffn, e = gate width,
a = tiny_attention_size, V = vocab.

Differences from the paper (none is an option; the paper's official code is not public):
  * biases in U, V and the attention projections (the paper omits biases "for brevity");
  * exact GELU unless cfg.gelu == "tanh";
  * the optimiser and other Appendix A.2 settings live in the recipes, not here.

Length extension (extend-length): `extend_params` maps a trained spatial kernel/bias onto a longer n.
Toeplitz offsets |i-j| < n_old keep their values and new offsets start at 0; new biases start at 1;
a dense W is zero-padded. Outputs on inputs of length ≤ n_old are then unchanged.

Sizes (MLM, BERT vocabulary 30,522; "paper" is Table 5, Table 3/4 for the 36-layer ablation model;
"here" = this file at n = 128 with Toeplitz W, encoder + tied MLM head, `param_count_formula`;
tests/test_gmlp.py pins them within 2%):

    name          #L   d_model  d_ffn  attn   paper    here
    gmlp_ablation 36   512      3072   -      102M     101.1M   (Tables 3, 4)
    gmlp_base     48   512      3072   -      130M     129.6M
    gmlp_large    96   768      3072   -      365M     364.7M
    gmlp_xlarge   144  1024     4096   -      941M     940.0M
    amlp_base     36   512      3072   64     109M     108.3M
    amlp_large    72   768      3072   128    316M     315.0M
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from ssmlm.models import layout
from ssmlm.models.config import ArchFacts, GMLPConfig, ModelConfig
from ssmlm.models.layers import DTYPES, Encoder, MultiHeadAttention, dense, layer_norm, padding_mask
from ssmlm.models.rules import ParamRule, common_rules

# (num_layers, hidden_size, intermediate_size, tiny attention size or None, paper's params in millions)
GMLP_SIZES = {
    "gmlp_ablation": (36, 512, 3072, None, 102),
    "gmlp_base": (48, 512, 3072, None, 130),
    "gmlp_large": (96, 768, 3072, None, 365),
    "gmlp_xlarge": (144, 1024, 4096, None, 941),
    "amlp_base": (36, 512, 3072, 64, 109),
    "amlp_large": (72, 768, 3072, 128, 316),
}

SPATIAL_INIT_EPS = 1e-3  # W ~ U(-ε/n, ε/n): near zero, so f(Z) ≈ b = 1 at init (Section 2.1)


def gate_width(cfg: ModelConfig) -> int:
    """e: channels of the gate, of s(Z) and of V's input (d_ffn/2 for the split SGU, d_ffn otherwise)."""
    return cfg.intermediate_size // 2 if cfg.sgu == "split_multiplicative" else cfg.intermediate_size


# ----------------------------------------------------------------------------- spatial weights (eq. 2)


def toeplitz(w: jax.Array, n: int) -> jax.Array:
    """The n×n Toeplitz matrix W[i,j] = w[i-j+n-1] from its 2n-1 diagonals w (w[0]: offset -(n-1))."""
    if w.shape != (2 * n - 1,):
        raise ValueError(f"toeplitz: expected {2 * n - 1} diagonals for n={n}, got shape {w.shape}")
    i = jnp.arange(n)
    return w[i[:, None] - i[None, :] + n - 1]


def spatial_matrix(kernel: jax.Array, length: int, causal: bool = False) -> jax.Array:
    """W[:L, :L] (L = length) from a Toeplitz (2n-1,) or dense (n, n) kernel; lower-triangular if causal."""
    if kernel.ndim == 1:
        n = (kernel.shape[0] + 1) // 2
        # the centred 2L-1 diagonals are exactly the ones the top-left L×L block uses
        W = toeplitz(kernel[n - length : n + length - 1], length)
    else:
        W = kernel[:length, :length]
    return jnp.tril(W) if causal else W


def extend_params(path: tuple, old: jax.Array, new_shape: tuple) -> jax.Array | None:
    """extend-length hook: the value of spatial parameter ``path`` for a model with a different n.

    Handles paths ending in ("spatial", "kernel") and ("spatial", "bias"); returns None for any other path.
    Toeplitz kernel (2n-1,): old diagonals stay centred (offset 0 stays offset 0), new offsets are 0.
    Dense kernel (n, n): top-left block kept, new rows and columns 0. Bias (n,): old values, then 1.
    A shorter n crops the same way. Either way the outputs on inputs of length ≤ min(n_old, n_new) are
    unchanged, because those only read W[:L, :L] and b[:L].
    """
    names = tuple(getattr(p, "key", p) for p in path)
    if len(names) < 2 or names[-2] != "spatial" or names[-1] not in ("kernel", "bias"):
        return None
    new_shape = tuple(new_shape)
    if old.shape == new_shape:
        return old
    if layout.is_stacked(names):  # scanned layout: every block's row on its own
        one = layout.unstacked_path(names, 0)
        return jnp.stack([extend_params(one, row, new_shape[1:]) for row in old])
    if names[-1] == "bias":
        (m,) = new_shape
        return jnp.concatenate([old, jnp.ones((max(m - old.shape[0], 0),), old.dtype)])[:m]
    if old.ndim == 1:
        n_old, n_new = (old.shape[0] + 1) // 2, (new_shape[0] + 1) // 2
        if n_new >= n_old:
            pad = n_new - n_old
            return jnp.pad(old, (pad, pad))
        cut = n_old - n_new
        return old[cut : old.shape[0] - cut]
    m = new_shape[0]
    k = min(m, old.shape[0])
    return jnp.zeros(new_shape, old.dtype).at[:k, :k].set(old[:k, :k])


# ----------------------------------------------------------------------------- modules


class SpatialProjection(nnx.Module):
    """f(Z) = W Z + b along the token axis (eq. 2); one W shared by all channels."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        n = cfg.max_seq_length
        shape = (2 * n - 1,) if cfg.spatial == "toeplitz" else (n, n)
        bound = SPATIAL_INIT_EPS / n
        dtype = DTYPES[cfg.param_dtype]
        self.kernel = nnx.Param(jax.random.uniform(rngs.params(), shape, dtype, -bound, bound))
        self.bias = nnx.Param(jnp.ones((n,), dtype))  # named "bias" so the optimiser never decays it to 0
        self.causal = cfg.causal

    def matrix(self, length: int) -> jax.Array:
        return spatial_matrix(self.kernel[...], length, self.causal)

    def __call__(self, z: jax.Array) -> jax.Array:
        length = z.shape[1]
        W = self.matrix(length).astype(z.dtype)
        b = self.bias[...][:length].astype(z.dtype)
        return jnp.einsum("ij,bjc->bic", W, z) + b[None, :, None]  # (B, L, e)


class SpatialGatingUnit(nnx.Module):
    """s(Z) of Table 3; ``extra`` (the aMLP tiny attention, (B, L, e)) is added to f before the gating."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.kind = cfg.sgu
        self.norm = layer_norm(cfg, gate_width(cfg), rngs)
        self.spatial = SpatialProjection(cfg, rngs=rngs)
        self.mask_padding = cfg.mask_padding

    def __call__(self, z: jax.Array, extra: jax.Array | None = None, mask: jax.Array | None = None) -> jax.Array:
        if self.kind == "split_multiplicative":
            z1, z2 = jnp.split(z, 2, axis=-1)  # (B, L, F/2) each: bypass first, gate second (paper's `u, v`)
        else:
            z1 = z2 = z
        g = self.spatial(padding_mask(self.norm(z2), mask, self.mask_padding))
        if extra is not None:
            g = g + extra
        if self.kind == "additive":
            return z1 + g
        if self.kind == "linear":
            return g
        return z1 * g


class GMLPBlock(nnx.Module):
    """X + s(σ(LN(X) U)) V; for aMLP the tiny attention reads LN(X) and joins the gate (Figure 6)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, e = cfg.hidden_size, gate_width(cfg)
        self.norm = layer_norm(cfg, d, rngs)
        self.proj_in = dense(cfg, d, cfg.intermediate_size, rngs)  # U
        self.sgu = SpatialGatingUnit(cfg, rngs=rngs)
        self.proj_out = dense(cfg, e, d, rngs)  # V
        # single head of width a: query/key/value d → a each (the paper's fused d → 3a), output a → e
        self.attn = (
            MultiHeadAttention(cfg, rngs=rngs, d_attn=cfg.tiny_attention_size, d_out=e, num_heads=1)
            if cfg.arch == "amlp"
            else None
        )
        self.approximate = cfg.gelu == "tanh"
        self.causal = cfg.causal

    def __call__(self, x_in: jax.Array, mask=None, rng=None, *, intermediates: bool = False):
        # rng: uniform block interface; like the paper's blocks (and BiGS here) no dropout inside a block,
        # so the tiny attention's probabilities are not dropped either.
        # intermediates: also return the spatial weights W[:L, :L] and, for aMLP, the attention (B, 1, L, L).
        x = self.norm(x_in)
        z = jax.nn.gelu(self.proj_in(x), approximate=self.approximate)  # (B, L, F)
        extra = probs = None
        if self.attn is not None:
            extra, probs = self.attn(x, mask, None, causal=self.causal, probs=True)
        out = x_in + self.proj_out(self.sgu(z, extra, mask))
        if not intermediates:
            return out
        aux = {"spatial_weights": self.sgu.spatial.matrix(x_in.shape[1])}
        return out, aux if probs is None else {**aux, "attention": probs}


class GMLPEncoder(Encoder):
    """Embeddings (word + token type, no positions) and L gMLP / aMLP blocks; returns (B, L, d).

    ``attention_mask`` only reaches the aMLP tiny attention; the spatial projection mixes all positions.
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        if cfg.sgu == "split_multiplicative" and cfg.intermediate_size % 2:
            raise ValueError(f"sgu=split_multiplicative halves intermediate_size, got {cfg.intermediate_size}")
        super().__init__(cfg, GMLPBlock, rngs=rngs, positions=False)

    def spatial_weights(self, length: int | None = None) -> jax.Array:
        """W[:L, :L] of every block, (num_layers, L, L) — for `analyze` (the paper's Figures 3 and 4)."""
        length = length or self.cfg.max_seq_length
        return jnp.stack([layer.sgu.spatial.matrix(length) for layer in self.layers])  # either layout


def param_rules(cfg: ModelConfig) -> list[ParamRule]:
    """Optimizer rules of gMLP and aMLP (ssmlm.models.rules): no decay on biases (the spatial gate's bias
    included) and LayerNorm scales, decay on everything else (the Toeplitz spatial weights included)."""
    return common_rules()


def param_count_formula(cfg: ModelConfig) -> dict[str, int]:
    """Closed-form parameter count, used by tests, the size table and dry runs."""
    d, f, v, n = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.max_seq_length
    e = gate_width(cfg)
    spatial = (2 * n - 1 if cfg.spatial == "toeplitz" else n * n) + n
    per_layer = 2 * d + (d * f + f) + 2 * e + spatial + (e * d + d)
    if cfg.arch == "amlp":
        a = cfg.tiny_attention_size
        per_layer += (d * 3 * a + 3 * a) + (a * e + e)
    embeddings = v * d + cfg.type_vocab_size * d + 2 * d
    mlm_head = d * d + d + 2 * d + v  # transform, LayerNorm, output bias (decoder tied to word embeddings)
    final_norm = 2 * d if cfg.final_norm else 0
    return {
        "per_layer": per_layer,
        "encoder": per_layer * cfg.num_layers + final_norm,
        "embeddings": embeddings,
        "mlm_total": per_layer * cfg.num_layers + final_norm + embeddings + mlm_head,
    }


Config = GMLPConfig  # this family's `model:` fields (ssmlm.models.config)
MODELS = {"gmlp": GMLPEncoder, "amlp": GMLPEncoder}
ARCHS = {"gmlp": ArchFacts(name="gMLP"), "amlp": ArchFacts(name="aMLP")}  # ssmlm.models.config.ArchFacts


def mixing_flops(cfg: GMLPConfig, seq_len: int) -> float:
    """Training FLOPs per token beyond 6 per dense parameter: the spatial projection (an L×L matrix per gate
    channel, 6·L·e per layer) and aMLP's tiny attention (12·L·d_attn per layer)."""
    flops = 6.0 * seq_len * gate_width(cfg) * cfg.num_layers
    if cfg.arch == "amlp":
        flops += 12.0 * seq_len * cfg.tiny_attention_size * cfg.num_layers
    return flops
