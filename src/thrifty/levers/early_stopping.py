"""Early stopping on the validation loss."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EarlyStopping:
    """Stop after `patience` evaluations without an improvement of more than `min_delta`.

    Lower is better. `patience = 0` never stops. Its state travels with checkpoints.
    """

    patience: int = 0
    min_delta: float = 0.0
    best: float = math.inf
    bad_evaluations: int = 0
    history: list[float] = field(default_factory=list)

    def update(self, value: float) -> bool:
        """Record one evaluation; True when training should stop."""
        self.history.append(value)
        if value < self.best - self.min_delta:
            self.best = value
            self.bad_evaluations = 0
        else:
            self.bad_evaluations += 1
        return self.patience > 0 and self.bad_evaluations >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "bad_evaluations": self.bad_evaluations,
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = float(state["best"])
        self.bad_evaluations = int(state["bad_evaluations"])
        self.history = [float(v) for v in state["history"]]
