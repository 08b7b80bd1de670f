"""Birdie's dynamic mixture: reward, reward-model training and greedy action choice (paper 3.3, A.1; the official
code's rules where the paper is silent: docs/faithfulness.md#birdie-controller).

An action a ∈ Δⁿ⁻¹ is the per-sample sampling distribution over the n objective configurations. At every
evaluation the controller receives the per-configuration validation losses ℓ and

1. rewards the action taken since the previous evaluation, per configuration (``reward``);
2. appends the row [ℓ_old ‖ a_taken] → R to the history and trains ("groks") the reward model on all of it for a
   fixed number of AdamW steps with multiplicative noise (as the official v1 code);
3. once control has started (paper A.1.4: step 250), either explores (official code) or scores random proposals
   p by the model's prediction at history ‖ [ℓ ‖ p], balances classes (r̂_i / |class(i)|, summed) and takes the
   mean of the top 8. Before that, the action stays the start action (paper: uniform).

Everything random is drawn from a generator keyed by (seed, evaluation index, purpose), so the controller keeps
no RNG state: the same state and losses always give the same new state, and a restored checkpoint continues
exactly as an uninterrupted run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ssmlm.errors import UserError
from ssmlm.models.reward_model import RewardModel
from ssmlm.objectives.birdie.mixtures import Config, initial_action, uniform_action
from ssmlm.objectives.config import ControllerSettings, check_controller

# ---------------------------------------------------------------------------------------------------- reward


def reward(old, new) -> np.ndarray:
    """Per-configuration reward of going from losses ``old`` to ``new`` (the official code's sign):

        ΔL = (new − old)/(old + 1e-8),   S = √(old·new),   R = clip(−100·e·tanh(e·S·ΔL³), −1, 1),   NaN → 0.

    A loss decrease gives a positive reward; the cube squashes tiny changes (3.0 → 2.99: 8e-5)."""
    old = np.asarray(old, np.float64)
    new = np.asarray(new, np.float64)
    with np.errstate(all="ignore"):
        dl = (new - old) / (old + 1e-8)
        s = np.sqrt(old * new)
        r = np.clip(-100.0 * np.e * np.tanh(np.e * s * dl**3), -1.0, 1.0)
    return np.where(np.isnan(r), 0.0, r)


# ---------------------------------------------------------------------------------------------------- schedule

PAPER_EVALS = (10, 50, 250, 500, 1000, 1500, 2000)  # A.1.4, then every 1000 steps
PAPER_CONTROL_FROM = 250  # A.1.4: uniform sampling until here; Birdie takes permanent control at this evaluation


def _scaled(step: float, scale: float) -> int:
    return max(1, math.floor(step * scale + 0.5))


def paper_eval_steps(total_steps: int, scale: float = 1.0) -> list[int]:
    """The paper's evaluation steps (A.1.4): 10, 50, 250, 500, 1000, 1500, 2000, then every 1000, each times
    ``scale`` (rounded half up, at least 1), deduplicated, strictly below ``total_steps``."""
    if not scale > 0:
        raise UserError(f"controller eval_scale = {scale}: expected a number > 0")
    out: list[int] = []
    for base in itertools.chain(PAPER_EVALS, itertools.count(3000, 1000)):
        step = _scaled(base, scale)
        if step >= total_steps:
            break
        if not out or step != out[-1]:
            out.append(step)
    return out


def control_from(scale: float = 1.0) -> int:
    """First step at which the controller chooses actions: round(250·scale), at least 1 (the scaled 250th-step
    evaluation). Evaluations before it only gather reward-model data."""
    return _scaled(PAPER_CONTROL_FROM, scale)


def explore_probability(
    step: float,
    n_steps: float,
    *,
    decay: float = 0.5,
    warmup: float = 0.1,
    cook: float = 0.05,
    p_min: float = 0.2,
    p_max: float = 0.5,
    cook_prob: float = 1.0,
) -> float:
    """p_explore at training step ``step`` (the official v2 code's semantics and defaults; decay, warmup and cook are
    fractions of ``n_steps``): ``cook_prob`` before the cook period ends, ``p_max`` until warmup, then a cosine from
    p_max down to p_min reached at decay·N − 1, p_min afterwards."""
    total, w, c = decay * n_steps, warmup * n_steps, cook * n_steps
    if step < c:
        return float(cook_prob)
    if step < w:
        return float(p_max)
    span = total - 1 - w
    if span <= 0:
        return float(p_min)
    s = min(max(step - w, 0.0), span)
    return float(p_min + (p_max - p_min) / 2 * (1 + math.cos(math.pi * s / span)))


# purposes of the keyed generators: one independent stream per (seed, evaluation, purpose)
_EXPLORE, _EXPLORE_ACTION, _PROPOSALS, _GROK = range(4)


def keyed_rng(seed: int, index: int, purpose: int) -> np.random.Generator:
    """A generator that depends only on (seed, evaluation index, purpose): no RNG state to checkpoint."""
    return np.random.default_rng([seed % 2**63, index, purpose])


# ---------------------------------------------------------------------------------------------------- actions


def _class_index(classes: Sequence[str]) -> dict[str, np.ndarray]:
    """Class name -> indices of its configurations, in order of first appearance."""
    arr = np.asarray(classes)
    return {c: np.flatnonzero(arr == c) for c in dict.fromkeys(classes)}


def class_weights(classes: Sequence[str]) -> np.ndarray:
    """1/|class(i)| per configuration: weighting per-configuration rewards by it makes every class count equally
    (as the official code ranks proposals; its extra factor "number of classes" is a constant and left out)."""
    sizes = {c: len(i) for c, i in _class_index(classes).items()}
    return np.array([1.0 / sizes[c] for c in classes])


def _clean(losses) -> np.ndarray:
    """Losses as float32 with non-finite values as 0 (a NaN must not poison the reward model's input)."""
    x = np.asarray(losses, np.float32)
    return np.where(np.isfinite(x), x, np.float32(0.0))


def exploration_action(classes: Sequence[str], losses, rng: np.random.Generator, style: str = "v1") -> np.ndarray:
    """An exploratory action (official code): k ∈ {1, 2} classes drawn with replacement; the configurations of each
    drawn class get random weights summing to 1 within it (a class drawn twice gets both draws); every
    configuration of an undrawn class gets a small mass, v1: ℓ_i·n/(n−k)·0.01·k/|class|, v2: n/(n−k)·0.005·k/|class|.
    v1 then multiplies the whole vector by ℓ (favouring high-loss configurations). Normalised to sum 1."""
    if style not in ("v1", "v2"):
        raise UserError(f"controller explore_style = {style!r}: expected 'v1' or 'v2'")
    index = _class_index(classes)
    names = list(index)
    n = len(classes)
    loss = _clean(losses).astype(np.float64)
    k = int(rng.integers(1, 3))
    chosen = [names[i] for i in rng.integers(0, len(names), size=k)]
    a = np.zeros(n)
    for c in chosen:
        w = rng.uniform(size=len(index[c]))
        a[index[c]] += w / w.sum()
    for c in names:
        if c in chosen:
            continue
        idx = index[c]
        small = n / max(n - k, 1) * k / len(idx)  # n − k = 0 only for a 2-config toy with k = 2
        a[idx] = loss[idx] * 0.01 * small if style == "v1" else 0.005 * small
    if style == "v1":
        a = a * loss
    total = a.sum()
    return a / total if total > 0 else np.full(n, 1.0 / n)


PARETO_POOLS = ((5.0, 3.0), (3.0, 2.0), (2.0, 1.0))  # v2's (scale, α); the scale cancels in normalisation


def propose(n: int, count: int, rng: np.random.Generator, pools: str = "uniform") -> np.ndarray:
    """Random candidate actions, rows summing to 1: ``count`` i.i.d. uniform vectors (paper:
    2,048); ``pools="pareto"`` adds ``count`` rows from each of v2's Pareto(5, 3), Pareto(3, 2) and Pareto(2, 1)
    pools (heavier-tailed, more peaked mixtures). v1's un-normalised 4th powers are not reproduced."""
    if pools not in ("uniform", "pareto"):
        raise UserError(f"controller pools = {pools!r}: expected 'uniform' or 'pareto'")
    rows = [rng.uniform(size=(count, n))]
    if pools == "pareto":
        rows += [scale * (1.0 + rng.pareto(alpha, size=(count, n))) for scale, alpha in PARETO_POOLS]
    p = np.concatenate(rows)
    return p / p.sum(axis=1, keepdims=True)


def candidate_rows(losses, proposals) -> np.ndarray:
    """(P, 2n) reward-model rows [ℓ ‖ p] (v1's loss-first order), one per proposal."""
    proposals = np.asarray(proposals, np.float32)
    loss = np.broadcast_to(_clean(losses), proposals.shape)
    return np.concatenate([loss, proposals], axis=1)


def top_mean(proposals, scores, top_n: int = 8) -> np.ndarray:
    """Mean of the ``top_n`` best-scoring proposals (ties: the earlier one), renormalised."""
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")[:top_n]
    a = np.asarray(proposals, np.float64)[order].mean(axis=0)
    return a / a.sum()


def choose_action(
    model: RewardModel, history, losses, proposals, classes: Sequence[str], top_n: int = 8, length=None
) -> tuple[np.ndarray, np.ndarray]:
    """(action, per-proposal scores): each proposal p is scored by the model's output at the last position of
    history ‖ [ℓ ‖ p] (``RewardModel.score_last``; ``length``: rows of a padded history that count), weighted by
    1/|class(i)| and summed; the action is the renormalised mean of the ``top_n`` best proposals."""
    history = jnp.asarray(history, jnp.float32)
    pred = model.score_last(history, jnp.asarray(candidate_rows(losses, proposals)), length)
    scores = np.asarray(pred, np.float64) @ class_weights(classes)
    return top_mean(proposals, scores, top_n), scores


# ---------------------------------------------------------------------------------------------------- controller


def cyclic_lr(cfg: ControllerSettings) -> optax.Schedule:
    """torch CyclicLR(mode="exp_range", gamma=1) = triangular: lr·cycle_base at iteration 0, lr at cycle_up,
    back down at 2·cycle_up, repeating. The iteration count persists across evaluations (nothing is reset)."""
    base, peak, up = cfg.learning_rate * cfg.cycle_base, cfg.learning_rate, cfg.cycle_up

    def schedule(count):
        pos = jnp.asarray(count, jnp.float32) / up
        cycle = jnp.floor(1 + pos / 2)
        return base + (peak - base) * jnp.maximum(0.0, 1 - jnp.abs(pos - 2 * cycle + 1))

    return schedule


class BirdieController:
    """Birdie's objective-mixture controller (the training loop's ``Controller`` protocol). Its state is a nested
    dict of arrays with fixed shapes (``init_state``), so ``jax.eval_shape(init_state)`` is a restore target."""

    update_label = "controller update (reward model)"  # what the training bar says while ``update`` runs

    def __init__(
        self, configs: list[Config], total_steps: int, seed: int, cfg: ControllerSettings = ControllerSettings()
    ):
        check_controller(cfg)
        if not configs:
            raise UserError("Birdie controller: expected at least one objective configuration")
        self.configs = list(configs)
        self.classes = [c.cls for c in self.configs]
        self.class_index = _class_index(self.classes)
        self.weights = class_weights(self.classes)
        self.n = n = len(self.configs)
        self.total_steps = int(total_steps)
        self.seed = int(seed)
        self.cfg = cfg
        self.control_from = control_from(cfg.eval_scale)
        self.start = uniform_action(self.configs) if cfg.start == "uniform" else initial_action(self.configs)
        model = RewardModel(n, cfg.width, cfg.state_size, cfg.layers, rngs=nnx.Rngs(self.seed % 2**31))
        self.graphdef, params = nnx.split(model)
        self._params0 = [np.asarray(p) for p in jax.tree.leaves(params)]
        self._params_def = jax.tree.structure(params)
        self.tx = optax.chain(
            optax.clip_by_global_norm(cfg.clip), optax.adamw(cyclic_lr(cfg), weight_decay=cfg.weight_decay)
        )
        opt = self.tx.init(params)
        self._opt_def = jax.tree.structure(opt)
        self._opt0 = [np.asarray(o) for o in jax.tree.leaves(opt)]
        # one compile per history bucket (bucket()), not per history length
        self._grok = jax.jit(self._grok_impl)
        self._score = jax.jit(self._score_impl)

    # ------------------------------------------------------------------ state

    def init_state(self) -> dict:
        n, h = self.n, self.cfg.max_history
        return {  # numpy constants only, so jax.eval_shape(init_state) works (the checkpoint restore target)
            "action": self.start.astype(np.float32),
            "params": [p.copy() for p in self._params0],
            "opt": [o.copy() for o in self._opt0],
            "x": np.zeros((h, 2 * n), np.float32),
            "y": np.zeros((h, n), np.float32),
            "t": np.asarray(0, np.int32),
            "last_loss": np.zeros(n, np.float32),
            "evals": np.asarray(0, np.int32),
            "last_reward": np.zeros(n, np.float32),
            "explored": np.asarray(0, np.int32),
        }

    def eval_steps(self) -> list[int]:
        return paper_eval_steps(self.total_steps, self.cfg.eval_scale)

    def action(self, state) -> np.ndarray:
        """(n,) float64 sampling distribution over the configurations (sums to 1)."""
        a = np.asarray(state["action"], np.float64)
        return a / a.sum()

    def record(self, state) -> dict[str, float]:
        """Per-class share of the action, per-class mean of the last reward, and whether this choice explored."""
        a, r = self.action(state), np.asarray(state["last_reward"], np.float64)
        out = {}
        for c, idx in self.class_index.items():
            out[f"share/{c}"] = float(a[idx].sum())
            out[f"reward/{c}"] = float(r[idx].mean())
        out["explored"] = float(np.asarray(state["explored"]))
        return out

    # ------------------------------------------------------------------ update

    def losses(self, eval_metrics: dict) -> np.ndarray:
        """(n,) float32 per-configuration validation losses from ``config_loss_<i>``."""
        for i in range(self.n):
            if f"config_loss_{i}" not in eval_metrics:
                raise ValueError(f"Birdie controller: evaluation metrics lack 'config_loss_{i}' (keys 0..{self.n - 1})")
        return np.array([float(np.asarray(eval_metrics[f"config_loss_{i}"])) for i in range(self.n)], np.float32)

    def update(self, state, step: int, eval_metrics: dict) -> dict:
        """The state after the evaluation at ``step`` (the input state is not modified)."""
        losses = self.losses(eval_metrics)
        evals = int(np.asarray(state["evals"]))
        new = dict(state)
        new["evals"] = np.asarray(evals + 1, np.int32)
        new["last_loss"] = losses
        new["explored"] = np.asarray(0, np.int32)
        if evals == 0:  # the first evaluation only records the baseline
            new["last_reward"] = np.zeros(self.n, np.float32)
            return new
        old = np.asarray(state["last_loss"], np.float32)
        r = reward(old, losses).astype(np.float32)
        row = np.concatenate([_clean(old), np.asarray(state["action"], np.float32)])
        x, y, t = self._append(state, row, r)
        grok_seed = np.asarray(keyed_rng(self.seed, evals, _GROK).integers(2**31), np.uint32)
        b = self.bucket(t)
        params, opt = self._grok(
            list(state["params"]), list(state["opt"]), x[:b], y[:b], np.asarray(t, np.int32), grok_seed
        )
        new.update(
            x=x,
            y=y,
            t=np.asarray(t, np.int32),
            last_reward=r,
            params=[np.asarray(p) for p in params],
            opt=[np.asarray(o) for o in opt],
        )
        if step < self.control_from:
            new["action"] = self.start.astype(np.float32)
            return new
        cfg = self.cfg
        n_steps = cfg.explore_steps or self.total_steps
        p_explore = explore_probability(
            step,
            n_steps,
            decay=cfg.explore_decay,
            warmup=cfg.explore_warmup,
            cook=cfg.explore_cook,
            p_min=cfg.explore_min,
            p_max=cfg.explore_max,
        )
        if cfg.explore and keyed_rng(self.seed, evals, _EXPLORE).uniform() < p_explore:
            # v1: the proposal set becomes copies of the exploration action, so it is the action taken
            rng = keyed_rng(self.seed, evals, _EXPLORE_ACTION)
            action = exploration_action(self.classes, losses, rng, cfg.explore_style)
            new["explored"] = np.asarray(1, np.int32)
        else:
            proposals = propose(self.n, cfg.proposals, keyed_rng(self.seed, evals, _PROPOSALS), cfg.pools)
            cand = candidate_rows(losses, proposals)
            pred = self._score(new["params"], x[: self.bucket(t)], np.asarray(t, np.int32), cand)
            action = top_mean(proposals, np.asarray(pred, np.float64) @ self.weights, cfg.top_n)
        new["action"] = action.astype(np.float32)
        return new

    def bucket(self, t: int) -> int:
        """Rows of the padded history the reward model runs on: the smallest power of two >= t (at least 8),
        at most max_history. The state always holds max_history rows, but running all of them would cost ~7x
        more than needed for the paper's ~35 evaluations; rows past t never reach a counted row (the recurrence is
        causal and the MSE masked), and one compile per power of two is at most 6 compiles per run."""
        return min(self.cfg.max_history, max(8, 1 << max(t - 1, 0).bit_length()))

    def _append(self, state, row, r):
        """History with one more row (the oldest dropped once max_history rows are held)."""
        x, y, t = np.array(state["x"], np.float32), np.array(state["y"], np.float32), int(np.asarray(state["t"]))
        if t == len(x):
            x, y, t = np.roll(x, -1, axis=0), np.roll(y, -1, axis=0), t - 1
        x[t], y[t] = row, r
        return x, y, t + 1

    def _model(self, params_leaves) -> RewardModel:
        return nnx.merge(self.graphdef, jax.tree.unflatten(self._params_def, params_leaves))

    def _score_impl(self, params_leaves, x, t, candidates):
        return self._model(params_leaves).score_last(x, candidates, t)

    def _grok_impl(self, params_leaves, opt_leaves, x, y, t, seed):
        """``grok_iterations`` AdamW steps on the masked MSE between model(X)[:t] and Y[:t], with X and Y each
        multiplied by fresh U[1 − noise, 1 + noise] noise at every iteration (v1)."""
        cfg = self.cfg
        params = jax.tree.unflatten(self._params_def, params_leaves)
        opt = jax.tree.unflatten(self._opt_def, opt_leaves)
        mask = (jnp.arange(x.shape[0]) < t)[:, None]
        denom = jnp.maximum(t, 1).astype(jnp.float32) * self.n
        key = jax.random.key(seed)

        def mse(p, xn, yn):
            pred = nnx.merge(self.graphdef, p)(xn[None])[0]
            return jnp.sum(jnp.where(mask, (pred - yn) ** 2, 0.0)) / denom

        def body(i, carry):
            p, o = carry
            kx, ky = jax.random.split(jax.random.fold_in(key, i))
            lo, hi = 1.0 - cfg.noise, 1.0 + cfg.noise
            xn = x * jax.random.uniform(kx, x.shape, minval=lo, maxval=hi)
            yn = y * jax.random.uniform(ky, y.shape, minval=lo, maxval=hi)
            grads = jax.grad(mse)(p, xn, yn)
            updates, o = self.tx.update(grads, o, p)
            return optax.apply_updates(p, updates), o

        params, opt = jax.lax.fori_loop(0, cfg.grok_iterations, body, (params, opt))
        return jax.tree.leaves(params), jax.tree.leaves(opt)
