"""Import the officially released BiGS checkpoints (jxiw/BiGS; `JunxiongWang/BiGS_*` on the hub) as runs.

An official checkpoint is a Hugging Face Flax model directory: `config.json` (BiGSConfig keys) and
`flax_model.msgpack` (the parameter tree of `FlaxBiGSForMaskedLM` or `FlaxBiGSForSequenceClassification`,
bigs_official.md §1.8), usually with the bert-large-uncased `vocab.txt`. `import_bigs` maps every leaf onto
our BiGS (ssmlm.models.bigs / heads) and writes an ordinary run directory (recipe.yaml, run.json,
tokenizer.json, an Orbax checkpoint at step 0) that `finetune`, `extend-length`, `evaluate` and `analyze`
accept like any run of ours.

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
The mapping is onto the unrolled layout (encoder/layers/<i>/…); an imported run has the default scanned
layout (model.scan_layers), the layers stacked by ssmlm.models.layout.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ssmlm.errors import CheckpointError, UserError
from ssmlm.recipe import DataConfig, ModelConfig, Recipe, TaskConfig

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


def _resolve(src: str | Path) -> tuple[Path, dict[str, Any]]:
    """The local directory holding the checkpoint, downloading a ``hub:OWNER/NAME[@REVISION]`` first."""
    text = str(src)
    if text.startswith(HUB_PREFIX):
        return _download(text[len(HUB_PREFIX) :])
    p = Path(text).expanduser()
    if p.is_file() and p.name == WEIGHTS_FILE:
        p = p.parent
    if not p.is_dir():
        raise CheckpointError(
            f"BiGS checkpoint '{src}': no such directory (expected a directory holding {CONFIG_FILE} and "
            f"{WEIGHTS_FILE}, or hub:OWNER/NAME such as hub:JunxiongWang/BiGS_512)"
        )
    return p.resolve(), {"source": str(p.resolve())}


def _download(name: str) -> tuple[Path, dict[str, Any]]:
    repo, _, revision = name.partition("@")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        raise CheckpointError(f"'hub:{name}': expected hub:OWNER/NAME[@REVISION], e.g. hub:JunxiongWang/BiGS_512")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            f"hub:{name}: downloading needs the huggingface_hub package (pip install huggingface_hub)"
        ) from None
    from ssmlm.data.hub import offline_reason

    offline = offline_reason()  # offline, huggingface_hub only looks in its cache: no retries
    try:
        path = snapshot_download(repo, revision=revision or None, allow_patterns=HUB_FILES)
    except Exception as e:  # offline, unknown repo, no access, network: all one line for the user
        why = f"{offline}, and not in the local cache" if offline else _first_line(e)
        raise CheckpointError(
            f"hub:{name}: could not download the checkpoint ({type(e).__name__}: {why}); download "
            f"{CONFIG_FILE}, {WEIGHTS_FILE} and vocab.txt by hand and pass their directory"
        ) from None
    path = Path(path)
    return path, {"source": f"{HUB_PREFIX}{name}", "source_revision": path.name}


def _first_line(e: BaseException, limit: int = 200) -> str:
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


def _read_dir(d: Path, src: str) -> tuple[dict, dict[str, np.ndarray]]:
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
        raise CheckpointError(f"{cfg_path}: not valid JSON: {_first_line(e)}") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_path}: expected a JSON object, got {type(config).__name__}")
    from flax import serialization

    try:
        tree = serialization.msgpack_restore(w_path.read_bytes())
    except Exception as e:
        raise CheckpointError(f"{w_path}: not a Flax msgpack checkpoint: {_first_line(e)}") from None
    if not isinstance(tree, dict) or not tree:
        raise CheckpointError(f"{w_path}: expected a parameter tree (a mapping), got {type(tree).__name__}")
    if set(tree) == {"params"} and isinstance(tree["params"], dict):  # a tree saved with its collection name
        tree = tree["params"]
    return config, _flatten(tree)


def read_official(src: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json as a dict, {"s4_bert/embeddings/...": array}) of an official BiGS checkpoint.

    ``src`` is a local directory with config.json and flax_model.msgpack, or ``hub:OWNER/NAME[@REVISION]``
    (downloaded with huggingface_hub; a clear CheckpointError when offline or missing).
    """
    d, _ = _resolve(src)
    return _read_dir(d, str(src))


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
    """Our ModelConfig for an official BiGSConfig (missing keys take BiGSConfig's defaults, §2)."""

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


def _tokenizer(d: Path, vocab_size: int, src: str):
    from ssmlm.data.tokenizer import load_tokenizer
    from ssmlm.errors import DataError

    lowercase = True
    tc = d / "tokenizer_config.json"
    if tc.is_file():
        try:
            lowercase = bool(json.loads(tc.read_text()).get("do_lower_case", True))
        except (OSError, ValueError, AttributeError):
            pass
    for name in ("vocab.txt", "tokenizer.json"):  # vocab.txt first: our own BERT pipeline around it
        if (d / name).is_file():
            try:
                tok = load_tokenizer(d / name, lowercase=lowercase)
            except DataError as e:
                raise CheckpointError(str(e)) from None
            if tok.get_vocab_size() > vocab_size:
                raise CheckpointError(
                    f"{d / name}: {tok.get_vocab_size()} tokens, but the checkpoint's vocabulary "
                    f"has only {vocab_size} rows"
                )
            return tok, lowercase
    raise CheckpointError(
        f"BiGS checkpoint '{src}': no vocab.txt or tokenizer.json next to the weights; copy the "
        "bert-large-uncased vocab.txt into it (the released BiGS models use that tokenizer)"
    )


def _task_fields(task: str | None, num_labels: int, config: dict, max_len: int):
    """(TaskConfig, run.json task fields) of an imported classifier.

    An explicit ``task`` must be a known task with the classifier's label count; otherwise config.json's
    ``finetuning_task`` is used when it is one, and is only recorded by name when it is not.
    """
    from ssmlm.data.tasks import TASKS

    if task is not None:
        td = TASKS.get(task)
        if td is None:
            raise UserError(f"unknown task '{task}' (known: {', '.join(TASKS)})")
        if td.num_labels != num_labels:
            raise CheckpointError(
                f"task {task} has {td.num_labels} labels, but the checkpoint's classifier has {num_labels}"
            )
    else:
        task = config.get("finetuning_task")
        task = task if isinstance(task, str) and task else None
        td = TASKS.get(task) if task else None
        if td is not None and td.num_labels != num_labels:  # not the task it claims to be
            task = td = None
    id2label = config.get("id2label") or {}
    names = [str(id2label.get(str(i), id2label.get(i, ""))) for i in range(num_labels)] if num_labels > 1 else []
    label_names = names if names and all(names) and not all(re.fullmatch(r"LABEL_\d+", n) for n in names) else None
    if td is not None:
        metrics = list(td.metrics)
        tcfg = TaskConfig(name=td.name, text_fields=list(td.text_fields), label_field=td.label_field,
                          num_labels=num_labels, max_seq_length=max_len)  # fmt: skip
    else:
        metrics = ["pearson", "spearman"] if num_labels == 1 else ["accuracy"]
        tcfg = TaskConfig(num_labels=num_labels, max_seq_length=max_len)
    info = {
        "task": td.name if td else task,
        "num_labels": num_labels,
        "label_names": label_names,
        "metrics": metrics,
    }
    return tcfg, info


def import_bigs(src: str | Path, out_dir: str | Path, task: str | None = None) -> Path:
    """Convert an official BiGS checkpoint (a local directory or ``hub:OWNER/NAME``) into a run directory.

    A masked-LM checkpoint becomes a "pretrain" run, a sequence-classification one (pooler + classifier,
    e.g. BiGS_512_MNLI) a "finetune" run; ``task`` names its task (default: config.json's
    ``finetuning_task`` when it is a known one). Nothing is written unless every leaf maps.
    """
    from flax import nnx

    from ssmlm.models import build_classifier, build_mlm
    from ssmlm.train.checkpoint import Checkpoints

    out = Path(out_dir).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out_dir}: already exists and is not empty; choose another output directory")
    d, src_info = _resolve(src)
    config, flat = _read_dir(d, str(src))
    cfg = model_config_from_official(config)

    classifier = is_classifier(flat)
    if classifier:
        if "classifier/kernel" not in flat or flat["classifier/kernel"].ndim != 2:
            raise CheckpointError(
                "BiGS checkpoint: has a pooler but no 2-D classifier/kernel; missing leaf classifier/kernel"
            )
        num_labels = int(flat["classifier/kernel"].shape[1])
        abstract = nnx.eval_shape(lambda: build_classifier(cfg, num_labels))
    else:
        abstract = nnx.eval_shape(lambda: build_mlm(cfg))
    _, abs_params = nnx.split(abstract, nnx.Param)
    params = map_params(flat, abs_params)
    del flat  # the official arrays: half the peak memory of a full-size import
    tok, lowercase = _tokenizer(d, cfg.vocab_size, str(src))

    data = DataConfig(
        source="builtin",
        tokenizer=str(out / "tokenizer.json"),
        vocab_size=cfg.vocab_size,
        lowercase=lowercase,
    )
    info: dict[str, Any] = {"kind": "finetune" if classifier else "pretrain", "data_dir": None, **src_info}
    recipe_kw: dict[str, Any] = {}
    if classifier:
        tcfg, task_info = _task_fields(task, num_labels, config, cfg.max_seq_length)
        info.update(task_info)
        recipe_kw["task"] = tcfg
    elif task:
        raise UserError(f"--task {task}: the checkpoint is a masked-LM one (no classifier); finetune it instead")
    recipe = Recipe(
        name=out.name,
        description=f"official BiGS checkpoint imported from {src_info['source']}",
        model=cfg,
        data=data,
        **recipe_kw,
    )

    # Write into a sibling temporary directory and rename it at the end: no half-written run on failure.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.importing-", dir=out.parent))
    try:
        (tmp / "recipe.yaml").write_text(recipe.to_yaml())
        (tmp / "run.json").write_text(json.dumps(info, indent=2))
        tok.save(str(tmp / "tokenizer.json"))
        ckpt = Checkpoints(tmp, keep=1)
        # Orbax cannot save an empty tree; the imported run has no optimizer state (the official
        # checkpoints carry none), so a one-scalar placeholder stands in for it.
        import jax.numpy as jnp

        meta = {"step": 0, "data_position": 0, "total_steps": 0, "kind": info["kind"], "imported": True,
                **src_info, "metrics": {}}  # fmt: skip
        ckpt.save(0, params, {"imported": jnp.zeros((), jnp.int32)}, meta)
        ckpt.close()
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
