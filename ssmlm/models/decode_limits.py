"""How many tokens a language model may be asked to generate (``ssmlm generate --max-tokens``), checked before
any work. Imports no jax, so `ssmlm generate` refuses an impossible request at once.

Two bounds, the smaller applies:

- length: ``LENGTH_FACTOR`` × the rows the run was trained on (``model.max_seq_length``). A recurrence's state does
  not grow with the text, so memory never stops it; but far past what it was trained on its text is noise, and
  each token is a decoding step (an hour for a million tokens at a few ms each), so a request beyond this is a
  mistake rather than a wish;
- memory (the Transformer): its KV cache holds keys and values of every layer for the prompt and every generated
  token, and must fit in half the memory free when decoding starts (the rest: the model and its activations).
"""

from __future__ import annotations

from typing import Any

from ssmlm.errors import UserError
from ssmlm.models.config import FAMILIES, ModelConfig, config_class, fields_of, is_lm

LENGTH_FACTOR = 64
CACHE_SHARE = 0.5  # of the free memory, at most, for the KV cache
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def lm_config_of(model: dict[str, Any]) -> ModelConfig | None:
    """The config of a run's saved ``model:`` section (None when it is not a language model's)."""
    arch = model.get("arch", ModelConfig.arch)
    if arch not in FAMILIES or not is_lm(arch):
        return None
    fields = fields_of(arch)
    return config_class(arch)(**{k: v for k, v in model.items() if k in fields})


def cache_bytes_per_token(cfg: ModelConfig) -> int:
    """Bytes of decoding state each token adds: keys and values of every layer for the Transformer, else 0."""
    if cfg.arch not in type(cfg).ATTENTION:  # a language model with attention heads keeps a KV cache
        return 0
    return 2 * cfg.num_layers * cfg.hidden_size * DTYPE_BYTES.get(cfg.compute_dtype, 4)


def check_new_tokens(
    cfg: ModelConfig,
    new_tokens: int,
    prompt_tokens: int = 0,
    free_bytes: int | None = None,
    option: str = "--max-tokens",
) -> None:
    """A UserError, in one line, when ``new_tokens`` after a prompt of ``prompt_tokens`` exceeds either bound
    (``free_bytes``: the memory free now; None skips the memory bound)."""
    by_length = LENGTH_FACTOR * cfg.max_seq_length
    if new_tokens > by_length:
        raise UserError(
            f"{option} {new_tokens:,}: this {cfg.arch} run allows at most {by_length:,} new tokens, {LENGTH_FACTOR} "
            f"× the {cfg.max_seq_length:,}-token rows it was trained on (far past them its text is noise, and "
            "every token is one decoding step)"
        )
    per_token = cache_bytes_per_token(cfg)
    if not per_token or free_bytes is None:
        return
    budget = int(CACHE_SHARE * free_bytes)
    need = per_token * (prompt_tokens + new_tokens)
    if need > budget:
        fit = max(budget // per_token - prompt_tokens, 0)
        raise UserError(
            f"{option} {new_tokens:,}: the KV cache of {prompt_tokens + new_tokens:,} tokens would take "
            f"{need / 2**30:,.1f} GiB ({cfg.num_layers} layers × keys and values of width {cfg.hidden_size} in "
            f"{cfg.compute_dtype}), more than half of the {free_bytes / 2**30:,.1f} GiB free; at most {fit:,} fit"
        )
