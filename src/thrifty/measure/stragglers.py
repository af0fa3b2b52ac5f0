"""Stragglers: a rank whose own work is slower than the other ranks', which all of them then
wait for at every synchronous step.

What is compared. In a synchronous data-parallel step every rank ends the step together: the
fast ranks wait for the slowest at the gradient all-reduce (inside backward), at the step's
host-side agreement, and at the agreement that ends each window's fetch (whether the data ran
out anywhere). A rank's step time, its backward and even its data-wait phase therefore read
about the same on every rank and do not say which one held the others up. What differs is the
work a rank does between those waits, its *work seconds* per step:

- its **forward** (the timer's phase: device time on a GPU, the clock on a CPU), which under
  DDP makes no collective. Under FSDP the forward all-gathers parameters, so a fast rank waits
  there too, and the forward is left out;
- its **fetch**: host seconds from the step's start to its batches in hand, less the time the
  rank spent blocked in host-side agreements meanwhile (`data_seconds`). It is counted only
  where the caller can say how long its agreements blocked (`waited`, see
  `thrifty.measure.timing`); without that, a fast rank's wait for a slow loader would read as
  its own data wait, and data stragglers go unseen.

The rule. An interval's straggler is its slowest rank by work seconds; its lag is how far its
work exceeds the median of the *other* ranks' (with two ranks, the other rank's), in seconds
per step and as a fraction of the step the others would take without waiting for it (the
step time less the lag): how much longer it makes every step. A fraction of the step, not of
the work compared, so that a lag of a fraction of a millisecond in a tiny forward is no
straggler. Over a run, a rank is named a straggler when it is the slowest in more than half of
the intervals and its lag over the whole run, as a fraction, exceeds
`measure.straggler_threshold`.

What it costs: while the straggler works its lag, every other rank waits, so each measured step
leaves lag × (ranks − 1) GPU-seconds idle; in dollars at the run's price per GPU-hour.

Importing this module is cheap: torch loads only when ranks are gathered.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# A lag whose data part is at least this share of it is a loader's, not the accelerator's.
DATA_SHARE_OF_LAG = 0.5


@dataclass(frozen=True, slots=True)
class RankSeconds:
    """One logging interval's figures, per rank in rank order: seconds per measured step.
    `step`: the interval's seconds per measured step (alike on every rank: the step is
    synchronous). `data` is None where the fetch was not measured (then `work` is the forward
    alone)."""

    steps: int
    step: float
    work: tuple[float, ...]
    data: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class Lag:
    """The slowest rank of some figures and how far it trails the median of the others."""

    rank: int
    seconds: float  # per step, over the other ranks' median
    fraction: float  # seconds ÷ the step the others would take without waiting for it


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank the others waited for, interval after interval, and what that cost."""

    rank: int
    lag: float  # lag_seconds ÷ the step the others would take without waiting for it
    lag_seconds: float  # per measured step
    data_lag_seconds: float | None  # the part of lag_seconds that is fetching (None: unmeasured)
    slowest_intervals: int  # intervals in which it was the slowest rank
    intervals: int
    steps: int  # measured steps the figures cover
    ranks: int
    threshold: float  # measure.straggler_threshold
    idle_gpu_seconds: float  # the other ranks' wait for it over the measured steps
    usd: float | None  # idle_gpu_seconds at the run's price; None without a price

    @property
    def data_bound(self) -> bool:
        """Its lag is mostly fetching its data: a loader's problem, not the accelerator's."""
        data = self.data_lag_seconds
        return data is not None and data >= DATA_SHARE_OF_LAG * self.lag_seconds


def slowest(work: Sequence[float], step: float) -> Lag | None:
    """The slowest rank of `work` (seconds per step, rank order) and its lag over the median
    of the other ranks, as a fraction of `step` (seconds) less the lag; None with fewer than
    two ranks or when the others measured nothing."""
    if len(work) < 2:
        return None
    rank = max(range(len(work)), key=lambda r: work[r])  # the first of equals
    typical = statistics.median(w for r, w in enumerate(work) if r != rank)
    if typical <= 0:
        return None
    lag = work[rank] - typical
    # The others' step holds at least their own work, whatever the clocks said.
    return Lag(rank=rank, seconds=lag, fraction=lag / max(step - lag, typical))


def interval_record(figures: RankSeconds) -> dict[str, Any]:
    """What an interval's last metrics record carries: each rank's seconds per step and the
    slowest rank with its lag (a fraction of the other ranks' median, and seconds)."""
    ranks: dict[str, Any] = {"work_seconds": list(figures.work)}
    if figures.data is not None:
        ranks["data_seconds"] = list(figures.data)
    record: dict[str, Any] = {"ranks": ranks}
    lag = slowest(figures.work, figures.step)
    if lag is not None:
        record["straggler"] = {"rank": lag.rank, "lag": lag.fraction, "lag_seconds": lag.seconds}
    return record


def find_straggler(
    intervals: Sequence[RankSeconds],
    threshold: float,
    usd_per_gpu_hour: float | None = None,
) -> Straggler | None:
    """The rank named a straggler over `intervals` (see the module docstring for the rule),
    or None. `threshold`: the lag, as a fraction, it must exceed; `usd_per_gpu_hour` prices
    the other ranks' wait."""
    measured = [i for i in intervals if i.steps > 0]
    lags = [lag for i in measured if (lag := slowest(i.work, i.step)) is not None]
    if not lags:
        return None
    rank, count = Counter(lag.rank for lag in lags).most_common(1)[0]
    if 2 * count <= len(measured):
        return None
    weights = [i.steps for i in measured]
    steps = sum(weights)
    work = _run_means([i.work for i in measured], weights)
    step = _run_means([(i.step,) for i in measured], weights)[0]
    run = slowest(work, step)
    if run is None or run.rank != rank or run.fraction <= threshold:
        return None
    idle = run.seconds * steps * (len(work) - 1)
    return Straggler(
        rank=rank,
        lag=run.fraction,
        lag_seconds=run.seconds,
        data_lag_seconds=_data_lag(measured, rank),
        slowest_intervals=count,
        intervals=len(measured),
        steps=steps,
        ranks=len(work),
        threshold=threshold,
        idle_gpu_seconds=idle,
        usd=idle / 3600 * usd_per_gpu_hour if usd_per_gpu_hour is not None else None,
    )


def _run_means(rows: Sequence[Sequence[float]], steps: Sequence[int]) -> list[float]:
    """Per rank, the mean over the run of per-step figures given per interval."""
    total = sum(steps)
    ranks = range(len(rows[0]))
    return [sum(row[r] * n for row, n in zip(rows, steps, strict=True)) / total for r in ranks]


def _data_lag(measured: Sequence[RankSeconds], rank: int) -> float | None:
    """Seconds per step `rank` spent fetching beyond the other ranks' median."""
    rows = [i.data for i in measured]
    if any(row is None for row in rows):
        return None
    data = _run_means([row for row in rows if row is not None], [i.steps for i in measured])
    return data[rank] - statistics.median(d for r, d in enumerate(data) if r != rank)


def gather_ranks(values: torch.Tensor, world_size: int, group: Any = None) -> torch.Tensor:
    """Every rank's `values` (1-d, the same length everywhere) as rows in rank order: one
    all-gather on `group` (the data plane by default), on the tensor's own device."""
    import torch
    import torch.distributed as dist

    rows = [torch.empty_like(values) for _ in range(world_size)]
    dist.all_gather(rows, values, group=group)
    return torch.stack(rows)
