"""What ends a run before its budget, decided at step boundaries: early stopping and the
forecast after each evaluation; the guard's verdict on the steps logged (a non-finite step
skipped, a loss spike rolled back, divergence); and what stopping early saved.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from thrifty.config import TrainConfig
from thrifty.measure.monitor import RunMonitor
from thrifty.records.budget import Budget
from thrifty.records.stop import EARLY_STOPS, StopReason
from thrifty.run.checkpointer import RunCheckpointer
from thrifty.run.forecast import cannot_reach
from thrifty.run.guard import rewind_schedule, scale_learning_rate
from thrifty.run.judge import PAUSE, PRUNE, from_environment
from thrifty.strategies.process_group import Distributed

log = logging.getLogger("thrifty")


class RunWatch:
    """Decides the early stop reasons of one run; see the module's docstring."""

    def __init__(
        self,
        config: TrainConfig,
        dist: Distributed,
        checkpointer: RunCheckpointer,
        budget: Budget,
    ) -> None:
        self.config = config
        self.dist = dist
        self.checkpointer = checkpointer
        self.budget = budget
        self.progress = checkpointer.progress
        self.parts = checkpointer.parts
        self.judge = from_environment(dist.world_size)  # a sweep's trial: its pruner's say

    def log_event(self, **fields: Any) -> None:
        metrics = self.checkpointer.metrics
        if metrics is not None:  # rank 0's
            metrics.write([{"step": self.progress.step, **fields}])

    # --- after an evaluation -------------------------------------------------------------------

    def evaluated(self, val_loss: float | None) -> StopReason | None:
        """Record an evaluation, feed early stopping and the forecast, and in a sweep's trial
        ask its pruner; EARLY_STOPPING, FORECAST or PRUNED when the run should end here (in that
        order: `StopReason`), PREEMPTED when the sweep pauses it."""
        s = self.progress
        s.eval_pending = False
        s.val_loss = val_loss
        self.log_event(val_loss=val_loss)
        if val_loss is None:  # no validation set: nothing to judge
            return None
        if s.step > 0:
            s.val_steps.append(s.step)
            s.val_losses.append(val_loss)
        if self.parts.early_stopping.update(val_loss):
            return StopReason.EARLY_STOPPING
        forecast = self._forecast()
        if forecast is None and s.step > 0:
            return self._judged(val_loss)
        return forecast

    def _judged(self, val_loss: float) -> StopReason | None:
        """A sweep's trial: PRUNED when its pruner stops it here, PREEMPTED when it is paused
        (saved, and resumed once its Hyperband bracket catches up)."""
        if self.judge is None:
            return None
        step = self.progress.step
        verdict = self.judge.verdict(step, val_loss, self.budget.end_step(self.progress))
        if verdict == PRUNE:
            log.warning("pruned by the sweep at step %d", step)
            self.log_event(event="pruned")
            return StopReason.PRUNED
        if verdict == PAUSE:
            log.warning("paused by the sweep at step %d: its bracket has not caught up", step)
            self.log_event(event="paused")
            return StopReason.PREEMPTED
        return None

    def _forecast(self) -> StopReason | None:
        """With early_stopping.target: FORECAST once the validation curve, fitted and
        extended to the end of the budget with its band, cannot reach the target."""
        g, target, s = self.config.guard, self.config.early_stopping.target, self.progress
        end = self.budget.end_step(s)
        if not g.enabled or target is None or end is None or s.step >= end:
            return None
        # The curve's early part (warm-up, the first quarter of the steps so far) is a transient
        # no saturating power law describes: the fit starts after it.
        start = max(self.config.schedule.warmup_steps, s.step // 4)
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
            self.parts.guard.forecast = {
                **decision.forecast.to_dict(),
                "target": target,
                "stopped": bool(decision),
                "reason": decision.reason,
            }
        if not decision:
            return None
        log.warning("forecast: %s: stopping", decision.reason)
        return StopReason.FORECAST

    # --- the guard's verdict on the steps logged -----------------------------------------------

    def current(self, loss: torch.Tensor, skipped: torch.Tensor | bool | None) -> dict[str, Any]:
        """This step's record for the guard before a save, so the checkpoint holds a guard that
        has seen every step up to it (one read of the loss: at a save only). The loss is the
        mean over the ranks, as at a flush, so that every rank decides alike."""
        mean = self.dist.mean_(loss.detach().float().clone())
        flag = bool(skipped) if skipped is not None else None
        return {"step": self.progress.step, "loss": float(mean), "skipped": flag}

    def flush(
        self, monitor: RunMonitor, current: dict[str, Any] | None = None
    ) -> StopReason | None:
        """Write the buffered steps and let the run guard judge them (and `current`, this
        step's record when a save follows): the schedule is set back for skipped steps, a
        confirmed loss spike rolled back. Returns DIVERGED or None."""
        s = self.progress
        records = monitor.flush(s.seconds, s.samples, s.tokens)
        verdict = self.parts.guard.observe(records + ([current] if current else []))
        rewind_schedule(self.parts.scheduler, verdict.skipped)
        if verdict.diverged is not None:
            return self._diverged(verdict.diverged)
        if verdict.spike_start is not None:
            return self._roll_back(monitor, verdict.spike_start)
        return None

    @property
    def suspect(self) -> bool:
        """A loss spike is building: no interval save until it is judged."""
        return bool(self.parts.guard.suspect)

    def _diverged(self, why: str) -> StopReason:
        self.parts.guard.stopped = why
        log.error("diverged: %s; the newest checkpoint is the last good state", why)
        self.log_event(event="diverged", why=why)
        return StopReason.DIVERGED

    def _roll_back(self, monitor: RunMonitor, spike_start: int) -> StopReason | None:
        """Back to the weights of the newest checkpoint from before `spike_start`; the data
        position (the windows seen since are skipped) and the schedule's stay. Past
        guard.max_rollbacks the run stops as diverged."""
        g, guard = self.config.guard, self.parts.guard
        done = len(guard.rollbacks)
        if done >= g.max_rollbacks:
            return self._diverged(
                f"a loss spike from step {spike_start} after {done} rollback(s) "
                f"(guard.max_rollbacks = {g.max_rollbacks})"
            )
        to_step = self.checkpointer.roll_back(before=spike_start)
        if to_step is None:
            return self._diverged(
                f"a loss spike from step {spike_start} and no checkpoint before it to roll back to"
            )
        scale_learning_rate(self.parts.scheduler, g.rollback_lr_factor)
        lost = self.progress.step - to_step
        seconds = lost * (monitor.meter.step_seconds or 0.0)
        event = {
            "from_step": self.progress.step,
            "to_step": to_step,
            "spike_start": spike_start,
            "steps_lost": lost,
            "seconds_lost": seconds,
            "usd_lost": _usd(monitor, seconds),
            "lr_factor": g.rollback_lr_factor,
        }
        guard.rollbacks.append(event)
        self.log_event(event="rollback", **event)
        log.warning(
            "loss spike from step %d: rolled back to the weights of step %d (%d steps lost), "
            "skipping the data seen since",
            spike_start,
            to_step,
            lost,
        )
        return None

    # --- at the end ----------------------------------------------------------------------------

    def saved(self, stop_reason: str, monitor: RunMonitor) -> dict[str, Any] | None:
        """Steps and dollars a stop before the budget did not spend (early stopping, the
        forecast, divergence): the steps left times the measured step time and price."""
        end = self.budget.end_step(self.progress)
        if stop_reason not in EARLY_STOPS or end is None:
            return None
        steps = max(0, end - self.progress.step)
        seconds = steps * (monitor.meter.step_seconds or 0.0)
        return {
            "by": stop_reason,
            "steps_not_run": steps,
            "seconds": seconds,
            "usd": _usd(monitor, seconds),
        }


def _usd(monitor: RunMonitor, seconds: float) -> float | None:
    return None if monitor.cost is None else seconds * monitor.cost.usd_per_hour / 3600
