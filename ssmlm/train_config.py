"""The ``train:`` and ``mesh:`` sections of a recipe: one training stage's optimizer, schedule and bookkeeping, and
the device mesh, each with the allowed values of its fields (TRAIN_RANGES, MESH_RANGES; ssmlm.checks applies
them to a recipe). Plain dataclasses: reading and checking a recipe stays instant. Imports ssmlm.schema and the
standard library only. It sits outside ssmlm/train/, unlike the other sections beside their packages, because
train/ imports the recipe that this module is a part of.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from ssmlm.schema import FRACTION, MESH_AXIS, NON_EMPTY, NON_NEGATIVE, POSITIVE, REGEX, Rule, above, within


@dataclasses.dataclass(frozen=True)
class ParamRuleConfig:
    """A user's parameter rule (train.param_rules); see ssmlm.models.rules for how rules are matched."""

    pattern: str  # Python regex searched in the '/'-joined parameter path, e.g. '(^|/)ssm[^/]*/log_step$'
    lr_multiplier: float = 1.0  # 0 freezes the parameters it catches
    weight_decay: bool = True
    name: str = ""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training stage (pretrain, extend-length or finetune). Defaults: BiGS Table 7 pretraining."""

    steps: int = 1_000_000  # optimizer updates (ignored when epochs is set)
    epochs: float | None = None  # finetuning: passes over the training set
    batch_size: int = 760  # global batch (sequences)
    learning_rate: float = 6e-4
    schedule: Literal["cosine", "linear", "constant"] = "linear"
    warmup_steps: int | None = None  # None: warmup_ratio * total steps
    warmup_ratio: float = 0.01
    end_lr_ratio: float = 0.1  # cosine decays to this fraction of the peak (official alpha 0.1)
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    weight_decay: float = 0.05  # never on biases or LayerNorm parameters
    grad_clip: float = 0.0  # global-norm clip; 0 = off (Table 7)
    grad_accum: int = 1  # micro-batches per update (same result, less activation memory)
    # the `ssm` parameter group that families declare (ssmlm.train.optim applies these to it)
    ssm_lr_multiplier: float = 1.0  # learning-rate factor for SSM parameters (S4 practice: < 1; official BiGS: 1)
    ssm_weight_decay: bool = True  # decay SSM parameters too (official BiGS: yes; S4 practice: no)
    # Rules tried before the model family's own (first match wins), e.g. [{pattern: "^encoder/embeddings/",
    # lr_multiplier: 0.0}] freezes the embeddings. See ssmlm.models.rules.
    param_rules: list[ParamRuleConfig] = dataclasses.field(default_factory=list)
    # Divergence guard: a step whose loss or gradient is not finite is skipped (no update); too many stop the run
    # with an error (summary.json says failed, and no checkpoint of non-finite weights is written). Checked at
    # every logging step, at the end and before every checkpoint.
    max_skipped_steps: int = 10  # skipped steps in all (over every start of the run) before the run stops
    max_skipped_in_a_row: int = 3  # skipped steps in a row before the run stops (a diverged model skips every step)
    max_skipped_share: float = 0.1  # from step 10 on: the share of the steps so far that may be skipped
    seed: int = 42
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 20
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2  # the newest N checkpoints are kept (besides those of keep_steps)
    # steps checkpointed whatever checkpoint_every says and never rotated away, e.g. [200, 400, 800]: one
    # pretraining run that finetunes start from at several budgets (finetune --step)
    keep_steps: list[int] = dataclasses.field(default_factory=list)
    keep_best: str | None = None  # also keep the best checkpoint by this validation metric (e.g. mlm_loss, accuracy)
    peak_flops: float | None = None  # device peak FLOP/s for the MFU estimate (known GPUs/TPUs are looked up)
    out_dir: str = "runs"
    # experiment trackers that get every metrics.jsonl row too: tensorboard (RUN/tensorboard/, pip install
    # 'ssmlm[tracking]'), wandb (RUN/wandb/, pip install 'ssmlm[wandb]'; WANDB_MODE=offline logs locally)
    trackers: list[Literal["tensorboard", "wandb"]] = dataclasses.field(default_factory=list)
    init_from: str | None = None  # run directory whose weights start this stage (extend-length, finetune)
    init_step: int | None = None  # init_from's checkpoint at this step (finetune --step); None: its newest
    position_init: Literal["tile", "random"] = "tile"  # extend-length: how new position rows start


# train.<field> -> its allowed values ('param_rules[].x': a field of every item of the list)
TRAIN_RANGES: dict[str, Rule] = {
    "steps": POSITIVE,
    "epochs": above(0),
    "batch_size": POSITIVE,
    "learning_rate": above(0),
    "warmup_steps": NON_NEGATIVE,
    "warmup_ratio": FRACTION,
    "end_lr_ratio": FRACTION,
    "beta1": within(0, 1, hi_open=True),
    "beta2": within(0, 1, hi_open=True),
    "eps": above(0),
    "weight_decay": Rule(lambda v: v >= 0, "at least 0"),
    "grad_clip": Rule(lambda v: v >= 0, "at least 0 (0 = off)"),
    "grad_accum": POSITIVE,
    "ssm_lr_multiplier": Rule(lambda v: v >= 0, "at least 0"),
    "param_rules[].pattern": REGEX,
    "param_rules[].lr_multiplier": Rule(lambda v: v >= 0, "at least 0 (0 = frozen)"),
    "max_skipped_steps": NON_NEGATIVE,
    "max_skipped_in_a_row": POSITIVE,
    "max_skipped_share": FRACTION,
    "seed": NON_NEGATIVE,
    "log_every": POSITIVE,
    "eval_every": Rule(lambda v: v >= 0, "at least 0 (0 = only at the end)"),
    "eval_batches": Rule(lambda v: v >= 0, "at least 0 (0 = the whole validation split)"),
    "checkpoint_every": Rule(lambda v: v >= 0, "at least 0 (0 = only at the end)"),
    "keep_checkpoints": POSITIVE,
    "keep_steps": Rule(lambda v: all(s >= 1 for s in v), "steps of at least 1, e.g. [200, 400]"),
    "init_step": POSITIVE,
    "peak_flops": above(0),
    "out_dir": NON_EMPTY,
    "trackers": Rule(lambda v: len(set(v)) == len(v), "each tracker at most once, e.g. [tensorboard]"),
}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh: batch over data x fsdp, parameters fully sharded over fsdp and split over tensor."""

    data: int = -1  # -1: every device not used by the other axes
    fsdp: int = 1
    tensor: int = 1
    # the hardware the recipe's paper trained on, as a target (ssmlm.targets: `--dry-run --target paper` compiles
    # for it) and in the paper's words with its section
    paper_target: str = ""
    paper_hardware: str = ""


# mesh.<axis> -> its allowed values
MESH_RANGES: dict[str, Rule] = {"data": MESH_AXIS, "fsdp": MESH_AXIS, "tensor": MESH_AXIS}
