"""The callback protocol: one overridable method per moment of a run, each a no-op by default.

Events, in the order a run meets them:

- `on_fit_start(run)`: the run directory is open (a resumed run's checkpoint loaded), before
  the evaluation at step 0 and the first step. `run` is the Trainer.
- `vote(step)`: during step `step`, once backward is done: the `votes` integers this rank
  contributes; they are summed over the ranks on the step's one agreement (no collective of
  their own) and handed back in `StepEnd.votes`.
- `on_evaluation_end(step, val_loss)`: a validation loss was measured, before early stopping
  and the forecast judge it; return a reason (one line) to stop the run after this evaluation.
- `on_save(step, location)`: on rank 0, the checkpoint of `step` is written to `location`,
  its local folder; on the other ranks (`location` None), their part is handed over.
- `on_step_end(step_info)`: after thrifty's own work at the step's boundary (the budget, the
  evaluation, the guard, the save due), before the step's record is buffered for
  metrics.jsonl.
- `on_stop(step, reason)`: the loop ended at `step` with `reason` (a `StopReason` word),
  before the final checkpoint.
- `on_fit_end(result)`: the run's outputs are written; `result` is the `FitResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from thrifty.records.stop import StopReason

if TYPE_CHECKING:
    from thrifty.records.state import FitResult


@dataclass(slots=True)
class StepEnd:
    """What a callback sees as optimizer step `step` ends, and how it answers.

    `record` is the step's record as metrics.jsonl will hold it: add plain numbers under new
    keys (`record["my_figure"] = 1.23`). Its `loss` and `grad_norm` are device tensors until
    the next flush: reading them forces a host sync. `votes` are this callback's `vote(step)`
    integers summed over the ranks (with one process, its own values). `reason` is the run's
    stop reason so far at this step (a `StopReason`, or None: the run goes on), `preempted`
    whether a rank heard a stop signal during the step (the run leaves with an emergency save),
    and `saved` whether a checkpoint of this step was saved."""

    step: int
    record: dict[str, Any]
    votes: list[int] = field(default_factory=list)
    stop_reason: str | None = None  # set by `stop`
    reason: StopReason | None = None
    preempted: bool = False
    saved: bool = False

    def stop(self, reason: str) -> None:
        """End the run after this step; `reason` (one line) goes into summary.json and the
        log. Every rank must decide alike (from `votes`, or figures every rank shares):
        a stop on one rank alone leaves the others waiting in the next step's collectives."""
        self.stop_reason = str(reason)

    def end(self, reason: StopReason | None) -> None:
        """thrifty's own callbacks: `reason` joins the step's stop reason (the precedence of
        `StopReason.decide` picks the winner); None changes nothing."""
        if reason is not None:
            self.reason = StopReason.decide(self.reason, reason)


class Callback:
    """Base class of a run's callbacks: override the events you need (module docstring).

    `votes` is the number of integers `vote(step)` returns, summed over the ranks at every
    step; 0 (the default) takes no part in the agreement."""

    votes: ClassVar[int] = 0

    def on_fit_start(self, run: Any) -> None:
        """The run is open; `run` is the Trainer."""

    def vote(self, step: int) -> list[int]:
        """This rank's `votes` integers for optimizer step `step`; asked again for the same
        step when an out-of-memory error replays it."""
        return []

    def on_evaluation_end(self, step: int, val_loss: float | None) -> str | None:
        """A validation loss measured after step `step` (0: before the first step). Return
        None to go on, or a reason (one line) to stop the run here; every rank must answer
        alike. thrifty's own callbacks may return a `StopReason` (a sweep's pruner: PRUNED,
        or PREEMPTED to pause the trial, which saves and exits as after a preemption)."""
        return None

    def on_save(self, step: int, location: str | None) -> None:
        """The checkpoint of `step` is written to `location` (rank 0; None on the others)."""

    def on_step_end(self, step_info: StepEnd) -> None:
        """Optimizer step `step_info.step` ended: add figures, read votes, stop the run."""

    def on_stop(self, step: int, reason: str) -> None:
        """The loop ended after step `step`, for `reason` (a `StopReason` word)."""

    def on_fit_end(self, result: FitResult) -> None:
        """`fit()` is about to return `result`."""
