"""The ``objective:`` section of a recipe: how token rows become training examples, and the settings of Birdie's
controller (``objective.controller``, the one schema the controller itself reads: ssmlm.objectives.birdie.
controller), each with the allowed values of its fields (CONTROLLER_RANGES, OBJECTIVE_RANGES; ssmlm.checks
applies them to a recipe). Plain dataclasses: reading and checking a recipe stays instant. Imports ssmlm.schema,
ssmlm.errors and the standard library only.

The registries of objective kinds (OBJECTIVES) and of Birdie's named mixtures (MIXTURES) live here, as names of
"module:attribute" imported on use: they are the only lists of those names, so a recipe's ``objective.kind`` and
``objective.mixture`` are checked against them (their fields' choices are the registries' keys) and the CLI's help
lists them, all without importing the objectives themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from ssmlm.errors import UserError
from ssmlm.schema import FRACTION, NON_NEGATIVE, POSITIVE, Rule, above, at_least, check_section, within


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """Birdie's dynamic mixture (objective.mixture: birdie): when it evaluates, its reward model and how it
    chooses the next action (Birdie paper 3.3, A.1; docs/faithfulness.md#birdie-controller). Defaults are the
    paper's (A.1) and the official v1 code's; shrink them for tiny runs."""

    eval_scale: float = 1.0  # evaluations at the paper's steps 10, 50, 250, 500, 1000, 1500, 2000, +1000 … × this
    validation_rows: int = 2  # fixed validation rows (of seq_len) per configuration, the reward's losses
    proposals: int = 2048  # random candidate actions scored per choice (per pool with pools: pareto)
    pools: Literal["uniform", "pareto"] = "uniform"  # pareto: v2's three heavy-tailed pools as well
    top_n: int = 8  # the chosen action is the mean of the best-scored candidates
    grok_iterations: int = 200  # reward-model AdamW steps after every evaluation, whatever the loss reached
    learning_rate: float = 5.0e-4
    weight_decay: float = 0.1
    clip: float = 1.0  # reward model: gradient global-norm clip
    # cyclic learning rate: triangular between learning_rate × cycle_base and learning_rate (torch CyclicLR,
    # gamma 1), cycle_up iterations from the base to the peak (step_size_up)
    cycle_base: float = 1e-3
    cycle_up: int = 100
    noise: float = 0.02  # inputs and rewards × U[1 − noise, 1 + noise] at every update (v1)
    width: int = 256  # reward model: Gated-SSM blocks of this width
    state_size: int = 512
    layers: int = 4
    max_history: int = 256  # evaluations the reward model sees (older ones are dropped)
    explore: bool = True  # code only (the paper is silent): exploration actions on a decaying schedule
    explore_style: Literal["v1", "v2"] = "v1"
    # the exploration schedule (v2 defaults; ssmlm.objectives.birdie.controller.explore_probability): over N =
    # explore_steps (0: the run's steps), p_explore is 1 during the first explore_cook·N steps, explore_max until
    # explore_warmup·N, then a cosine down to explore_min reached at explore_decay·N
    explore_steps: int = 0
    explore_decay: float = 0.5
    explore_warmup: float = 0.1
    explore_cook: float = 0.05
    explore_min: float = 0.2
    explore_max: float = 0.5
    # the action before control starts: uniform = 1/n per configuration (paper A.1.4: "uniform sampling over all
    # configurations"); class_balanced = the official v1 code's initial action, 1/7 per class, uniform within
    start: Literal["uniform", "class_balanced"] = "uniform"


# objective.controller.<field> -> its allowed values
CONTROLLER_RANGES: dict[str, Rule] = {
    "eval_scale": above(0),
    "validation_rows": POSITIVE,
    "proposals": POSITIVE,
    "top_n": POSITIVE,
    "grok_iterations": NON_NEGATIVE,
    "learning_rate": above(0),
    "weight_decay": at_least(0),
    "clip": above(0),
    "cycle_base": Rule(lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "cycle_up": POSITIVE,
    "noise": within(0, 1, hi_open=True),
    "width": Rule(lambda v: v >= 2 and v % 2 == 0, "an even number >= 2 (RMS_split halves it)"),
    "state_size": POSITIVE,
    "layers": POSITIVE,
    "max_history": at_least(2),
    "explore_steps": Rule(lambda v: v >= 0, "at least 0 (0 = the run's steps)"),
    "explore_decay": at_least(0),
    "explore_warmup": at_least(0),
    "explore_cook": at_least(0),
    "explore_min": FRACTION,
    "explore_max": FRACTION,
}


def check_controller(cfg: ControllerSettings) -> None:
    """Settings built in code (a recipe's are checked as it loads): choices, ranges, top_n <= proposals."""
    check_section(cfg, CONTROLLER_RANGES, "controller")
    if cfg.top_n > cfg.proposals:
        raise UserError(f"controller top_n = {cfg.top_n}: expected at most proposals = {cfg.proposals}")


# objective.kind -> "module:class" (ssmlm.objectives.objective_class imports it; they bring jax). mlm and
# next_token: class(cfg, special_ids, vocab_size, seq_len, seed) over token rows (``build``); lm: class(cfg,
# reserved_ids, train documents, validation documents, seq_len, seed, …) over documents (``build_lm``; it brings
# the Birdie objectives with it)
OBJECTIVES = {
    "mlm": "ssmlm.objectives.mlm:MLM",
    "next_token": "ssmlm.objectives.next_token:NextToken",
    "lm": "ssmlm.objectives.lm:LMObjective",
}

# objective.mixture (kind: lm) -> "module:function" returning (configurations, probabilities)
# (ssmlm.objectives.birdie.mixtures.mixture imports it): clm (next-token only), ul2 (v1 table), ul2_decoder,
# birdie_fixed (the Birdie grid at the v1 code's class-balanced initial action, frozen: a stand-in for the paper's
# unpublished fixed ratios), birdie (the grid, uniform over its configurations at first; a controller moves the
# action while training runs)
MIXTURES = {
    "clm": "ssmlm.objectives.birdie.mixtures:clm",
    "ul2": "ssmlm.objectives.birdie.mixtures:ul2",
    "ul2_decoder": "ssmlm.objectives.birdie.mixtures:ul2_decoder",
    "birdie_fixed": "ssmlm.objectives.birdie.mixtures:birdie_fixed",
    "birdie": "ssmlm.objectives.birdie.mixtures:birdie",
}


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """How token rows become training examples (ssmlm.objectives): the kind, and its parameters."""

    # the registries' names, read when a recipe is checked (a registry line is all a new kind or mixture needs)
    kind: Literal[tuple(OBJECTIVES)] = "mlm"  # lm = Birdie's language models
    # mlm: static = every row has `duplicate_factor` fixed masked copies (Izsak et al.; the official BiGS
    # data), dynamic = a fresh mask every step (RoBERTa), a function of (seed, step, row).
    masking: Literal["static", "dynamic"] = "static"
    masked_lm_prob: float = 0.15
    max_predictions: int | None = None  # None: round(masked_lm_prob * length); BiGS shards use 20 at 128
    duplicate_factor: int = 10  # static masking: differently-masked copies of every row
    seed: int | None = None  # None: data.seed
    # lm (the language models; ssmlm.objectives.birdie): the mixture of objective configurations, sampled
    # per packed sample (MIXTURES, above)
    mixture: Literal[tuple(MIXTURES)] = "clm"
    # paradigm token of the sample's objective class: at the start of the prefix, at its end half the time
    # (paper A.6), or none
    paradigm: Literal["start", "end_half", "none"] = "start"
    spacing: int = 0  # pad slots between packed samples (paper A.11); 0: the models mask Conv1D taps instead
    min_sample_space: int = 32  # a row is closed once less room than this is left
    controller: ControllerSettings = dataclasses.field(default_factory=ControllerSettings)  # mixture: birdie


# objective.<field> -> its allowed values ('controller.x': a field of the controller subsection)
OBJECTIVE_RANGES: dict[str, Rule] = {
    "masked_lm_prob": Rule(lambda v: 0 < v <= 1, "a probability in (0, 1]"),
    "max_predictions": POSITIVE,
    "duplicate_factor": POSITIVE,
    "seed": NON_NEGATIVE,
    "spacing": NON_NEGATIVE,
    "min_sample_space": POSITIVE,
    **{f"controller.{k}": rule for k, rule in CONTROLLER_RANGES.items()},
}
