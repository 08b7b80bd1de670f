"""Importing released weights as run directories: an official BiGS checkpoint (local or ``hub:``) becomes an
ssmlm run that finetune, evaluate and analyze accept (reading and mapping the weights: ssmlm.models.convert)."""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ssmlm import paths, staging
from ssmlm.errors import CheckpointError, UserError
from ssmlm.models.convert import (
    CONFIG_FILE,
    HUB_FILES,
    HUB_PREFIX,
    WEIGHTS_FILE,
    first_line,
    is_classifier,
    map_params,
    model_config_from_official,
    read_dir,
)
from ssmlm.recipe import DataConfig, Recipe, TaskConfig
from ssmlm.runs.checkpoint import Checkpoints


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
        why = f"{offline}, and not in the local cache" if offline else first_line(e)
        raise CheckpointError(
            f"hub:{name}: could not download the checkpoint ({type(e).__name__}: {why}); download "
            f"{CONFIG_FILE}, {WEIGHTS_FILE} and vocab.txt by hand and pass their directory"
        ) from None
    path = Path(path)
    return path, {"source": f"{HUB_PREFIX}{name}", "source_revision": path.name}


def read_official(src: str | Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json as a dict, {"s4_bert/embeddings/...": array}) of an official BiGS checkpoint.

    ``src`` is a local directory with config.json and flax_model.msgpack, or ``hub:OWNER/NAME[@REVISION]``
    (downloaded with huggingface_hub; a clear CheckpointError when offline or missing).
    """
    d, _ = _resolve(src)
    return read_dir(d, str(src))


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
        tcfg = TaskConfig(
            name=td.name,
            text_fields=list(td.text_fields),
            label_field=td.label_field,
            num_labels=num_labels,
            max_seq_length=max_len,
        )
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

    from ssmlm.models import build_classifier, build_mlm, flops

    out = Path(out_dir).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(p.name != staging.MARK for p in out.iterdir())):
        raise CheckpointError(f"{out_dir}: already exists and is not empty; choose another output directory")
    d, src_info = _resolve(src)
    config, flat = read_dir(d, str(src))
    cfg = model_config_from_official(config)

    classifier = is_classifier(flat)
    if classifier:
        if "classifier/kernel" not in flat or flat["classifier/kernel"].ndim != 2:
            raise CheckpointError(
                "BiGS checkpoint: has a pooler but no 2-D classifier/kernel; missing leaf classifier/kernel"
            )
        num_labels = int(flat["classifier/kernel"].shape[1])
        abstract = flops.abstract(lambda: build_classifier(cfg, num_labels))
    else:
        abstract = flops.abstract(lambda: build_mlm(cfg))
    _, abs_params = nnx.split(abstract, nnx.Param)
    params = map_params(flat, abs_params)
    del flat  # the official arrays: half the peak memory of a full-size import
    tok, lowercase = _tokenizer(d, cfg.vocab_size, str(src))

    data = DataConfig(
        source="builtin",
        tokenizer=paths.join(staging.location(out), "tokenizer.json")
        if staging.url_of(out)
        else str(out / "tokenizer.json"),
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

    # Write into a sibling temporary directory and rename it at the end: no half-written run on failure. A run in
    # a bucket is written in place (its staging folder, its checkpoint in the bucket: ssmlm.staging), and removed
    # from the bucket by its staging if this fails.
    out.parent.mkdir(parents=True, exist_ok=True)
    remote = staging.url_of(out) is not None
    tmp = out if remote else Path(tempfile.mkdtemp(prefix=f".{out.name}.importing-", dir=out.parent))
    try:
        (tmp / "recipe.yaml").write_text(recipe.to_yaml())
        (tmp / "run.json").write_text(json.dumps(info, indent=2))
        tok.save(str(tmp / "tokenizer.json"))
        ckpt = Checkpoints(tmp, keep=1)
        # Orbax cannot save an empty tree; the imported run has no optimizer state (the official
        # checkpoints carry none), so a one-scalar placeholder stands in for it.
        import jax.numpy as jnp

        meta = {
            "step": 0,
            "data_position": 0,
            "total_steps": 0,
            "kind": info["kind"],
            "imported": True,
            **src_info,
            "metrics": {},
        }
        ckpt.save(0, params, {"imported": jnp.zeros((), jnp.int32)}, meta)
        ckpt.close()
        if not remote:
            if out.exists():
                out.rmdir()  # empty (checked above)
            tmp.replace(out)
    except BaseException:
        if not remote:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
