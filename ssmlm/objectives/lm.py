"""Language-model pre-training on packed Birdie objective rows (docs/faithfulness.md#birdie-objectives, #birdie-layout).

``LMObjective`` builds every row on the fly from a document split (``ssmlm.data.shards.TokenDocuments`` or
anything with ``len`` and ``docs[i] -> int array``) with ``birdie.pipeline.make_row``. Row r of step s is a
pure function of (seed, s, r) (``mlm.row_keys``) and of the mixture's probabilities, so a resumed run sees
the same batches; validation row i is a function of (seed, VALIDATION, i), drawn from the mixture's initial
probabilities (a fixed set whatever a controller does).

Batch: tokens, segment_ids, positions, token_types (1 prefix, 3 START + target, 0 padding) and
targets (B, L) = the next label at each slot with loss_weights 1 on the target part; target_positions None.
The model is called as ``model(tokens, segment_ids=, token_types=, positions=, rng=)`` -> logits (B, L, V).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ssmlm.objectives.batch import Batch, make_batch
from ssmlm.objectives.birdie.functions import Ids
from ssmlm.objectives.birdie.mixtures import DYNAMIC, uniform_action
from ssmlm.objectives.birdie.mixtures import mixture as named_mixture
from ssmlm.objectives.birdie.pipeline import make_batch_rows
from ssmlm.objectives.losses import cross_entropy
from ssmlm.objectives.mlm import row_keys

_TRAIN, _VALIDATION, _CONFIG_VALIDATION, _FEASIBLE = 4, 5, 6, 7  # key domains (mlm.py uses 1-3)


class LMObjective:
    """Packed-row LM objective over a named mixture (``birdie.mixtures.MIXTURES``).

    ``LMObjective(cfg, reserved, docs_train, docs_val, seq_len, seed, mixture=None, paradigm=None,
    spacing=None, batch_size=None, min_space=None)``: ``reserved`` is the {token string: id} dict of
    ``ssmlm.data.reserved.reserved_ids``; each of mixture ("birdie"), paradigm ("start"), spacing (0),
    batch_size (8) and min_space (32) falls back to the same-named attribute of ``cfg`` (may be None), then
    to the default in brackets. ``config_rows``: validation rows per configuration (what a controller learns
    from; 0: none). A dynamic mixture keeps only the configurations that fit a row of ``seq_len``.
    """

    name = "lm"

    def __init__(
        self,
        cfg,
        reserved: dict[str, int],
        docs_train,
        docs_val,
        seq_len: int,
        seed: int,
        mixture: str | None = None,
        paradigm: str | None = None,
        spacing: int | None = None,
        batch_size: int | None = None,
        min_space: int | None = None,
        rows: tuple[int, int] | None = None,
        config_rows: int = 0,
    ):
        def pick(value, field, default):
            return value if value is not None else getattr(cfg, field, None) or default

        self.cfg, self.seed, self.seq_len = cfg, seed, seq_len
        self.ids = Ids.from_reserved(reserved)
        self.docs_train, self.docs_val = docs_train, docs_val
        self.mixture = pick(mixture, "mixture", "birdie")
        self.paradigm = pick(paradigm, "paradigm", "start")
        self.spacing = int(pick(spacing, "spacing", 0))
        self.batch_size = int(pick(batch_size, "batch_size", 8))
        self.min_space = int(pick(min_space, "min_space", 32))
        self.configs, self.probs = named_mixture(self.mixture)
        self.dropped: list[str] = []
        if self.mixture in DYNAMIC:
            self._keep_feasible()
        # which rows of every global batch this process builds (multi-host: each process its own share)
        self.rows = np.arange(*(rows or (0, self.batch_size)))
        self.config_rows = int(config_rows)  # validation rows per configuration (0: none)
        self._eval_cache: dict[int, list[Batch]] = {}
        self._layout: np.ndarray | None = None  # configuration of every validation row (−1: mixture rows)

    def _keep_feasible(self) -> None:
        """Drop the configurations that cannot make a sample in a row of this length (e.g. the grid's
        1024-2048-token infilling bucket at L = 256): a controller would get no loss to learn from for them.
        A configuration is kept when one of 4 rows made of it alone on the training documents holds a target."""
        keep = []
        for i, _ in enumerate(self.configs):
            probs = np.eye(len(self.configs))[i]
            keys = row_keys(self.seed, _FEASIBLE, i, np.arange(4))
            if self._rows(self.docs_train, keys, probs)["loss_weights"].sum() > 0:
                keep.append(i)
        if not keep:
            raise ValueError(f"no configuration of mixture {self.mixture!r} fits a row of {self.seq_len} tokens")
        self.dropped = [self.configs[i].name for i in range(len(self.configs)) if i not in keep]
        self.configs = [self.configs[i] for i in keep]
        self.probs = uniform_action(self.configs)  # the birdie mixture's start, over what is left

    # -- rows and batches
    def _rows(self, docs, keys, probs) -> dict:
        return make_batch_rows(
            docs, self.configs, probs, self.seq_len, keys, self.ids, self.paradigm, self.spacing, self.min_space
        )

    def train_rows(self, step: int, state=None) -> dict:
        """The step's rows as ``make_batch_rows`` arrays (with ``config``/``sample_configs``). ``state``: an
        optional probability vector over ``self.configs`` replacing the mixture's."""
        probs = self.probs if state is None else np.asarray(state, float)
        if probs.shape != self.probs.shape:
            raise ValueError(f"state: {probs.shape} probabilities for {len(self.configs)} configurations")
        keys = row_keys(self.seed, _TRAIN, step, self.rows)
        return self._rows(self.docs_train, keys, probs)

    def train_batch(self, step: int, state=None) -> Batch:
        return to_batch(self.train_rows(step, state))

    def eval_rows(self, i: int) -> dict:
        keys = row_keys(self.seed, _VALIDATION, i * self.batch_size + np.arange(self.batch_size))
        return self._rows(self.docs_val, keys, self.probs)

    def config_eval_rows(self, c: int) -> dict:
        """``config_rows`` validation rows made of configuration ``c`` alone (Birdie's fixed validation set
        per configuration, docs/faithfulness.md#birdie-controller)."""
        keys = row_keys(self.seed, _CONFIG_VALIDATION, c, np.arange(self.config_rows))
        return self._rows(self.docs_val, keys, np.eye(len(self.configs))[c])

    def eval_batches(self, n_batches: int) -> list[Batch]:
        """The fixed validation set (built once, then reused): batches 0..n_batches-1 of the mixture, then,
        with ``config_rows``, that many rows per configuration packed into batches (the last one padded with
        empty rows), which ``score`` turns into ``config_loss_<i>``."""
        if n_batches not in self._eval_cache:
            batches = [to_batch(self.eval_rows(i)) for i in range(n_batches)]
            layout = [-1] * (n_batches * self.batch_size)
            if self.config_rows:
                rows = [self.config_eval_rows(c) for c in range(len(self.configs))]
                stacked = {k: np.concatenate([r[k] for r in rows]) for k in rows[0] if k != "sample_configs"}
                layout += [c for c in range(len(self.configs)) for _ in range(self.config_rows)]
                n = len(stacked["tokens"])
                for lo in range(0, n, self.batch_size):
                    part = {k: v[lo : lo + self.batch_size] for k, v in stacked.items()}
                    short = self.batch_size - len(part["tokens"])
                    if short:  # empty rows: padding everywhere, no loss
                        part = {
                            k: np.concatenate([v, np.zeros((short, *v.shape[1:]), v.dtype)]) for k, v in part.items()
                        }
                        layout += [-2] * short
                    batches.append(to_batch(part))
            self._eval_cache[n_batches] = batches
            self._layout = np.asarray(layout)
        return self._eval_cache[n_batches]

    # -- loss and evaluation
    @staticmethod
    def loss(model, batch: Batch, rng):
        logits = lm_logits(model, batch, rng)
        nll, count = cross_entropy(logits, batch.targets, batch.loss_weights)
        count = jnp.maximum(count, 1.0)
        return nll / count, {"weight": count}

    @staticmethod
    def eval(model, batch: Batch):
        """Per-row sums (so the score can group rows by configuration)."""
        logits = lm_logits(model, batch, None)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        nll = -jnp.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0]
        w = batch.loss_weights
        correct = (logits.argmax(-1) == batch.targets) * w
        return {"nll": (nll * w).sum(-1), "count": w.sum(-1), "correct": correct.sum(-1)}

    def score(self, outputs: list[dict], batches=None) -> dict[str, float]:
        """lm_loss / lm_accuracy / perplexity / target_tokens over the mixture's validation rows, and
        ``config_loss_<i>`` (mean target-token loss of configuration i's rows) when they were evaluated."""
        cat = {k: np.concatenate([np.asarray(o[k], np.float64) for o in outputs]) for k in ("nll", "count", "correct")}
        layout = self._layout if self._layout is not None and len(self._layout) == len(cat["nll"]) else None
        mix = layout == -1 if layout is not None else np.ones(len(cat["nll"]), bool)
        count = cat["count"][mix].sum()
        loss = cat["nll"][mix].sum() / max(count, 1.0)
        out = {
            "lm_loss": loss,
            "lm_accuracy": cat["correct"][mix].sum() / max(count, 1.0),
            "perplexity": float(np.exp(min(loss, 50))),
            "target_tokens": count,
        }
        if layout is not None and (layout >= 0).any():
            for c in range(len(self.configs)):
                rows = layout == c
                out[f"config_loss_{c}"] = cat["nll"][rows].sum() / max(cat["count"][rows].sum(), 1.0)
        return {k: float(v) for k, v in out.items()}


def lm_logits(model, batch: Batch, rng):
    return model(
        batch.tokens, segment_ids=batch.segment_ids, token_types=batch.token_types, positions=batch.positions, rng=rng
    )


def to_batch(rows: dict) -> Batch:
    return make_batch(
        rows["tokens"],
        rows["targets"],
        rows["loss_weights"],
        segment_ids=rows["segment_ids"],
        positions=rows["positions"],
        token_types=rows["token_types"],
    )
