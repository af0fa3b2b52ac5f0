"""Paired measurements: how `thrifty tune` tells a real speed-up from a machine whose throughput
drifts.

A candidate (B) is measured against the incumbent (A, the best setting so far) in alternating
trial processes, A B A B ... A: every B run sits between two A runs. Each round's ratio is
B's throughput over the geometric mean of the A runs on either side of it, so a drift of the
machine's speed that is steady over the three runs (a neighbour's job ramping up or down)
cancels out of the ratio; only the noise faster than a run remains.

The ratio reported is the geometric mean of the rounds' ratios, with its 90% interval (Student
t on the logarithms). Neighbouring ratios share an A run, so the interval is widened by
sqrt(1 + (n - 1) / 3n), the effect of that sharing when A and B runs are equally noisy.

A candidate is kept when its interval lies above 1.0 and it is at least MIN_GAIN faster;
it has "no gain" when the interval lies below 1 + MIN_GAIN. Anything else is undecided: more
rounds are run (MIN_ROUNDS to MAX_ROUNDS) while the budget allows, and a comparison still
undecided after MAX_ROUNDS is one the machine is too noisy for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.90
MIN_GAIN = 0.02  # a change that buys less than 2% is not worth making
MIN_ROUNDS = 2  # the fewest ratios an interval comes from
MAX_ROUNDS = 6

# Student t's 95th percentile (a two-sided 90% interval) by degrees of freedom.
_T90 = (
    6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
    1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
)  # fmt: skip
_Z90 = 1.645

KEPT, NO_GAIN, UNDECIDED = "kept", "no gain", "undecided"


@dataclass(frozen=True, slots=True)
class Estimate:
    """B's throughput over A's: `ratio` (the geometric mean of `rounds` paired ratios) and its
    90% interval `low`..`high`."""

    ratio: float
    low: float
    high: float
    rounds: int

    def describe(self) -> str:
        """ "1.18x (1.10–1.27)" """
        return f"{self.ratio:.2f}x ({self.low:.2f}–{self.high:.2f})"

    def verdict(self, min_gain: float = MIN_GAIN) -> str:
        """kept (a gain beyond the noise, of `min_gain` or more), no gain (it cannot be a
        gain of `min_gain`), or undecided."""
        if self.low > 1.0 and self.ratio >= 1.0 + min_gain:
            return KEPT
        if self.high < 1.0 + min_gain:
            return NO_GAIN
        return UNDECIDED

    def to_dict(self) -> dict[str, float | int]:
        return {
            "ratio": self.ratio,
            "low": self.low,
            "high": self.high,
            "rounds": self.rounds,
            "confidence": CONFIDENCE,
        }


def bracketed_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Each B run's rate over the geometric mean of the A runs before and after it: `a` holds
    A's rates in the order run (one more than `b`: A B A ... B A), `b` B's rates. A B run
    without its closing A run yet is left out."""
    return [
        b[i] / math.sqrt(a[i] * a[i + 1])
        for i in range(min(len(b), len(a) - 1))
        if a[i] > 0 and a[i + 1] > 0
    ]


def estimate(ratios: Sequence[float]) -> Estimate | None:
    """The geometric mean of `ratios` with its 90% interval; None below two ratios."""
    n = len(ratios)
    if n < 2 or any(r <= 0 for r in ratios):
        return None
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / n
    variance = sum((x - mean) ** 2 for x in logs) / (n - 1)
    shared = 1.0 + (n - 1) / (3.0 * n)  # neighbouring ratios share an A run
    half = t90(n - 1) * math.sqrt(variance * shared / n)
    return Estimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def t90(df: int) -> float:
    """Student t's 95th percentile for `df` degrees of freedom (1 or more)."""
    return _T90[df - 1] if df <= len(_T90) else _Z90


def spread(rates: Sequence[float]) -> float:
    """How far apart runs of one setting came out: the largest rate over the smallest (1.0
    for identical runs)."""
    positive = [r for r in rates if r > 0]
    return max(positive) / min(positive) if len(positive) > 1 else 1.0
