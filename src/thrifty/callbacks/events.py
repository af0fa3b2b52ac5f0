"""A run's callbacks, called in the order given: the Trainer's one handle on them.

The integers the callbacks vote with are laid end to end, in the callbacks' order, on the
step's one cross-rank sum; `step_end` hands each callback its own slice back. The Trainer's
list is thrifty's own callbacks around the user's (`thrifty.run.trainer`): the preemption notice,
the budget, the evaluation and the checkpoint saver first, then the user's in the order
given, then the guard, which records the step.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from typing import Any

from thrifty.callbacks.base import Callback, StepEnd
from thrifty.errors import ThriftyError
from thrifty.records.stop import StopReason
from thrifty.redact import printed

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
        # thrifty's own callbacks vote as declared: only a user's votes are checked each step.
        self._checked = {id(c) for c in self.voters if not _own(c)}
        # Each callback's slice of the step's votes, laid end to end in the callbacks' order.
        ends = list(itertools.accumulate(c.votes for c in self.items))
        self._slices = [
            (c, slice(end - c.votes, end) if c.votes else None)
            for c, end in zip(self.items, ends, strict=True)
        ]
        self.stop_detail: str | None = None  # a callback's words for its stop
        # Waiting for the write is done only where a callback listens for saves.
        self.hears_saves = any(type(c).on_save is not Callback.on_save for c in self.items)

    def vote(self, step: int) -> list[int]:
        """This rank's integers for step `step`: each voter's `vote(step)`, end to end."""
        values: list[int] = []
        for callback in self.voters:
            mine = callback.vote(step)
            if id(callback) not in self._checked:
                values.extend(mine)
                continue
            mine = list(mine)
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
        for callback, mine in self._slices:
            info.votes = votes[mine] if mine is not None else []
            callback.on_step_end(info)
            if info.stop_reason is not None:
                info.end(self.asked(info.stop_reason, info.step))
                info.stop_reason = None

    def asked(self, reason: str | None, step: int) -> StopReason | None:
        """A stop a callback asked for: a `StopReason` is thrifty's own (a sweep's pruner);
        other words end the run as CALLBACK, the first words kept as `stop_detail`."""
        if reason is None or isinstance(reason, StopReason):
            return reason
        words = printed(str(reason))  # one line, no secret: it goes into summary.json
        log.warning("a callback stops the run at step %d: %s", step, words)
        if self.stop_detail is None:
            self.stop_detail = words
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


def _own(callback: Callback) -> bool:
    """One of thrifty's own callbacks (`thrifty.callbacks.*`), not a user's subclass of one."""
    return type(callback).__module__.startswith("thrifty.callbacks.")
