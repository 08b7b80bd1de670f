"""A controller that steers the batches while training runs (Birdie's objective mixture), and when its updates
take effect: ``ControllerTimeline``, the controller state in effect at each step, saved in every checkpoint.

An update made after step s applies to the batches of steps >= s + CONTROL_LAG. The lag is the prefetch depth,
so batches already being read never change, and it is a constant, so a resumed run applies every update at the
same step as an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ssmlm.train.threads import PREFETCH_DEPTH

CONTROL_LAG = PREFETCH_DEPTH


class Controller(Protocol):
    """Steers the batches while training runs. Its state is a pytree of arrays (saved in checkpoints)."""

    def init_state(self) -> Any: ...

    def update(self, state: Any, step: int, eval_metrics: dict[str, float]) -> Any:
        """The new state after the evaluation at ``step``; it applies from step + CONTROL_LAG on."""
        ...

    # optional: ``record(state) -> dict`` of JSON values, logged to metrics.jsonl (split "controller") for the
    # initial state and after every update; ``update_label``: what the bar says while ``update`` runs


@dataclass
class ControllerTimeline:
    """The controller state in effect at each step: ``current`` up to ``pending_from`` - 1, then ``pending``."""

    current: Any
    pending: Any
    pending_from: int

    def at(self, step: int):
        return self.pending if step >= self.pending_from else self.current

    def advance(self, step: int) -> None:
        if step >= self.pending_from:
            self.current = self.pending

    def set(self, state, from_step: int) -> None:
        self.current, self.pending, self.pending_from = self.at(from_step - 1), state, from_step

    def to_tree(self) -> dict:
        start = np.asarray(self.pending_from, np.int64)
        return {"current": self.current, "pending": self.pending, "pending_from": start}

    @classmethod
    def from_tree(cls, tree: dict) -> ControllerTimeline:
        return cls(tree["current"], tree["pending"], int(tree["pending_from"]))
