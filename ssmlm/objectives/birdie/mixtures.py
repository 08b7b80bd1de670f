"""Objective configurations and named mixtures (Birdie A.1, A.2; docs/faithfulness.md#birdie-grid).

A ``Config`` is one action dimension of Birdie's controller: an objective class (one of
``reserved.CLASSES``, which picks the paradigm token and groups configs for class-balanced rewards), the
objective function ``kind`` (a key of ``functions.OBJECTIVES``) and its keyword parameters. A mixture is
(configs, probabilities), made by a function registered under its name in ssmlm.objectives.config.MIXTURES
(the one list of the names a recipe's ``objective.mixture`` takes).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from ssmlm.data.reserved import CLASSES
from ssmlm.objectives.config import MIXTURES
from ssmlm.schema import named


@dataclasses.dataclass(frozen=True)
class Config:
    cls: str
    kind: str
    params: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.cls not in CLASSES:
            raise ValueError(f"objective class {self.cls!r}: expected one of {CLASSES}")

    @property
    def name(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.kind}({args})" if args else self.kind

    def __hash__(self):
        return hash(self.name)


def _buckets(*pairs):
    return [(a, b) for a, b in pairs]


def _span_grid(cls, kind, rates, means, buckets, extra=({},), keep=lambda rate, mean, bucket: True):
    """v1's infilling/autoencoding post-process: min length := m* = ⌊μ/(2c)⌋; drop the config if
    max < m* or max − m* < (max − min)/4."""
    out = []
    for rate, mean, (lo, hi), more in itertools.product(rates, means, buckets, extra):
        if not keep(rate, mean, (lo, hi)):
            continue
        m = math.floor(mean / (2 * rate))
        if hi < m or hi - m < (hi - lo) / 4:
            continue
        out.append(Config(cls, kind, {"rate": rate, "mean": float(mean), "min_len": m, "max_len": hi, **more}))
    return out


def birdie_grid() -> list[Config]:
    """The 104 configurations of v1's Birdie grid: 26 infilling, 54 autoencoding (27 plain + 27 with
    deshuffling), 2 copying, 4 deshuffling (p ∈ {0.5, 1.0} as the paper intends; v1 never wired p, so all its
    four were 1.0), 1 next token, 1 prefix LM, 16 selective copying. Length buckets become ``max_len``
    (truncation); infilling/autoencoding also reject sources shorter than m*."""
    rates, means = (0.05, 0.15, 0.5), (3, 8, 32)
    grid = _span_grid(
        "infilling",
        "infilling",
        rates,
        means,
        _buckets((128, 256), (256, 512), (512, 1024), (1024, 2048)),
        keep=lambda rate, mean, b: mean != 3 or b == (128, 256),
    )
    grid += _span_grid(
        "autoencoding",
        "autoencoding",
        rates,
        means,
        _buckets((192, 384), (384, 768), (768, 1536)),
        extra=({"shuffle": False}, {"shuffle": True}),
    )
    grid += [Config("copying", "copying", {"max_len": hi}) for hi in (256, 1024)]
    grid += [Config("deshuffling", "deshuffling", {"max_len": hi, "p": p}) for hi in (256, 1024) for p in (0.5, 1.0)]
    grid += [Config("next_token", "next_token"), Config("prefix_lm", "prefix_lm")]
    grid += [
        Config("selective_copying", "selective_copying", {"max_len": hi, "k": k, "form": form})
        for hi in (768, 1536)
        for k in (1, 2, 3, 4)
        for form in ("query_context", "context_query")
    ]
    return grid


def initial_action(configs: list[Config]) -> np.ndarray:
    """v1's initial action / reward scaling: 1/(number of classes present) per class, split uniformly
    within the class (each infilling config of the grid gets 1/(7·26))."""
    classes = [c.cls for c in configs]
    present = sorted(set(classes))
    per_class = {k: classes.count(k) for k in present}
    return np.array([1.0 / (len(present) * per_class[k]) for k in classes])


def ul2() -> tuple[list[Config], np.ndarray]:
    """v1 configs/ul2.py: the paper's UL2 baseline; infilling min length ⌊μ/c⌋; weights / 20."""
    spans = [(0.15, 3, 4), (0.15, 8, 4), (0.5, 3, 2), (0.5, 8, 2), (0.15, 64, 2), (0.5, 64, 2)]
    configs = [
        Config("infilling", "infilling", {"rate": c, "mean": float(m), "min_len": math.floor(m / c)})
        for c, m, _ in spans
    ]
    configs.append(Config("prefix_lm", "prefix_lm"))  # prefix frac 0.75: split uniform in [0.5L, L]
    weights = np.array([w for *_, w in spans] + [4], float)
    return configs, weights / weights.sum()


def ul2_decoder() -> tuple[list[Config], np.ndarray]:
    """UL2 for decoders (Garcia et al. 2023; v2 example ul2_decoder_config): NTP 0.6, PLM 0.2,
    infilling (0.15, 3) 0.1, infilling (0.5, 32) 0.1."""
    configs = [
        Config("next_token", "next_token"),
        Config("prefix_lm", "prefix_lm"),
        Config("infilling", "infilling", {"rate": 0.15, "mean": 3.0}),
        Config("infilling", "infilling", {"rate": 0.5, "mean": 32.0}),
    ]
    return configs, np.array([0.6, 0.2, 0.1, 0.1])


def uniform_action(configs: list[Config]) -> np.ndarray:
    """The paper's start (A.1.4): "uniform sampling over all configurations for the first 250
    steps", i.e. 1/104 per configuration of the grid (autoencoding, 54 of 104, gets 0.52 of the samples)."""
    return np.full(len(configs), 1.0 / len(configs))


def birdie() -> tuple[list[Config], np.ndarray]:
    """The Birdie grid, uniform over its configurations (the paper's start; the controller's default
    ``start: uniform``); the controller moves the probabilities while training runs."""
    grid = birdie_grid()
    return grid, uniform_action(grid)


def birdie_fixed() -> tuple[list[Config], np.ndarray]:
    """Stand-in for the paper's Fixed Ratio Mixture ("BFR"). ASSUMPTION: the paper's hand-tuned ratios were
    never published (paper A.13), so this is the official v1 code's initial action (1/7 per class, uniform within
    each) frozen: every objective class gets an equal share, which uniform-per-configuration would not."""
    grid = birdie_grid()
    return grid, initial_action(grid)


def clm() -> tuple[list[Config], np.ndarray]:
    """Next-token prediction only."""
    return [Config("next_token", "next_token")], np.array([1.0])


# mixtures whose probabilities a controller may replace (train_batch's ``state``)
DYNAMIC = {"birdie"}


def mixture(name: str) -> tuple[list[Config], np.ndarray]:
    """(configs, probabilities) of a named mixture (a fresh copy)."""
    if name not in MIXTURES:
        raise ValueError(f"mixture {name!r}: expected one of {sorted(MIXTURES)}")
    configs, probs = named(MIXTURES[name])()
    return configs, np.asarray(probs, float) / np.sum(probs)
