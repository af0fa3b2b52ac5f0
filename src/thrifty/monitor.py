"""What a run reports while it trains and when it ends: per-step metrics (flushed with one host
sync per logging interval), throughput, MFU, system load, dollars, and the diagnosis.
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

import torch

from thrifty.instrument import NullTimer
from thrifty.measure.evidence import PHASES
from thrifty.measure.peak import Peak
from thrifty.progress import ProgressBar
from thrifty.rundir import MetricsLog

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
        self.step_times: list[float] = []
        self.system: list[dict[str, float]] = []
        self.train_loss = math.nan
        self._skip = exclude_steps

    def add(self, record: dict[str, Any], raw_phases: Any) -> None:
        """Buffer one step; tensors in it are read at the next flush."""
        record["_phases"] = raw_phases
        self.pending.append(record)
        self.meter.add(record["step_seconds"], record["samples_in_step"], record["tokens_in_step"])

    def flush(self, elapsed_seconds: float, samples: int, tokens: int) -> None:
        """Write the buffered steps: one host sync for the whole interval."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        losses_t = torch.stack([r["loss"].float() for r in pending])
        if self.reduce is not None:  # every rank's loss, averaged: one collective per flush
            self.reduce(losses_t)
        norms_t = [r["grad_norm"].float() for r in pending if r["grad_norm"] is not None]
        values = torch.cat([losses_t, *(n.reshape(1) for n in norms_t)]).tolist()
        losses, norms = values[: len(pending)], iter(values[len(pending) :])
        for record, loss in zip(pending, losses, strict=True):
            record["loss"] = loss
            if record["grad_norm"] is not None:
                record["grad_norm"] = next(norms)
            phases = self.timer.resolve(record.pop("_phases"))
            record.pop("samples_in_step")
            record.pop("tokens_in_step")
            if phases is not None:
                phases["other"] = max(0.0, record["step_seconds"] - sum(phases.values()))
                record["breakdown"] = phases
                if self._skip > 0:
                    self._skip -= 1
                else:
                    for phase, seconds in phases.items():
                        self.phase_totals[phase] += seconds
                    self.step_times.append(record["step_seconds"])
        last = pending[-1]
        interval = sum(r["step_seconds"] for r in pending)
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

    @property
    def mfu(self) -> float | None:
        if not (self.flops_per_step and self.peak and self.step_times):
            return None
        return self.flops_per_step / statistics.mean(self.step_times) / self.peak.flops_per_second

    def mean_phases(self) -> dict[str, float] | None:
        n = len(self.step_times)
        return {p: s / n for p, s in self.phase_totals.items()} if n else None

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
            **{f"{p}_seconds": v for p, v in phases.items() if p != "other"},
            flops_per_step=self.flops_per_step,
            mfu=self.mfu,
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
