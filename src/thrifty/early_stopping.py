"""Early stopping on the validation loss, and the budgets that end a run."""

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


@dataclass(frozen=True)
class Budget:
    """Limits on a run; the first one reached names the stop reason."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None

    def out_of_time(self, seconds: float) -> bool:
        return self.max_seconds is not None and seconds >= self.max_seconds

    def exceeded(self, steps: int, tokens: int, seconds: float) -> str | None:
        if self.max_steps is not None and steps >= self.max_steps:
            return "max_steps"
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return "max_tokens"
        if self.max_seconds is not None and seconds >= self.max_seconds:
            return "max_time"
        return None
