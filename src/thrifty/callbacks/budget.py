"""The budget as a callback: a run ends at step, token or time limits (`run.max_*`).

Every rank's clock is asked at each step (`vote`): the ranks' seconds differ a little, and one
whose clock ran out first ends every rank at the same step, on the step's one agreement.
"""

from __future__ import annotations

from typing import Any

from thrifty.callbacks.base import Callback, StepEnd
from thrifty.records.budget import Budget
from thrifty.records.state import TrainState
from thrifty.records.stop import StopReason


class BudgetCheck(Callback):
    """Ends the run with MAX_STEPS, MAX_TOKENS or MAX_TIME once a limit is reached."""

    votes = 1

    def __init__(self, budget: Budget, progress: TrainState, ranks: int) -> None:
        self.budget, self.progress, self.ranks = budget, progress, ranks
        self.run: Any = None  # the Trainer: its `clock` starts with the loop

    def on_fit_start(self, run: Any) -> None:
        self.run = run

    def vote(self, step: int) -> list[int]:
        if self.ranks == 1:  # the budget's own check of the step's seconds is enough
            return [0]
        return [int(self.budget.out_of_time(self.run.clock.seconds()))]

    def on_step_end(self, step_info: StepEnd) -> None:
        s = self.progress
        step_info.end(self.budget.exceeded(s.step, s.tokens, s.seconds))
        if self.ranks > 1 and step_info.votes[0]:  # another rank's clock ran out first
            step_info.end(StopReason.MAX_TIME)
