"""The budgets that end a run: steps, tokens, seconds, epochs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from thrifty.records.state import TrainState
from thrifty.records.stop import StopReason

if TYPE_CHECKING:
    from thrifty.config import RunConfig


@dataclass(frozen=True)
class Budget:
    """Limits on a run; the first one reached (steps, tokens, seconds) names the stop reason."""

    max_steps: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None
    epoch_steps: int | None = None  # run.max_epochs × the steps of an epoch

    @classmethod
    def of(cls, run: RunConfig, steps_per_epoch: int | None) -> Budget:
        """`steps_per_epoch` is None for data of unknown length (refused with max_epochs)."""
        epochs = run.max_epochs * steps_per_epoch if run.max_epochs and steps_per_epoch else None
        return cls(run.max_steps, run.max_tokens, run.max_seconds, epochs)

    def out_of_time(self, seconds: float) -> bool:
        return self.max_seconds is not None and seconds >= self.max_seconds

    def exceeded(self, steps: int, tokens: int, seconds: float) -> StopReason | None:
        """The limit reached, if any. Checked once per step, so the limits are tried in
        `StopReason`'s order (steps, tokens, seconds) and the first one reached is returned,
        rather than collected for `StopReason.decide`."""
        if self.max_steps is not None and steps >= self.max_steps:
            return StopReason.MAX_STEPS
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return StopReason.MAX_TOKENS
        if self.max_seconds is not None and seconds >= self.max_seconds:
            return StopReason.MAX_TIME
        return None

    def fraction_done(self, progress: TrainState) -> float | None:
        """How much of the budget is spent (the largest share of any limit), for the live
        projection of the run's cost; None before anything is spent or with no limit."""
        s = progress
        parts = [
            s.step / self.max_steps if self.max_steps else 0.0,
            s.tokens / self.max_tokens if self.max_tokens else 0.0,
            s.seconds / self.max_seconds if self.max_seconds else 0.0,
            s.step / self.epoch_steps if self.epoch_steps else 0.0,
        ]
        return min(1.0, max(parts)) or None

    def end_step(self, progress: TrainState) -> int | None:
        """The step the budget ends at: max_steps, else the epochs' steps, else a projection
        from the share of a token or time budget used so far."""
        if self.max_steps is not None:
            return self.max_steps
        if self.epoch_steps is not None:
            return self.epoch_steps
        done = max(
            progress.tokens / self.max_tokens if self.max_tokens else 0.0,
            progress.seconds / self.max_seconds if self.max_seconds else 0.0,
        )
        return int(progress.step / done) if done > 0 else None
