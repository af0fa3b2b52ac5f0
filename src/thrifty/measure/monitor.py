"""What a run reports while it trains and when it ends: per-step metrics (flushed with one host
sync per logging interval), throughput, MFU, system load, dollars, and the diagnosis.

Time is measured sync to sync. On a GPU the host runs ahead of the device, so a step timed on
the host shows launch time, not the work. The flush's host sync (reading the losses) is the
one point where the host knows the device has caught up: each logging interval is the wall
time from one such sync to the next, less what the caller said was not training (evaluation),
and each step gets its share of it in proportion to its measured time (CUDA events on a GPU,
the clock on a CPU). Throughput and MFU come from these seconds; no step adds a sync.
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

import torch

from thrifty.measure.evidence import PHASES
from thrifty.measure.peak import Peak
from thrifty.measure.progress import ProgressBar
from thrifty.measure.timing import NullTimer
from thrifty.run.directory import MetricsLog

log = logging.getLogger("thrifty")


class ThroughputMeter:
    """Samples and tokens per second, leaving out the first steps (allocator and compile
    warm-up), so the figure describes the steady state the rest of the run will see."""

    def __init__(self, exclude_steps: int = 1) -> None:
        self.exclude = exclude_steps
        self.seen = 0
        self.seconds = 0.0
        self.samples = 0
        self.tokens = 0

    def add(self, seconds: float, samples: int, tokens: int) -> None:
        self.seen += 1
        if self.seen <= self.exclude:
            return
        self.seconds += seconds
        self.samples += samples
        self.tokens += tokens

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0

    @property
    def step_seconds(self) -> float | None:
        """Mean seconds per step after the warm-up, or None before any was counted."""
        counted = self.seen - self.exclude
        return self.seconds / counted if counted > 0 else None


class RunMonitor:
    """Buffers step records and writes them every `log_every` steps; keeps the aggregates the
    summary and the diagnosis need."""

    def __init__(
        self,
        metrics: MetricsLog,
        progress: ProgressBar,
        timer: NullTimer,
        *,
        exclude_steps: int,
        flops_per_step: float | None,
        peak: Peak | None,  # thrifty.measure.peak.Peak
        sampler: Any = None,
        cost: Any = None,
        budget_fraction: Any = None,
        reduce: Any = None,  # averages a tensor over the ranks in place (several processes)
    ) -> None:
        self.reduce = reduce
        self.metrics = metrics
        self.progress = progress
        self.timer = timer
        self.meter = ThroughputMeter(exclude_steps)
        self.flops_per_step = flops_per_step
        self.peak = peak
        self.sampler = sampler
        self.cost = cost
        self.budget_fraction = budget_fraction  # () -> fraction of the budget done, for projections
        self.pending: list[dict[str, Any]] = []
        self.phase_totals = dict.fromkeys(PHASES, 0.0)
        self.busy_totals: dict[str, float] | None = None  # CPU-held seconds (CPU timer only)
        self.step_times: list[float] = []
        self.system: list[dict[str, float]] = []
        self.train_loss = math.nan
        self._skip = exclude_steps
        self.clock = timer.clock  # seconds; the timer's, so a test can stand in for both
        self._synced_at: float | None = None  # clock at the last sync; None before start()
        self._excluded = 0.0  # seconds of the current interval that were not training
        self._paused_at: float | None = None

    # --- the interval's wall time: from one sync to the next ------------------------------

    def start(self) -> None:
        """Open the first interval: call right before the first step. From here on intervals
        are measured sync to sync, so the caller marks evaluations with `pause()`/`resume()`.
        Syncs the device once: work queued before training (moving the model, counting
        FLOPs) is not counted."""
        self.timer.sync()
        self._synced_at = self.clock()
        self._excluded = 0.0

    def pause(self) -> None:
        """Stop counting time as training (before an evaluation): syncs the device first, so
        the training work still queued is counted as training."""
        self.timer.sync()
        self._paused_at = self.clock()

    def resume(self) -> None:
        """Count time as training again (after `pause()`)."""
        if self._paused_at is not None:
            self.exclude(self.clock() - self._paused_at)
            self._paused_at = None

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` of wall time out of the current interval: time that was not
        training, measured by the caller after a device sync."""
        self._excluded += seconds

    def _interval_seconds(self, weights: list[float]) -> float:
        """Seconds since the last sync, less the excluded time; call right after a sync.
        Without `start()` (a caller that does not mark its pauses either) the steps' own
        seconds are all there is."""
        if self._synced_at is None:
            return sum(weights)
        now = self.clock()
        wall = max(0.0, now - self._synced_at - self._excluded)
        self._synced_at, self._excluded = now, 0.0
        return wall

    # --- steps --------------------------------------------------------------------------

    def add(self, record: dict[str, Any], raw_phases: Any) -> None:
        """Buffer one step; tensors in it are read at the next flush. `record["step_seconds"]`
        is the step as the host timed it: used only where the timer measured nothing."""
        record["_phases"] = raw_phases
        self.pending.append(record)

    def flush(self, elapsed_seconds: float, samples: int, tokens: int) -> list[dict[str, Any]]:
        """Write the buffered steps: one host sync for the whole interval. Returns the steps'
        records, their tensors read (`skipped`: the guard left the step out)."""
        if not self.pending:
            return []
        pending, self.pending = self.pending, []
        losses_t = torch.stack([_float(r["loss"]) for r in pending])
        if self.reduce is not None:  # every rank's loss, averaged: one collective per flush
            self.reduce(losses_t)
        norms_t = [_float(r["grad_norm"]) for r in pending if r["grad_norm"] is not None]
        skips_t = [_float(s) for r in pending if isinstance(s := r.get("skipped"), torch.Tensor)]
        # This is a CPU-GPU sync point: every step of the interval has finished on the device.
        read = norms_t + skips_t
        values = (torch.cat([losses_t, torch.stack(read)]) if read else losses_t).tolist()
        raws = [r.pop("_phases") for r in pending]
        phases = [self.timer.resolve(raw) for raw in raws]
        weights = [
            sum(p.values()) if p is not None else r["step_seconds"]
            for p, r in zip(phases, pending, strict=True)
        ]
        interval = self._interval_seconds(weights)
        seconds = _apportion(interval, weights)
        losses, rest = values[: len(pending)], iter(values[len(pending) :])
        for record, loss in zip(pending, losses, strict=True):
            record["loss"] = loss
            if record["grad_norm"] is not None:
                record["grad_norm"] = next(rest)
        for record in pending:
            skipped = record.get("skipped")
            if skipped is not None:
                if next(rest) if isinstance(skipped, torch.Tensor) else skipped:
                    record["skipped"] = True
                else:
                    del record["skipped"]
        for i, record in enumerate(pending):
            record["step_seconds"] = seconds[i]
            self.meter.add(seconds[i], record.pop("samples_in_step"), record.pop("tokens_in_step"))
            phase = phases[i]
            if phase is not None:
                record["breakdown"] = _fit_to_step(phase, seconds[i])
                self._count(record["breakdown"], self.timer.busy(raws[i]), seconds[i])
        last = pending[-1]
        if self.flops_per_step and self.peak and interval > 0:
            last["mfu"] = self.flops_per_step * len(pending) / interval / self.peak.flops_per_second
        if self.sampler is not None:
            system = self.sampler.summary_and_reset()
            if system:
                last["system"] = system
                self.system.append(system)
        usd_text = ""
        if self.cost is not None:
            snap = self.cost.update(elapsed_seconds, tokens, samples)
            last["cost"] = snap.to_dict()
            fraction = self.budget_fraction() if self.budget_fraction else None
            if fraction:
                last["cost"]["projected"] = self.cost.project(fraction).to_dict()
            usd_text = snap.describe()
        self.metrics.write(pending)
        self.train_loss = losses[-1]
        self.progress.update(
            last["step"],
            losses[-1],
            self.meter.tokens_per_second,
            self.meter.samples_per_second,
            usd_text,
        )
        return pending

    def _count(
        self, phases: dict[str, float], busy: dict[str, float] | None, seconds: float
    ) -> None:
        """Add a step to the run's aggregates, unless it is one of the warm-up steps."""
        if self._skip > 0:
            self._skip -= 1
            return
        for phase, value in phases.items():
            self.phase_totals[phase] += value
        if busy is not None:
            totals = self.busy_totals or dict.fromkeys(PHASES, 0.0)
            for phase, value in busy.items():
                totals[phase] += value
            self.busy_totals = totals
        self.step_times.append(seconds)

    @property
    def mfu(self) -> float | None:
        if not (self.flops_per_step and self.peak and self.step_times):
            return None
        return self.flops_per_step / statistics.mean(self.step_times) / self.peak.flops_per_second

    def mean_phases(self) -> dict[str, float] | None:
        n = len(self.step_times)
        return {p: s / n for p, s in self.phase_totals.items()} if n else None

    def mean_busy(self) -> dict[str, float] | None:
        """Mean seconds per step each phase held the CPU (a CPU run), or None."""
        n = len(self.step_times)
        return {p: s / n for p, s in self.busy_totals.items()} if n and self.busy_totals else None

    def system_means(self) -> dict[str, float]:
        """Means over the run of each interval's mean (and of its swing)."""
        keys = {k for s in self.system for k in s}
        return {k: statistics.mean(s[k] for s in self.system if k in s) for k in sorted(keys)}

    def diagnose(self, **context: Any) -> Any:
        """The diagnosis (`thrifty.measure.diagnosis.diagnose`) of the steps measured so far;
        `context` holds the run's static facts (device, precision, batch, workers...)."""
        from thrifty.measure.diagnosis import diagnose
        from thrifty.measure.evidence import Evidence

        phases = self.mean_phases()
        if phases is None:
            return None
        system = self.system_means()
        evidence = Evidence(
            step_seconds=statistics.mean(self.step_times),
            steps=len(self.step_times),
            # The phases' names are Evidence's `*_seconds` fields, which mypy cannot see.
            **{f"{p}_seconds": v for p, v in phases.items() if p != "other"},  # type: ignore[arg-type]
            flops_per_step=self.flops_per_step,
            mfu=self.mfu,
            busy_seconds=self.mean_busy(),
            peak_source=self.peak.source if self.peak else None,
            gpu_util_mean=system.get("gpu_util_percent_mean"),
            gpu_util_std=system.get("gpu_util_percent_std"),
            cpu_util_mean=system.get("cpu_percent_mean"),
            cpu_util_std=system.get("cpu_percent_std"),
            **context,
        )
        return diagnose(evidence)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        self.progress.close()
        self.metrics.close()


def _apportion(interval: float, weights: list[float]) -> list[float]:
    """`interval` seconds split over the steps in proportion to `weights` (equal shares when
    nothing was measured)."""
    total = sum(weights)
    if total <= 0:
        return [interval / len(weights)] * len(weights)
    return [interval * w / total for w in weights]


def _fit_to_step(phases: dict[str, float], step_seconds: float) -> dict[str, float]:
    """The phases of a step of `step_seconds`, with `other` the time they leave unaccounted;
    scaled down to fit should they add up to more (events of a step that straddled a sync)."""
    measured = {p: s for p, s in phases.items() if p != "other"}
    total = sum(measured.values())
    if total > step_seconds:
        scale = step_seconds / total
        measured = {p: s * scale for p, s in measured.items()}
    return {**measured, "other": max(0.0, step_seconds - sum(measured.values()))}


def _float(value: torch.Tensor) -> torch.Tensor:
    """A 0-d tensor as float32, without an op where it is one already (the usual case)."""
    return value if value.dtype == torch.float32 else value.float()
