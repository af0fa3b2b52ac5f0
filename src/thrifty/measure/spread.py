"""How much a run's per-step figures move: the noise a diagnosis weighs each gain against.

The noise of a figure (a phase's seconds per step, or the step's) is the standard deviation of
its mean over each logging interval, weighted by the interval's steps. Interval means are what
the run already has at each flush: its running totals, less those at the previous flush — so
this costs a few additions per interval and nothing per step, and slow drifts (a neighbour on
the machine, a throttled clock) count as noise where a per-step spread would average them away.

The step's figure leaves checkpoint saves out: a save every N steps makes the intervals that
hold one longer, which is its period, not noise (the diagnosis weighs saves on their own).

With fewer than two intervals there is no spread between them; the step time's per-step
standard deviation then stands for every figure (cautious: one step's spread, not a mean's).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence


class _WeightedStats:
    """Running weighted mean and variance (West's algorithm): constant memory."""

    def __init__(self) -> None:
        self.weight = 0.0
        self.mean = 0.0
        self.sum_squares = 0.0
        self.count = 0

    def add(self, value: float, weight: float) -> None:
        self.count += 1
        self.weight += weight
        delta = value - self.mean
        self.mean += delta * weight / self.weight
        self.sum_squares += weight * delta * (value - self.mean)

    def std(self) -> float:
        """Weighted standard deviation, with Bessel's correction for the number of values."""
        if self.count < 2 or self.weight <= 0:
            return 0.0
        variance = self.sum_squares / self.weight * self.count / (self.count - 1)
        return math.sqrt(max(0.0, variance))


class WindowSpread:
    """The spread of per-step figures across logging intervals; `close_window` at each flush."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = {}
        self._steps = 0
        self._stats: dict[str, _WeightedStats] = {}
        self.windows = 0  # intervals with at least one counted step
        self.fastest = math.inf  # the lowest and highest mean step (seconds) of an interval
        self.slowest = 0.0

    def close_window(self, phase_totals: Mapping[str, float], step_times: Sequence[float]) -> None:
        """Close an interval. `phase_totals`: seconds per phase summed over every counted step
        so far; `step_times`: seconds of each counted step so far (only the new ones are read)."""
        steps = len(step_times)
        n = steps - self._steps
        if n <= 0:  # only warm-up steps, or the breakdown is off
            return
        means = {p: (t - self._totals.get(p, 0.0)) / n for p, t in phase_totals.items()}
        means["step"] = math.fsum(step_times[self._steps :]) / n - means.get("checkpoint", 0.0)
        for name, mean in means.items():
            self._stats.setdefault(name, _WeightedStats()).add(mean, n)
        self._totals, self._steps = dict(phase_totals), steps
        self.windows += 1
        self.fastest = min(self.fastest, means["step"])
        self.slowest = max(self.slowest, means["step"])

    @property
    def swing(self) -> float | None:
        """The slowest interval's mean step over the fastest's (two intervals or more)."""
        if self.windows < 2 or not self.fastest > 0:
            return None
        return self.slowest / self.fastest

    def spread(self, step_times: Sequence[float]) -> dict[str, float] | None:
        """Seconds of noise per figure (each phase, and "step"), or None with no way to tell
        (a single step measured)."""
        if self.windows >= 2:
            return {name: stats.std() for name, stats in self._stats.items()}
        if len(step_times) < 2:
            return None
        per_step = statistics.stdev(step_times)
        return dict.fromkeys([*self._stats, "step"], per_step)
