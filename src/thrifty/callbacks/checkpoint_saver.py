"""Saves as a callback: the preemption notice, and the checkpoint the interval asks for.

`PreemptionNotice` tells the step that a rank heard a stop signal during it (its vote), first
of all callbacks. A notice leaves 30 s (GCP, Azure) to 2 min (AWS): the emergency checkpoint
comes before any evaluation due at that step (`thrifty.callbacks.evaluation` puts it off to
the resume), and the saver ends the run as PREEMPTED.

`CheckpointSaver` decides itself whether a save is due (`checkpoint.every`, its vote: every
rank saves at the same step) and saves: at once, as an emergency save, when the run leaves
(preempted, or paused by a sweep), else at the interval when the run goes on. The guard sees
every step before a save, so none is written while a loss spike builds or from a run that
diverged (`thrifty.callbacks.guard`).
"""

from __future__ import annotations

from collections.abc import Callable

from thrifty.callbacks.base import Callback, StepEnd
from thrifty.callbacks.guard import Guard
from thrifty.checkpointing.saving.checkpointer import RunCheckpointer
from thrifty.records.stop import StopReason


class PreemptionNotice(Callback):
    """Marks the step `preempted` when any rank's stop signal arrived during it."""

    votes = 1

    def __init__(self, checkpointer: RunCheckpointer) -> None:
        self.checkpointer = checkpointer

    def vote(self, step: int) -> list[int]:
        return [int(self.checkpointer.preempted)]

    def on_step_end(self, step_info: StepEnd) -> None:
        if step_info.votes[0]:
            step_info.preempted = True


class CheckpointSaver(Callback):
    """Saves the run's checkpoint when the interval or a leaving run asks for one."""

    votes = 1

    def __init__(
        self, checkpointer: RunCheckpointer, guard: Guard, saved: Callable[[int], None]
    ) -> None:
        """`saved(step)` is called once step `step`'s checkpoint is saved (the run's `on_save`)."""
        self.checkpointer, self.guard, self.saved = checkpointer, guard, saved

    def vote(self, step: int) -> list[int]:
        return [int(self.checkpointer.due(step))]

    def on_step_end(self, step_info: StepEnd) -> None:
        if step_info.preempted:
            step_info.end(StopReason.PREEMPTED)
        reason = step_info.reason
        leaving = reason is StopReason.PREEMPTED  # a notice, or a sweep's pause
        if not (leaving or (step_info.votes[0] and reason is None)):
            return
        record = step_info.record
        step_info.end(self.guard.flush(self.guard.current(record["loss"], record["skipped"])))
        if leaving or not (self.guard.suspect or step_info.reason is StopReason.DIVERGED):
            checkpointer = self.checkpointer
            if leaving:
                checkpointer.emergency_begins(step_info.step)  # for a Ctrl-C meanwhile
            seconds = checkpointer.save(emergency=leaving)
            self.guard.monitor.timer.add("checkpoint", seconds)
            if checkpointer.newest_step == step_info.step:
                step_info.saved = True
                self.saved(step_info.step)
