"""Why a run stopped, and which reason wins when several apply at the same step.

`StopReason` is a `str` enum: each member equals the word summary.json, the metrics and every
printed line have always carried ("max_steps", "diverged", ...), so a member compares equal to
that word, serializes as it, and `StopReason("max_steps")` reads an older run's summary.

The members are declared in order of precedence, the winner first; `StopReason.decide` is the
one place that applies it:

- DATA_ERROR: the training data raised; the loop's own outcome is void (see below).
- DIVERGED: a run that diverged stops as diverged, whatever else came with it (a preemption
  notice, a budget spent at the same step): restarting it would diverge again.
- PREEMPTED: the machine is going away; the emergency save comes before any evaluation, so
  neither early stopping nor the forecast is judged, and a budget spent at that step waits for
  the resume.
- MAX_STEPS, MAX_TOKENS, MAX_TIME: the budget; steps before tokens before seconds.
- EARLY_STOPPING, FORECAST, PRUNED: an evaluation's verdict; the budget spent at the same
  step wins, and the forecast is not consulted once early stopping has stopped the run, nor a
  sweep's pruner (`thrifty.callbacks.trial_report`) once either has.
- CALLBACK: a user's callback asked to stop (`thrifty.callbacks`); it is called after
  thrifty's own decisions at the step, so any of the above at the same step wins.
- DATA_EXHAUSTED: the data ran out with nothing else said.

When the data raised, the Trainer does not choose among reasons: the stop is PREEMPTED where a
stop signal was the cause (a worker lost to the group's SIGTERM), DATA_ERROR otherwise, even
over DIVERGED (the steps judged so far are saved and the run resumes).
"""

from __future__ import annotations

import enum
from typing import overload


class StopReason(str, enum.Enum):
    """Why a run stopped; declared winner first (see the module's docstring)."""

    DATA_ERROR = "data_error"
    DIVERGED = "diverged"
    PREEMPTED = "preempted"
    MAX_STEPS = "max_steps"
    MAX_TOKENS = "max_tokens"
    MAX_TIME = "max_time"
    EARLY_STOPPING = "early_stopping"
    FORECAST = "forecast"
    PRUNED = "pruned"
    CALLBACK = "callback"
    DATA_EXHAUSTED = "data_exhausted"

    # The word itself wherever it is printed: Python 3.11 formats a mixed-in enum as
    # "StopReason.MAX_STEPS" otherwise.
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    # For the type checker: a reason that surely applies (a str, not None) in first or second
    # place makes the winner a StopReason.
    @overload
    @classmethod
    def decide(cls, first: str, /, *reasons: str | None) -> StopReason: ...
    @overload
    @classmethod
    def decide(cls, first: str | None, second: str, /, *reasons: str | None) -> StopReason: ...
    @overload
    @classmethod
    def decide(cls, *reasons: str | None) -> StopReason | None: ...
    @classmethod
    def decide(cls, *reasons: str | None) -> StopReason | None:
        """The reason that wins among those that apply (None: does not apply); None if none
        does. Plain strings are read as members (an unknown one raises ValueError)."""
        winner: StopReason | None = None
        for reason in reasons:
            if reason is None:
                continue
            member = cls(reason)
            if winner is None or _RANK[member] < _RANK[winner]:
                winner = member
        return winner

    @property
    def early(self) -> bool:
        """A stop before the budget was spent, which saved steps and dollars."""
        return self in EARLY_STOPS

    @property
    def unfinished(self) -> bool:
        """The run is resumed later: it writes no summary.json."""
        return self in UNFINISHED

    @property
    def saves_final(self) -> bool:
        """A final checkpoint is written: not for an unfinished run, nor a diverged one (its
        last good checkpoint stays the newest)."""
        return not (self.unfinished or self is StopReason.DIVERGED)


_RANK = {member: rank for rank, member in enumerate(StopReason)}

EARLY_STOPS = frozenset(
    {StopReason.EARLY_STOPPING, StopReason.FORECAST, StopReason.PRUNED, StopReason.DIVERGED}
)
UNFINISHED = frozenset({StopReason.PREEMPTED, StopReason.DATA_ERROR})
