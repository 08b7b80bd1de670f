"""Read the officially released BiGS checkpoints (jxiw/BiGS; `JunxiongWang/BiGS_*` on the hub) into our layout.

An official checkpoint is a Hugging Face Flax model directory: `config.json` (BiGSConfig keys) and
`flax_model.msgpack` (the parameter tree of `FlaxBiGSForMaskedLM` or `FlaxBiGSForSequenceClassification`,
docs/faithfulness.md#bigs-heads), usually with the bert-large-uncased `vocab.txt`. `map_params` maps every leaf onto
our BiGS (ssmlm.models.bigs / heads); ssmlm.runs.importing writes the result as an ordinary run directory
(recipe.yaml, run.json, tokenizer.json, an Orbax checkpoint at step 0) that `finetune`, `extend-length`,
`evaluate` and `analyze` accept like any run of ours.

Key mapping (official → ours; every Dense kernel is (in, out) in both, so nothing is transposed):

    s4_bert/embeddings/word_embeddings/embedding        encoder/embeddings/word/embedding
    s4_bert/embeddings/position_embeddings/embedding    encoder/embeddings/position/embedding
    s4_bert/embeddings/token_type_embeddings/embedding  encoder/embeddings/token_type/embedding
    s4_bert/embeddings/LayerNorm/{scale,bias}           encoder/embeddings/norm/{scale,bias}
    s4_bert/encoder/layer/<i>/LayerNorm/{scale,bias}    encoder/layers/<i>/norm/{scale,bias}
    s4_bert/encoder/layer/<i>/dv/{kernel,bias}          encoder/layers/<i>/w_v/…     (W_v)
                              du_forward                                  w_f       (W_f)
                              du_backward                                 w_b       (W_b)
                              duc_forward                                 w_u1      (W_u1)
                              duc_backward                                w_u2      (W_u2)
                              dol                                         w_u       (W_u)
                              do                                          w_o       (W_o)
    s4_bert/encoder/layer/<i>/fs4/{A_re,A_im,C,D,log_step}   encoder/layers/<i>/ssm_f/…  (same names)
    s4_bert/encoder/layer/<i>/bs4/{A_re,A_im,C,D,log_step}   encoder/layers/<i>/ssm_b/…
    cls/predictions/transform/dense/{kernel,bias}       mlm_head/transform/{kernel,bias}
    cls/predictions/transform/LayerNorm/{scale,bias}    mlm_head/norm/{scale,bias}
    cls/predictions/bias                                mlm_head/bias   (the decoder is tied to word)
    s4_bert/pooler/dense/{kernel,bias}                  pooler/dense/{kernel,bias}
    classifier/{kernel,bias}                            classifier/{kernel,bias}

The model config follows the checkpoint's config.json, with gelu="tanh" (the official layers use Flax's
tanh-approximate GELU; the MLM head's exact GELU is what ours uses too). Inputs should be padded to
max_position_embeddings to reproduce the official outputs exactly (the backward SSM starts on the pads).
The mapping is onto the unrolled layout (encoder/layers/<i>/…); an imported run takes the layout its
model.scan_layers resolves to (layers_scanned), stacked by ssmlm.models.layout where scanned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ssmlm.errors import CheckpointError
from ssmlm.models.config import ModelConfig

HUB_PREFIX = "hub:"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "flax_model.msgpack"
HUB_FILES = [CONFIG_FILE, WEIGHTS_FILE, "vocab.txt", "tokenizer.json", "tokenizer_config.json"]

# official module names inside one layer -> ours
LAYER_MODULES = {
    "LayerNorm": "norm",
    "dv": "w_v",
    "du_forward": "w_f",
    "du_backward": "w_b",
    "duc_forward": "w_u1",
    "duc_backward": "w_u2",
    "dol": "w_u",
    "do": "w_o",
    "fs4": "ssm_f",
    "bs4": "ssm_b",
}
EMBEDDING_MODULES = {
    "word_embeddings": "word",
    "position_embeddings": "position",
    "token_type_embeddings": "token_type",
    "LayerNorm": "norm",
}
POOLING = {"non_padding_mean": "non_padding_mean", "mean": "mean"}
SCALING = {"hippo": "hippo", "lin": "lin", "inv": "inv"}


# ----------------------------------------------------------------------------- reading


def first_line(e: BaseException, limit: int = 200) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[0] if lines else repr(e))[:limit]


def _flatten(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}/{k}" if prefix else str(k)))
    else:
        out[prefix] = np.asarray(tree)
    return out


def read_dir(d: Path, src: str) -> tuple[dict, dict[str, np.ndarray]]:
    cfg_path, w_path = d / CONFIG_FILE, d / WEIGHTS_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"BiGS checkpoint '{src}': no {CONFIG_FILE} in {d}")
    if not w_path.is_file():
        other = [n for n in ("pytorch_model.bin", "model.safetensors") if (d / n).is_file()]
        extra = f" (it holds only the PyTorch port's {other[0]}; the Flax weights are needed)" if other else ""
        raise CheckpointError(f"BiGS checkpoint '{src}': no {WEIGHTS_FILE} in {d}{extra}")
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: not valid JSON: {first_line(e)}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_path}: expected a JSON object, got {type(config).__name__}")
    from flax import serialization

    try:
        tree = serialization.msgpack_restore(w_path.read_bytes())
    except Exception as e:
        raise CheckpointError(f"{w_path}: not a Flax msgpack checkpoint: {first_line(e)}") from None
    if not isinstance(tree, dict) or not tree:
        raise CheckpointError(f"{w_path}: expected a parameter tree (a mapping), got {type(tree).__name__}")
    if set(tree) == {"params"} and isinstance(tree["params"], dict):  # a tree saved with its collection name
        tree = tree["params"]
    return config, _flatten(tree)


# ----------------------------------------------------------------------------- config


def _get(config: dict, key: str, default, kind: type):
    value = config.get(key, default)
    if value is None:
        value = default
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise CheckpointError(f"config.json: '{key}' = {value!r}: expected {kind.__name__}")
    return value


def model_config_from_official(config: dict) -> ModelConfig:
    """Our ModelConfig for an official BiGSConfig (missing keys take BiGSConfig's defaults)."""

    def choice(key: str, default: str, table: dict[str, str]) -> str:
        value = config.get(key) or default
        if value not in table:
            raise CheckpointError(f"config.json: '{key}' = {value!r}: expected one of {', '.join(table)}")
        return table[value]

    if config.get("pre_norm", True) is not True:
        raise CheckpointError(
            "config.json: 'pre_norm' = false (post-LN BiGS) is not supported; released models are pre-LN"
        )
    if config.get("num_ssm_heads") not in (None, 1):
        raise CheckpointError("config.json: 'num_ssm_heads' is set (the unreleased multihead branch); not supported")
    if (config.get("position_embedding_type") or "absolute") != "absolute":
        raise CheckpointError(
            f"config.json: 'position_embedding_type' = {config['position_embedding_type']!r}: only 'absolute'"
        )
    if (config.get("hidden_act") or "gelu") != "gelu":
        raise CheckpointError(
            f"config.json: 'hidden_act' = {config['hidden_act']!r}: only 'gelu' (exact, the MLM head's)"
        )
    if config.get("tie_word_embeddings", True) is not True:
        raise CheckpointError("config.json: 'tie_word_embeddings' = false: only the tied MLM decoder is supported")
    dropout = _get(config, "hidden_dropout_prob", 0.1, float)
    return ModelConfig(
        arch="bigs",
        vocab_size=_get(config, "vocab_size", 30522, int),
        hidden_size=_get(config, "hidden_size", 768, int),
        num_layers=_get(config, "num_hidden_layers", 24, int),
        intermediate_size=_get(config, "intermediate_size", 3072, int),
        max_seq_length=_get(config, "max_position_embeddings", 512, int),
        num_ssm=_get(config, "num_ssm", 64, int),
        type_vocab_size=_get(config, "type_vocab_size", 2, int),
        dropout=dropout,
        layer_norm_eps=_get(config, "layer_norm_eps", 1e-12, float),
        initializer_range=_get(config, "initializer_range", 0.02, float),
        a_init=choice("scaling", "hippo", SCALING),
        gelu="tanh",
        pooler=choice("pooler_type", "non_padding_mean", POOLING),
        final_norm=False,  # the official layout: no LayerNorm after the last layer
        mask_padding=False,  # the official SSMs read padding; with this the logits are the official ones
        ssm_kernels="shared",
        param_dtype="float32",
        compute_dtype="float32",
    )


# ----------------------------------------------------------------------------- mapping


def our_path(key: str) -> tuple | None:
    """Our parameter path for an official leaf name, or None when it has no counterpart."""
    parts = key.split("/")
    match parts:
        case ["s4_bert", "embeddings", module, leaf] if module in EMBEDDING_MODULES:
            return ("encoder", "embeddings", EMBEDDING_MODULES[module], leaf)
        case ["s4_bert", "encoder", "layer", i, module, leaf] if i.isdigit() and module in LAYER_MODULES:
            return ("encoder", "layers", int(i), LAYER_MODULES[module], leaf)
        case ["s4_bert", "pooler", "dense", leaf]:
            return ("pooler", "dense", leaf)
        case ["classifier", leaf]:
            return ("classifier", leaf)
        case ["cls", "predictions", "transform", "dense", leaf]:
            return ("mlm_head", "transform", leaf)
        case ["cls", "predictions", "transform", "LayerNorm", leaf]:
            return ("mlm_head", "norm", leaf)
        case ["cls", "predictions", "bias"]:
            return ("mlm_head", "bias")
    return None


def is_classifier(flat: dict[str, np.ndarray]) -> bool:
    return any(k.startswith(("classifier/", "s4_bert/pooler/")) for k in flat)


def _listing(names: list[str], limit: int = 4) -> str:
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return ("leaf " if len(names) == 1 else "leaves ") + ", ".join(names[:limit]) + more


def map_params(flat: dict[str, np.ndarray], abstract_params):
    """Fill an abstract nnx parameter State with the official leaves; CheckpointError naming any misfit.
    The official layout is one module per layer; a scanned target gets them stacked (ssmlm.models.layout)."""
    import jax.numpy as jnp
    from flax import nnx

    from ssmlm.models.layout import to_layout

    wanted, abstract_params = abstract_params, to_layout(abstract_params, "unrolled")
    targets = dict(nnx.to_flat_state(abstract_params))
    filled: dict[tuple, np.ndarray] = {}
    unmapped, bad_shape = [], []
    for key in sorted(flat):
        path = our_path(key)
        if path is None or path not in targets:
            unmapped.append(key)
            continue
        want = tuple(targets[path].get_value().shape)
        if tuple(flat[key].shape) != want:
            bad_shape.append(f"{key} has shape {tuple(flat[key].shape)}, expected {want}")
            continue
        filled[path] = flat[key]
    if unmapped:
        raise CheckpointError(
            f"BiGS checkpoint: unmapped {_listing(unmapped)} (no counterpart in the ssmlm BiGS model)"
        )
    if bad_shape:
        raise CheckpointError(
            f"BiGS checkpoint: wrong shape: {_listing(bad_shape, 2)} (does config.json match the weights?)"
        )
    missing = [_official_name(p) for p in targets if p not in filled]
    if missing:
        raise CheckpointError(f"BiGS checkpoint: missing {_listing(missing)}")
    out = []
    for path, var in nnx.to_flat_state(abstract_params):
        dtype = var.get_value().dtype
        out.append((path, var.replace(jnp.asarray(filled[path], dtype=dtype))))
    return to_layout(nnx.from_flat_state(out), wanted)


def _official_name(path: tuple) -> str:
    """The official leaf name that maps to one of our paths (for error messages)."""
    inv_layer = {v: k for k, v in LAYER_MODULES.items()}
    inv_emb = {v: k for k, v in EMBEDDING_MODULES.items()}
    p = tuple(path)
    match p:
        case ("encoder", "embeddings", module, leaf):
            return f"s4_bert/embeddings/{inv_emb.get(module, module)}/{leaf}"
        case ("encoder", "layers", i, module, leaf):
            return f"s4_bert/encoder/layer/{i}/{inv_layer.get(module, module)}/{leaf}"
        case ("pooler", "dense", leaf):
            return f"s4_bert/pooler/dense/{leaf}"
        case ("mlm_head", "transform", leaf):
            return f"cls/predictions/transform/dense/{leaf}"
        case ("mlm_head", "norm", leaf):
            return f"cls/predictions/transform/LayerNorm/{leaf}"
        case ("mlm_head", "bias"):
            return "cls/predictions/bias"
    return "/".join(map(str, p))


# ----------------------------------------------------------------------------- run directory
