"""Evaluation as a callback: the validation loss at `eval.every` steps and at a stop, and
what it decides: early stopping, the forecast, and the run's callbacks' own verdicts (a
sweep's pruner among them: `thrifty.callbacks.trial_report`).

A preemption notice puts an evaluation due at that step off to the resume, where it is done
first, before the first step (`before_loop`), as is the evaluation at step 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from thrifty.callbacks.base import Callback, StepEnd
from thrifty.callbacks.events import Callbacks
from thrifty.config import GuardConfig
from thrifty.levers.early_stopping import EarlyStopping
from thrifty.measure.forecast import cannot_reach
from thrifty.measure.monitor import RunMonitor
from thrifty.records.budget import Budget
from thrifty.records.state import TrainState
from thrifty.records.stop import StopReason
from thrifty.records.stop_signals import StopSignals

log = logging.getLogger("thrifty")


class Evaluation(Callback):
    """Evaluates when due and judges the loss; `evaluate()` is the validation loss (looked up
    when called: a Trainer subclass's own), `hear` the run's callbacks that are told of it."""

    def __init__(
        self,
        progress: TrainState,
        budget: Budget,
        early_stopping: EarlyStopping,
        guard: Any,
        evaluate: Callable[[], float | None],
        *,
        every: int,
        target: float | None,
        guard_config: GuardConfig,
        warmup_steps: int,
        validates: bool,
        hear: Callbacks,
        log_event: Callable[..., None],
    ) -> None:
        """`every` is eval.every, `target` early_stopping.target, `guard_config` the [guard]
        section (the forecast's settings), `warmup_steps` schedule.warmup_steps (the forecast
        fits the curve after them). Twelve parameters: what evaluating and judging reads."""
        self.every, self.target = every, target
        self.guard_config, self.warmup = guard_config, warmup_steps
        self.progress, self.budget, self.early_stopping = progress, budget, early_stopping
        self.guard, self.evaluate = guard, evaluate  # the RunGuard keeps the forecast's figures
        self.validates, self.hear, self.log_event = validates, hear, log_event
        self.monitor: RunMonitor | None = None
        self.run: Any = None  # the Trainer: its `clock` starts with the loop

    def on_fit_start(self, run: Any) -> None:
        self.monitor, self.run = run.monitor, run

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
                    self.log_event(val_loss=s.val_loss, initial=True)
                    self.hear.evaluation_end(0, s.val_loss)
            pending = self.evaluate() if s.eval_pending else None
        finished = self.budget.exceeded(s.step, s.tokens, s.seconds)
        if s.eval_pending:
            finished = StopReason.decide(finished, self.evaluated(pending))
        return finished

    def on_step_end(self, step_info: StepEnd) -> None:
        s = self.progress
        due = self.validates and (s.step % self.every == 0 or step_info.reason is not None)
        if step_info.preempted:  # the emergency save comes first
            s.eval_pending = due  # done first thing on resume
            return
        if not due:
            return
        assert self.monitor is not None
        self.monitor.pause()  # evaluation is not training: left out of the interval
        start = time.perf_counter()
        step_info.end(self.evaluated(self.evaluate()))
        self.monitor.resume()
        self.run.clock.step_start += time.perf_counter() - start  # evaluation is not step time

    def evaluated(self, val_loss: float | None) -> StopReason | None:
        """Record an evaluation, tell the run's callbacks, feed early stopping and the forecast:
        EARLY_STOPPING, FORECAST, or a callback's verdict (PRUNED; PREEMPTED when a sweep pauses
        the run; CALLBACK) when the run should end here."""
        s = self.progress
        s.eval_pending = False
        s.val_loss = val_loss
        self.log_event(val_loss=val_loss)
        if val_loss is None:  # no validation set: nothing to judge
            return None
        if s.step > 0:
            s.val_steps.append(s.step)
            s.val_losses.append(val_loss)
        heard = self.hear.evaluation_end(s.step, val_loss)
        if self.early_stopping.update(val_loss):
            return StopReason.EARLY_STOPPING
        forecast = self._forecast()
        if forecast is not None:
            return forecast
        asked = self.hear.asked(heard, s.step)
        if asked is StopReason.PRUNED or asked is StopReason.PREEMPTED:  # a sweep's word
            self.log_event(event="pruned" if asked is StopReason.PRUNED else "paused")
        return asked

    def _forecast(self) -> StopReason | None:
        """With early_stopping.target: FORECAST once the validation curve, fitted and
        extended to the end of the budget with its band, cannot reach the target."""
        g, target, s = self.guard_config, self.target, self.progress
        end = self.budget.end_step(s)
        if not g.enabled or target is None or end is None or s.step >= end:
            return None
        # The curve's early part (warm-up, the first quarter of the steps so far) is a transient
        # no saturating power law describes: the fit starts after it.
        start = max(self.warmup, s.step // 4)
        points = [(t, v) for t, v in zip(s.val_steps, s.val_losses, strict=True) if t > start]
        decision = cannot_reach(
            [t for t, _ in points],
            [v for _, v in points],
            target,
            end,
            min_evals=g.forecast_min_evals,
            confidence=g.forecast_confidence,
            margin=g.forecast_margin,
        )
        if decision.forecast is not None:
            self.guard.forecast = {
                **decision.forecast.to_dict(),
                "target": target,
                "stopped": bool(decision),
                "reason": decision.reason,
            }
        if not decision:
            return None
        log.warning("forecast: %s: stopping", decision.reason)
        return StopReason.FORECAST
