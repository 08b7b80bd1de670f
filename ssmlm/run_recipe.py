"""A run directory's saved recipe read as plain YAML, for the checks the CLI makes before the slow imports.

ssmlm.runs opens a run properly (the recipe parsed into its dataclasses, the model rebuilt), and importing it
imports jax; these readers import only yaml, so that a wrong option is refused in a fraction of a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ssmlm import staging
from ssmlm.models.config import ModelConfig


def saved_model(run_dir: str | Path) -> dict[str, Any]:
    """The ``model:`` section of RUN/recipe.yaml as saved ({} when it has none)."""
    raw = yaml.safe_load((staging.records(run_dir) / "recipe.yaml").read_text()) or {}
    return raw.get("model") or {}


def run_arch(run_dir: str | Path) -> str:
    """model.arch of a run (a run saved before model.arch existed: the default family)."""
    return saved_model(run_dir).get("arch", ModelConfig.arch)


def check_max_tokens(run_dir: str | Path, max_tokens: int) -> None:
    """`generate --max-tokens` against the run's saved model section (a damaged or non-LM run is left to
    ssmlm.runs.generate.load_generator to explain)."""
    from ssmlm.models.decode_limits import check_new_tokens, lm_config_of

    try:
        cfg = lm_config_of(saved_model(run_dir))
    except (OSError, yaml.YAMLError, AttributeError, TypeError, ValueError):
        return
    if cfg is not None:
        check_new_tokens(cfg, max_tokens)
