"""The step's record and the run guard, as the last callback of a step.

`Guard.on_step_end` buffers the step's record (with the figures earlier callbacks added) and
flushes the buffer every `run.log_every` steps, at a stop and with a save: metrics.jsonl, the
loggers and the cost meter take the records (`RunMonitor.flush`), and the run guard judges
them: the schedule is set back for a non-finite step skipped, a confirmed loss spike is rolled
back to the newest checkpoint before it, and a run that diverged stops as DIVERGED.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from thrifty.callbacks.base import Callback, StepEnd
from thrifty.checkpointing.saving.checkpointer import RunCheckpointer
from thrifty.config.guard import GuardConfig
from thrifty.measure.guard import rewind_schedule, scale_learning_rate
from thrifty.measure.monitor import RunMonitor
from thrifty.records.budget import Budget
from thrifty.records.state import TrainState
from thrifty.records.stop import EARLY_STOPS, StopReason
from thrifty.strategies.process_group import Distributed

log = logging.getLogger("thrifty")


class Guard(Callback):
    """Records the steps and judges them; see the module's docstring. `log_every` is
    `run.log_every`; `log_event(**fields)` writes an event at the current step."""

    def __init__(
        self,
        config: GuardConfig,
        checkpointer: RunCheckpointer,
        dist: Distributed,
        *,
        log_every: int,
        log_event: Callable[..., None],
    ) -> None:
        self.config, self.checkpointer, self.dist = config, checkpointer, dist
        self.log_every, self.log_event = log_every, log_event
        self.progress: TrainState = checkpointer.progress
        self.parts = checkpointer.parts
        self.monitor: RunMonitor = None  # type: ignore[assignment]  # set at fit start
        self.run: Any = None  # the Trainer: its `clock` starts with the loop

    def on_fit_start(self, run: Any) -> None:
        self.monitor, self.run = run.monitor, run

    def on_step_end(self, step_info: StepEnd) -> None:
        record, monitor = step_info.record, self.monitor
        record["step_seconds"] = time.perf_counter() - self.run.clock.step_start
        monitor.add(record, monitor.timer.finish())
        if (
            len(monitor.pending) >= self.log_every
            or step_info.reason is not None
            or step_info.saved
        ):
            step_info.end(self.flush())

    def current(self, loss: torch.Tensor, skipped: torch.Tensor | bool | None) -> dict[str, Any]:
        """This step's record for the guard before a save, so the checkpoint holds a guard that
        has seen every step up to it (one read of the loss: at a save only). The loss is the
        mean over the ranks, as at a flush, so that every rank decides alike."""
        mean = self.dist.mean_(loss.detach().float().clone())
        flag = bool(skipped) if skipped is not None else None
        return {"step": self.progress.step, "loss": float(mean), "skipped": flag}

    def flush(self, current: dict[str, Any] | None = None) -> StopReason | None:
        """Write the buffered steps and let the run guard judge them (and `current`, this
        step's record when a save follows). Returns DIVERGED or None."""
        s, guard = self.progress, self.parts.guard
        records = self.monitor.flush(s.seconds, s.samples, s.tokens)
        verdict = guard.observe(records + ([current] if current else []))
        rewind_schedule(self.parts.scheduler, verdict.skipped)
        if verdict.diverged is not None:
            return self._diverged(verdict.diverged)
        if verdict.spike_start is not None:
            return self._roll_back(verdict.spike_start)
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

    def _roll_back(self, spike_start: int) -> StopReason | None:
        """Back to the weights of the newest checkpoint from before `spike_start`; the data
        position (the windows seen since are skipped) and the schedule's stay. Past
        guard.max_rollbacks the run stops as diverged."""
        g, guard = self.config, self.parts.guard
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
        seconds = lost * (self.monitor.meter.step_seconds or 0.0)
        event = {
            "from_step": self.progress.step,
            "to_step": to_step,
            "spike_start": spike_start,
            "steps_lost": lost,
            "seconds_lost": seconds,
            "usd_lost": _usd(self.monitor, seconds),
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


def stop_saved(
    stop_reason: str, budget: Budget, progress: TrainState, monitor: RunMonitor
) -> dict[str, Any] | None:
    """Steps and dollars a stop before the budget did not spend (early stopping, the
    forecast, divergence): the steps left times the measured step time and price."""
    end = budget.end_step(progress)
    if stop_reason not in EARLY_STOPS or end is None:
        return None
    steps = max(0, end - progress.step)
    seconds = steps * (monitor.meter.step_seconds or 0.0)
    return {
        "by": stop_reason,
        "steps_not_run": steps,
        "seconds": seconds,
        "usd": _usd(monitor, seconds),
    }


def _usd(monitor: RunMonitor, seconds: float) -> float | None:
    return None if monitor.cost is None else seconds * monitor.cost.usd_per_hour / 3600
