"""A run's callbacks, called in the order given: the Trainer's one handle on them.

The integers the callbacks vote with are laid end to end, in the callbacks' order, on the
step's one cross-rank sum; `step_end` hands each callback its own slice back. The Trainer's
list is thrifty's own callbacks around the user's (`thrifty.run.trainer`): the preemption notice,
the budget, the evaluation and the checkpoint saver first, then the user's in the order
given, then the guard, which records the step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from thrifty.callbacks.base import Callback, StepEnd
from thrifty.errors import ThriftyError
from thrifty.records.stop import StopReason

log = logging.getLogger("thrifty")


class Callbacks:
    """The callbacks of one run; built once, checked where they are given."""

    def __init__(self, callbacks: Iterable[Any]) -> None:
        self.items: list[Callback] = list(callbacks)
        for i, callback in enumerate(self.items):
            if not isinstance(callback, Callback):
                raise ThriftyError(
                    f"callbacks[{i}] is a {type(callback).__name__}, not a callback: subclass "
                    "thrifty.callbacks.Callback and pass an instance"
                )
            votes = callback.votes
            if isinstance(votes, bool) or not isinstance(votes, int) or votes < 0:
                raise ThriftyError(
                    f"{type(callback).__name__}.votes is {votes!r}: give the number of "
                    "integers its vote(step) returns (0 or more)"
                )
        self.voters = [c for c in self.items if c.votes]
        self.stop_detail: str | None = None  # a callback's words for its stop
        # Waiting for the write is done only where a callback listens for saves.
        self.hears_saves = any(type(c).on_save is not Callback.on_save for c in self.items)

    def vote(self, step: int) -> list[int]:
        """This rank's integers for step `step`: each voter's `vote(step)`, end to end."""
        values: list[int] = []
        for callback in self.voters:
            mine = list(callback.vote(step))
            if len(mine) != callback.votes or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in mine
            ):
                raise ThriftyError(
                    f"{type(callback).__name__}.vote({step}) returned {mine!r}: it must return "
                    f"a list of {callback.votes} integers (its `votes`)"
                )
            values.extend(mine)
        return values

    def step_end(self, info: StepEnd, votes: list[int]) -> None:
        """Call every callback's `on_step_end` with `info`, each with its slice of `votes`; a
        stop asked in a callback's words ends the run as CALLBACK (the first words kept)."""
        start = 0
        for callback in self.items:
            info.votes = votes[start : start + callback.votes]
            start += callback.votes
            callback.on_step_end(info)
            if info.stop_reason is not None:
                info.end(self.asked(info.stop_reason, info.step))
                info.stop_reason = None

    def asked(self, reason: str | None, step: int) -> StopReason | None:
        """A stop a callback asked for: a `StopReason` is thrifty's own (a sweep's pruner);
        other words end the run as CALLBACK, the first words kept as `stop_detail`."""
        if reason is None or isinstance(reason, StopReason):
            return reason
        log.warning("a callback stops the run at step %d: %s", step, reason)
        if self.stop_detail is None:
            self.stop_detail = str(reason)
        return StopReason.CALLBACK

    def fit_start(self, run: Any) -> None:
        for callback in self.items:
            callback.on_fit_start(run)

    def evaluation_end(self, step: int, val_loss: float | None) -> str | None:
        """Call every callback's `on_evaluation_end`; the first stop reason given, or None."""
        reason: str | None = None
        for callback in self.items:
            asked = callback.on_evaluation_end(step, val_loss)
            if reason is None and asked is not None:
                reason = asked
        return reason

    def save(self, step: int, location: str | None) -> None:
        for callback in self.items:
            callback.on_save(step, location)

    def stop(self, step: int, reason: str) -> None:
        for callback in self.items:
            callback.on_stop(step, reason)

    def fit_end(self, result: Any) -> None:
        for callback in self.items:
            callback.on_fit_end(result)
