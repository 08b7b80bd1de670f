"""`--dry-run`: validate a recipe, build its model abstractly and report size, cost and memory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ssmlm.models import build_classifier, build_pretraining_model, is_lm, with_vocab
from ssmlm.models.flops import abstract, flops_per_token, memory_bytes, param_counts
from ssmlm.objectives import predictions_per_row
from ssmlm.recipe import Recipe


def vocab_size(recipe: Recipe) -> int:
    """The recipe's vocabulary size: the model's, else the tokenizer to be trained's, else its tokenizer file's."""
    if recipe.model.vocab_size:
        return recipe.model.vocab_size
    if recipe.data.tokenizer == "train":
        return recipe.data.vocab_size
    from ssmlm.data.tokenizer import load_lm_tokenizer, load_tokenizer

    if recipe.data.tokenizer_type == "byte_bpe":
        return load_lm_tokenizer(recipe.data.tokenizer).get_vocab_size()
    return load_tokenizer(recipe.data.tokenizer).get_vocab_size()


def _width(cfg) -> str:
    if not is_lm(cfg.arch):
        return f"ffn={cfg.intermediate_size}"
    from ssmlm.models.lm import block_spec

    parts = block_spec(cfg.arch).describe(cfg)  # the block's own words (its module's ARCHS)
    return ", ".join([*parts, f"bidirectional={cfg.bidirectional}"])


def plan(recipe: Recipe, kind: str = "pretrain", num_labels: int | None = None) -> dict:
    """What a run of ``recipe`` would build and cost. Nothing is allocated, read or written."""
    cfg = with_vocab(recipe.model, vocab_size(recipe))
    seq_len = recipe.seq_len if kind != "finetune" else (recipe.task.max_seq_length or cfg.max_seq_length)
    if kind == "finetune" and not is_lm(cfg.arch):  # a language model finetunes as itself
        model = abstract(lambda: build_classifier(cfg, num_labels or 2))
        preds = None
    else:
        model = abstract(lambda: build_pretraining_model(cfg))
        # a language model predicts at every position (its untied head is counted with the dense parameters)
        preds = None if is_lm(cfg.arch) else predictions_per_row(recipe.objective, seq_len)
    counts = param_counts(model)
    per_token = flops_per_token(model, cfg, seq_len, preds)
    tokens_per_step = recipe.train.batch_size * seq_len
    # finetuning by epochs: train.steps is not the count (see plan_finetune, which may know the data's size)
    steps = None if kind == "finetune" and recipe.train.epochs else recipe.train.steps
    return {
        "recipe": recipe.name,
        "kind": kind,
        "arch": cfg.arch,
        "layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        # what the architecture line shows after d: the FFN width of an encoder, an LM's state / MLP / heads
        "width": _width(cfg),
        "seq_len": seq_len,
        "vocab_size": cfg.vocab_size,
        "params_total": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "train_flops_per_token": per_token,
        "tokens_per_step": tokens_per_step,
        "steps": steps,
        "epochs": recipe.train.epochs if steps is None else None,
        "train_flops_total": per_token * tokens_per_step * steps if steps is not None else None,
        "memory_bytes": memory_bytes(model, cfg),
    }


def plan_finetune(recipe: Recipe, source_dir: str | Path, num_labels: int, train_rows: int | None = None) -> dict:
    """The plan of finetuning the run at ``source_dir``; ``train_rows``: the task's training rows, where known,
    turn train.epochs into the steps the run will take (as the training loader does: whole batches per epoch)."""
    from ssmlm.runs import open_run

    src = open_run(source_dir)
    r = dataclasses.replace(recipe, model=dataclasses.replace(src.recipe.model, dropout=recipe.model.dropout))
    p = plan(r, "finetune", num_labels)
    if p["epochs"] and train_rows:
        steps = int(train_rows // recipe.train.batch_size * p["epochs"])
        p.update(
            steps=steps,
            train_rows=train_rows,
            train_flops_total=p["train_flops_per_token"] * p["tokens_per_step"] * steps,
        )
    return p
