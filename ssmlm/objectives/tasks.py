"""Finetuning objectives by head: classification and regression (GLUE, ContractNLI, built-in and local
tasks), span extraction (SQuAD 1.1/2.0) and multiple choice (QuALITY).

`prepare` turns a task section and a tokenizer into arrays per split plus a scorer per split; `task_batch`
turns a batch of those rows into the typed Batch; `HEADS` gives each head's model builder, loss and
evaluation output. The training loop is the one every objective uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from ssmlm.data.config import TaskConfig
from ssmlm.data.tasks import TASKS, TaskDef, encode, load_task
from ssmlm.errors import DataError
from ssmlm.evaluate.metrics import score as score_task
from ssmlm.models import build_classifier, build_multiple_choice, build_span
from ssmlm.objectives.batch import Batch, make_batch
from ssmlm.objectives.losses import cross_entropy

# ----------------------------------------------------------------------------- heads


def task_batch(rows: dict[str, np.ndarray]) -> Batch:
    """A batch of task rows (input_ids, attention_mask, token_type_ids, and labels or start/end positions,
    example_weight) as the typed Batch: targets are the labels (B,) or the spans (B, 2)."""
    if "start_positions" in rows:
        targets = np.stack([rows["start_positions"], rows["end_positions"]], axis=1)
    else:
        targets = rows["labels"]
    weights = rows.get("example_weight", np.ones(len(targets), np.float32))
    return make_batch(
        rows["input_ids"], targets, weights, segment_ids=rows["attention_mask"], token_types=rows["token_type_ids"]
    )


def classification_loss(model, batch: Batch, rng):
    """Cross-entropy over classes (or choices); MSE against the raw score for regression (STS-B). Every
    training row counts once (training batches have no padding rows)."""
    logits = model(batch.tokens, batch.attention_mask, batch.token_types, rng=rng)
    if logits.shape[-1] == 1:
        return jnp.mean((logits[:, 0] - batch.targets) ** 2), {"weight": jnp.float32(logits.shape[0])}
    n = logits.shape[0]
    nll, count = cross_entropy(logits, batch.targets.astype(jnp.int32), jnp.ones(n))
    return nll / count, {"weight": count}


def classification_eval(model, batch: Batch):
    return {"logits": model(batch.tokens, batch.attention_mask, batch.token_types)}


def span_loss(model, batch: Batch, rng):
    """Mean of the start and end cross-entropies (BERT's SQuAD loss)."""
    start, end = model(batch.tokens, batch.attention_mask, batch.token_types, rng=rng)
    ones = jnp.ones(start.shape[0])
    s, n = cross_entropy(start, batch.targets[:, 0], ones)
    e, _ = cross_entropy(end, batch.targets[:, 1], ones)
    return (s + e) / (2 * n), {"weight": n}


def span_eval(model, batch: Batch):
    start, end = model(batch.tokens, batch.attention_mask, batch.token_types)
    return {"start": start, "end": end}


@dataclass(frozen=True)
class Head:
    build: Callable  # (model config, num_labels, seed) -> model
    loss: Callable
    eval: Callable


HEADS = {
    "classify": Head(lambda cfg, k, seed=0: build_classifier(cfg, k, seed), classification_loss, classification_eval),
    "span": Head(lambda cfg, k, seed=0: build_span(cfg, seed), span_loss, span_eval),
    "choice": Head(lambda cfg, k, seed=0: build_multiple_choice(cfg, seed), classification_loss, classification_eval),
}


# ----------------------------------------------------------------------------- scorers


def classification_scorer(metrics: tuple[str, ...]):
    def score(outputs, batches):
        logits = np.concatenate([o["logits"] for o in outputs])
        gold = np.concatenate([b.targets for b in batches])
        keep = (np.concatenate([b.loss_weights for b in batches]) > 0) & (gold >= 0)  # test rows: -1
        return score_task(metrics, logits[keep], gold[keep]) if keep.any() else {}

    return score


def span_scorer(features: dict, examples: list[dict], version_2: bool):
    from ssmlm.data.squad import decode_spans
    from ssmlm.evaluate.squad_metrics import squad_scores

    def score(outputs, _batches):
        start = np.concatenate([o["start"] for o in outputs])
        end = np.concatenate([o["end"] for o in outputs])
        answers = decode_spans(start, end, features, examples, version_2=version_2)
        return squad_scores(answers, examples, version_2)

    return score


# ----------------------------------------------------------------------------- preparing a task


@dataclass
class Prepared:
    definition: TaskDef
    arrays: dict[str, dict[str, np.ndarray]]  # split -> model inputs, labels, example_weight
    scorers: dict[str, Callable]  # split -> score(outputs, batches)
    label_names: list | None = None  # a local task's label map (class id -> its value in the files)
    notes: list[str] = field(default_factory=list)  # for the user: the label map and balance, a held-out split

    @property
    def head(self) -> str:
        return self.definition.head


def _file(cfg: TaskConfig, split: str) -> str | None:
    return {"train": cfg.train_file, "validation": cfg.validation_file, "test": cfg.test_file}.get(split)


def _squad_examples(cfg: TaskConfig, td: TaskDef, split: str) -> list[dict]:
    from ssmlm.data.squad import read_squad_json, squad_from_hub

    v2 = td.name == "squad_v2"
    path = _file(cfg, split)
    if path is None and cfg.data_dir:
        names = {"train": "train", "validation": "dev"}
        path = Path(cfg.data_dir) / f"{names[split]}-{'v2.0' if v2 else 'v1.1'}.json"
    return read_squad_json(path) if path else squad_from_hub(v2, split)


def _quality_examples(cfg: TaskConfig, split: str) -> list[dict]:
    from ssmlm.data.scrolls import parse_quality, read_scrolls, scrolls_from_hub

    src = _file(cfg, split) or cfg.data_dir
    rows = read_scrolls(src, split) if src else scrolls_from_hub("quality", split)
    return [parse_quality(r) for r in rows]


def prepare(
    cfg: TaskConfig, tokenizer, max_len: int, doc_stride: int = 128, seed: int = 0, label_names: list | None = None
) -> Prepared:
    """A task's arrays and scorers. ``seed`` (the run's) and ``label_names`` (a finetuned run's label map): see
    `load_task`."""
    base = TASKS.get(cfg.name) if cfg.name else None  # an unknown name: a local task's, or refused by load_task
    if base is not None and base.head == "span":
        from ssmlm.data.squad import MODEL_KEYS, build_squad_features

        arrays, scorers = {}, {}
        for split in ("train", "validation"):
            examples = _squad_examples(cfg, base, split)
            feats = build_squad_features(examples, tokenizer, max_len, min(doc_stride, max_len // 2), 64)
            arrays[split] = {k: feats[k] for k in MODEL_KEYS}
            scorers[split] = span_scorer(feats, examples, base.name == "squad_v2")
        return Prepared(base, arrays, scorers)
    if base is not None and base.head == "choice":
        from ssmlm.data.scrolls import encode_quality

        arrays = {s: encode_quality(_quality_examples(cfg, s), tokenizer, max_len) for s in ("train", "validation")}
        for a in arrays.values():  # a (B, C, L) batch: the model flattens choices itself
            a.setdefault("token_type_ids", np.zeros_like(a["input_ids"]))
        score = classification_scorer(base.metrics)
        return Prepared(base, arrays, {s: score for s in arrays})
    data = load_task(cfg, seed, label_names)
    if "train" not in data.splits:
        raise DataError(f"task {data.definition.name}: no training split")
    arrays = {split: encode(data, split, tokenizer, max_len, cfg.padding) for split in data.splits}
    score = classification_scorer(data.definition.metrics)
    return Prepared(
        replace(data.definition, head="classify"), arrays, {s: score for s in arrays}, data.label_names, data.notes
    )
