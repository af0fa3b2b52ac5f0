"""The step boundary: what a run decides between two optimizer steps, and before the first.

After each step, with every rank's word agreed on, `StepBoundary.after_step` asks the budget,
the preemption notice, the evaluation, the run guard and the save interval, in that order, and
returns the stop reason (or None). `before_loop` does the evaluations due before the first step.
The Trainer's loop (`thrifty.trainer`) calls both; the step itself is `thrifty.run.step`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from thrifty.config import TrainConfig
from thrifty.measure.monitor import RunMonitor
from thrifty.records.budget import Budget
from thrifty.records.state import RunClock, TrainState
from thrifty.records.stop import StopReason
from thrifty.records.stop_signals import StopSignals
from thrifty.run.checkpointer import RunCheckpointer
from thrifty.run.watch import RunWatch


class StepBoundary:
    """The decisions around one run's steps; `evaluate()` is the validation loss, or None
    without validation data."""

    def __init__(
        self,
        config: TrainConfig,
        progress: TrainState,
        budget: Budget,
        watch: RunWatch,
        checkpointer: RunCheckpointer,
        evaluate: Callable[[], float | None],
        *,
        validates: bool,
    ) -> None:
        self.config, self.progress, self.budget = config, progress, budget
        self.watch, self.checkpointer = watch, checkpointer
        self.evaluate, self.validates = evaluate, validates

    def before_loop(self, stops: StopSignals) -> StopReason | None:
        """The evaluations before the first step, which a stop signal ends at once: the initial
        one, or one a preemption put off (it comes first, as it would have). Returns the stop
        reason when the run ends without a step: it was preempted at its last step, its budget
        spent."""
        s = self.progress
        with stops.interruptible():
            if s.step == 0:
                s.initial_val_loss = s.val_loss = self.evaluate()
                if s.val_loss is not None:  # the validation curve's first point, in the report
                    self.watch.log_event(val_loss=s.val_loss, initial=True)
            pending = self.evaluate() if s.eval_pending else None
        finished = self.budget.exceeded(s.step, s.tokens, s.seconds)
        if s.eval_pending:
            stop = self.watch.evaluated(pending)  # always recorded: `or` would skip it
            finished = StopReason.decide(finished, stop)
        return finished

    def after_step(
        self,
        preempted: bool,
        time_up: bool,
        due: bool,
        loss: torch.Tensor,
        skipped: torch.Tensor | bool | None,
        monitor: RunMonitor,
        clock: RunClock,
    ) -> StopReason | None:
        """After a step, with every rank's say agreed on: the budget, the preemption notice,
        the evaluation, the guard and the save interval. Returns the stop reason, or None."""
        cfg, s, watch, checkpointer = self.config, self.progress, self.watch, self.checkpointer
        reason = self.budget.exceeded(s.step, s.tokens, s.seconds)
        if time_up:  # another rank's clock ran out first
            reason = StopReason.decide(reason, StopReason.MAX_TIME)
        # A preemption notice leaves 30 s (GCP, Azure) to 2 min (AWS): the emergency
        # checkpoint comes first, before any evaluation due at this step.
        eval_due = self.validates and (s.step % cfg.eval.every == 0 or reason is not None)
        paused = False  # a sweep's trial waiting for its bracket (thrifty.run.judge)
        if preempted:
            reason = StopReason.decide(reason, StopReason.PREEMPTED)
            s.eval_pending = eval_due  # done first thing on resume
        elif eval_due:
            monitor.pause()  # evaluation is not training: left out of the interval
            eval_start = time.perf_counter()
            stop = watch.evaluated(self.evaluate())  # always evaluated: `or` would skip it
            paused = stop is StopReason.PREEMPTED
            reason = StopReason.decide(reason, stop)
            monitor.resume()
            clock.step_start += time.perf_counter() - eval_start  # evaluation is not step time
        if preempted or paused or (due and reason is None):
            # The guard sees every step before a save: none is written while a loss spike
            # builds, or from a run that diverged.
            reason = StopReason.decide(watch.flush(monitor, watch.current(loss, skipped)), reason)
            leaving = preempted or paused
            if leaving or not (watch.suspect or reason is StopReason.DIVERGED):
                if leaving:
                    checkpointer.emergency_begins(s.step)  # for a Ctrl-C meanwhile
                monitor.timer.add("checkpoint", checkpointer.save(emergency=leaving))
        return reason
