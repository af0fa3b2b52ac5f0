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
from collections.abc import Callable
from typing import Any

import torch

from thrifty.measure.evidence import PHASES
from thrifty.measure.peak import Peak
from thrifty.measure.progress import ProgressBar
from thrifty.measure.spread import WindowSpread
from thrifty.measure.stragglers import RankSeconds, find_straggler, interval_record
from thrifty.measure.timing import NullTimer
from thrifty.rundir.files import MetricsLog

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
        gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
        work_phases: tuple[str, ...] = ("forward",),
        straggler_threshold: float = 0.15,
    ) -> None:
        # Several ranks: `gather` returns every rank's 1-d tensor as rows, in rank order;
        # `work_phases` are the phases in which a rank waits for no other (stragglers.py).
        self.gather = gather
        self.work_phases = work_phases
        self.straggler_threshold = straggler_threshold
        self.rank_intervals: list[RankSeconds] = []
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
        self.spread = WindowSpread()  # per-interval means: the noise of the figures above
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
        self.progress.step(record["step"])

    def flush(self, elapsed_seconds: float, samples: int, tokens: int) -> list[dict[str, Any]]:
        """Write the buffered steps: one host sync for the whole interval (and, with several
        ranks, one collective). Returns the steps' records, their tensors read (`skipped`: the
        guard left the step out)."""
        if not self.pending:
            return []
        pending, self.pending = self.pending, []
        raws = [r.pop("_phases") for r in pending]
        phases = [self.timer.resolve(raw) for raw in raws]
        measured = self._measured(phases)
        ranks = self._read(pending, raws, phases, measured)
        weights = [
            sum(p.values()) if p is not None else r["step_seconds"]
            for p, r in zip(phases, pending, strict=True)
        ]
        interval = self._interval_seconds(weights)
        seconds = _apportion(interval, weights)
        for i, record in enumerate(pending):
            record["step_seconds"] = seconds[i]
            self.meter.add(seconds[i], record.pop("samples_in_step"), record.pop("tokens_in_step"))
            phase = phases[i]
            if phase is not None:
                record["breakdown"] = _fit_to_step(phase, seconds[i])
                self._count(record["breakdown"], self.timer.busy(raws[i]), seconds[i])
        self.spread.close_window(self.phase_totals, self.step_times)
        last = pending[-1]
        if ranks is not None:
            step = sum(seconds[i] for i in measured) / len(measured)
            figures = RankSeconds(len(measured), step, *ranks)
            self.rank_intervals.append(figures)
            last.update(interval_record(figures))
        if self.flops_per_step and self.peak and interval > 0:
            last["mfu"] = self.flops_per_step * len(pending) / interval / self.peak.flops_per_second
        if self.sampler is not None:
            system = self.sampler.summary_and_reset()
            if system:
                last["system"] = system
                self.system.append(system)
        usd_text = self._cost(last, elapsed_seconds, samples, tokens)
        self.metrics.write(pending)
        self.train_loss = last["loss"]
        self.progress.update(
            last["step"],
            last["loss"],
            self.meter.tokens_per_second,
            self.meter.samples_per_second,
            usd_text,
        )
        return pending

    def _read(
        self, pending: list[dict[str, Any]], raws: list[Any], phases: list[Any], measured: list[int]
    ) -> tuple[tuple[float, ...], tuple[float, ...] | None] | None:
        """Read the interval's tensors into its records with one host sync: losses (averaged
        over the ranks), gradient norms, the guard's verdicts. With several ranks the losses
        travel with this rank's seconds in one all-gather, and every rank's seconds per step
        come back: work and fetch (None with one rank, or when no step was measured)."""
        losses_t = torch.stack([_float(r["loss"]) for r in pending])
        n = len(pending)
        mine = self._own_seconds([raws[i] for i in measured], [phases[i] for i in measured])
        ranks_t = None
        if self.gather is not None:  # one collective per flush, carrying losses and seconds
            own = torch.tensor([mine[0], mine[1] or 0.0], device=losses_t.device)
            rows = self.gather(torch.cat([losses_t, own]))
            # The mean of the ranks' losses, summed in rank order: as an all-reduce's mean.
            losses_t, ranks_t = rows[:, :n].sum(0) / rows.shape[0], rows[:, n:].flatten()
        norms_t = [_float(r["grad_norm"]) for r in pending if r["grad_norm"] is not None]
        skips_t = [_float(s) for r in pending if isinstance(s := r.get("skipped"), torch.Tensor)]
        read = norms_t + skips_t
        parts = [losses_t, *([torch.stack(read)] if read else [])]
        if ranks_t is not None:
            parts.append(ranks_t)
        # This is a CPU-GPU sync point: every step of the interval has finished on the device.
        values = torch.cat(parts).tolist()
        rest = iter(values[n:])
        for record, loss in zip(pending, values[:n], strict=True):
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
        compared = self.work_phases or mine[1] is not None  # FSDP compares the fetch alone
        if ranks_t is None or not measured or not compared:
            return None
        figures = list(rest)
        work, data = tuple(figures[0::2]), tuple(figures[1::2])
        return work, data if mine[1] is not None else None

    def _measured(self, phases: list[Any]) -> list[int]:
        """The steps of the interval whose phases were measured, the warm-up left out."""
        timed = [i for i, phase in enumerate(phases) if phase is not None]
        return timed[self._skip :]

    def _own_seconds(
        self, raws: list[Any], phases: list[dict[str, float]]
    ) -> tuple[float, float | None]:
        """This rank's own work per step over the measured steps (`raws`, `phases`), as
        `thrifty.measure.stragglers` compares it: (work seconds, fetch seconds or None where
        the fetch is not measured); zeros when no step was measured."""
        if not raws:
            return 0.0, None
        work, fetched, measured_fetch = 0.0, 0.0, True
        for raw, phase in zip(raws, phases, strict=True):
            fetch = self.timer.fetch(raw)
            measured_fetch = measured_fetch and fetch is not None
            work += sum(phase[p] for p in self.work_phases) + (fetch or 0.0)
            fetched += fetch or 0.0
        n = len(raws)
        return work / n, fetched / n if measured_fetch else None

    def _cost(self, last: dict[str, Any], elapsed: float, samples: int, tokens: int) -> str:
        """The dollar meter's figures on the interval's last record; its progress-bar text."""
        if self.cost is None:
            return ""
        snap = self.cost.update(elapsed, tokens, samples)
        last["cost"] = snap.to_dict()
        fraction = self.budget_fraction() if self.budget_fraction else None
        if fraction:
            last["cost"]["projected"] = self.cost.project(fraction).to_dict()
        return str(snap.describe())

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
            load_per_cpu=system.get("load_per_cpu_mean"),
            steal_percent=system.get("steal_percent_mean"),
            step_swing=self.spread.swing,
            rank_work_seconds=self._rank_means(),
            straggler=self.straggler(),
            spread_seconds=self.spread.spread(self.step_times),
            spread_windows=self.spread.windows,
            **context,
        )
        return diagnose(evidence)

    def _rank_means(self) -> tuple[float, ...] | None:
        """Each rank's own work per measured step over the run (several ranks), or None."""
        intervals = self.rank_intervals
        steps = sum(i.steps for i in intervals)
        if not steps:
            return None
        ranks = range(len(intervals[0].work))
        return tuple(sum(i.work[r] * i.steps for i in intervals) / steps for r in ranks)

    def straggler(self) -> Any:
        """The rank the others waited for over the run so far (`stragglers.Straggler`), priced
        at the run's cost per GPU-hour where it has one; None when there is none."""
        price = self.cost.usd_per_hour / self.cost.gpus if self.cost is not None else None
        return find_straggler(self.rank_intervals, self.straggler_threshold, price)

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
