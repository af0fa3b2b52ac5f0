"""What a scaling law fitted to your runs predicts for a budget: N*, D*, tokens per parameter and
the loss, each with an interval, and how far the prediction reaches beyond the fitted runs.

N* is the closed form the published fits use (chinchilla.optimal_params), D* = C / (6*N*), and
the loss is the law at (N*, D*). Each is also computed with every bootstrap resample's
constants; the interval is the central `confidence` share of those values.

Reach. A fit knows only the runs it saw. Every prediction says how far it lies outside them:
N* against the fitted runs' parameter counts, D* against their tokens, C against their
6*N*D (a factor of 1 means inside). The bootstrap widens with that distance on its own (an
exponent's error is multiplied by the log of the distance) but it measures only the scatter of
the fitted runs, not whether the law's form still holds out there. So each interval is widened
further, in log space about the prediction, by the factor

    w = 1 + 0.5 * log10(reach),   reach = the largest of the three factors,

x1 inside the fitted range, x1.5 at 10x, x2 at 100x, x2.5 at 1000x: a convention, not a
statistic, and printed beside the interval. Beyond 100x a one-line warning says so.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from thrifty.errors import ConfigError
from thrifty.plan.chinchilla import LossFit, optimal_params
from thrifty.plan.lawfit import Ranges, ScalingFit, percentile_interval
from thrifty.plan.units import fmt_count, require_positive

WARN_REACH = 100.0  # beyond this factor outside the fitted range: a warning
WIDEN_PER_DECADE = 0.5
QUANTITIES = ("params", "tokens", "tokens_per_param", "loss")


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """The compute-optimal allocation of `flops` FLOPs by a fitted law: `params` (N*),
    `tokens` (D*) and the predicted `loss` (nats per token). `intervals` are the bootstrap's
    (`bootstrap_intervals`) widened by `widening` for the `reach` outside the fitted runs."""

    flops: float
    params: float
    tokens: float
    loss: float
    intervals: dict[str, tuple[float, float]]
    bootstrap_intervals: dict[str, tuple[float, float]]
    confidence: float
    reach: float
    widening: float
    reach_line: str
    warning: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "tokens_per_param": self.tokens_per_param}


def predict(fit: ScalingFit, flops: float) -> Prediction:
    """N*, D*, D*/N* and the loss for `flops` FLOPs under `fit`, with intervals and reach."""
    flops = require_positive(flops, "compute budget (FLOPs)")
    law = fit.law
    if law.alpha <= 0 or law.beta <= 0:
        what = "model size (alpha" if law.alpha <= 0 else "tokens (beta"
        value = law.alpha if law.alpha <= 0 else law.beta
        raise ConfigError(
            f"the fitted law has no compute-optimal size: its loss does not fall with {what} "
            f"= {value:.3g}); add runs that span more sizes and lengths"
        )
    point = _allocation(law, flops)
    if point is None:
        raise ConfigError(
            f"the fitted law's optimum for {flops:.3g} FLOPs is out of a float's range (alpha "
            f"{law.alpha:.3g}, beta {law.beta:.3g}); add runs that span more sizes and lengths"
        )
    values: dict[str, list[float]] = {q: [] for q in QUANTITIES}
    skipped = 0
    for sample in fit.samples:
        resampled = LossFit(*sample, source="bootstrap resample")
        allocation = (
            _allocation(resampled, flops) if resampled.alpha > 0 and resampled.beta > 0 else None
        )
        if allocation is None:
            skipped += 1
            continue
        for q, v in allocation.items():
            values[q].append(v)
    raw = {q: percentile_interval(values[q], fit.confidence) for q in QUANTITIES}
    reach, line = reach_of(fit.ranges, point["params"], point["tokens"], flops)
    widening = 1.0 + WIDEN_PER_DECADE * math.log10(reach)
    share = f"{fit.confidence:.0%} bootstrap percentiles over {len(fit.samples)} resamples"
    if reach == 1.0:
        notes = [f"intervals: {share}; inside the fitted range, so not widened"]
    else:
        notes = [
            f"intervals: {share}, widened x{widening:.2f} in log space for a reach of "
            f"{_times(reach)} (1 + {WIDEN_PER_DECADE:g}*log10 of the reach)"
        ]
    if skipped:
        notes.append(
            f"{skipped} of {len(fit.samples)} resamples had alpha or beta <= 0 (no optimum, or "
            "one out of a float's range) and are left out of the intervals"
        )
    return Prediction(
        flops=flops,
        params=point["params"],
        tokens=point["tokens"],
        loss=point["loss"],
        intervals={q: _widen(point[q], raw[q], widening) for q in QUANTITIES},
        bootstrap_intervals=raw,
        confidence=fit.confidence,
        reach=reach,
        widening=widening,
        reach_line=line,
        warning=_warning(fit.ranges, point["params"], point["tokens"], flops),
        notes=notes,
    )


def _allocation(law: LossFit, flops: float) -> dict[str, float] | None:
    """N*, D*, D*/N* and the loss of `law` for `flops`; None where one is out of a float's
    range (an exponent near 0 sends N* to 0 or to infinity)."""
    try:
        params = optimal_params(flops, law)
        tokens = flops / (6.0 * params)
        values = {
            "params": params,
            "tokens": tokens,
            "tokens_per_param": tokens / params,
            "loss": law.loss(params, tokens),
        }
    except (ZeroDivisionError, OverflowError):
        return None
    good = all(math.isfinite(v) and v > 0 for v in values.values())
    return values if good else None


@dataclass(frozen=True, slots=True)
class _Extent:
    """One quantity of a prediction beside the fitted runs' span of it."""

    name: str  # N*, D* or C
    value: float
    span: tuple[float, float]
    what: str  # "run's N", "run's D", "budget"

    @property
    def factor(self) -> float:
        """How far `value` lies outside `span`, as a factor >= 1 (1: inside)."""
        low, high = self.span
        return (
            self.value / high
            if self.value > high
            else low / self.value
            if self.value < low
            else 1.0
        )

    def words(self) -> str:
        low, high = (f"{v:.3g}" if self.name == "C" else fmt_count(v) for v in self.span)
        if self.value > self.span[1]:
            return f"{self.name} is {_times(self.factor)} the largest fitted {self.what} ({high})"
        if self.value < self.span[0]:
            return f"{self.name} is {_times(self.factor)} below the smallest fitted {self.what} ({low})"
        return f"{self.name} lies within the fitted runs ({low} to {high})"


def _extents(ranges: Ranges, params: float, tokens: float, flops: float) -> list[_Extent]:
    return [
        _Extent("N*", params, ranges.params, "run's N"),
        _Extent("D*", tokens, ranges.tokens, "run's D"),
        _Extent("C", flops, ranges.flops, "budget"),
    ]


def reach_of(ranges: Ranges, params: float, tokens: float, flops: float) -> tuple[float, str]:
    """The furthest factor outside the fitted range among N*, D* and C, and a line saying how
    far each reaches: "N* is 40x the largest fitted run's N (1B); ..."."""
    extents = _extents(ranges, params, tokens, flops)
    return max(e.factor for e in extents), "; ".join(e.words() for e in extents)


def _warning(ranges: Ranges, params: float, tokens: float, flops: float) -> str | None:
    far = [e for e in _extents(ranges, params, tokens, flops) if e.factor > WARN_REACH]
    if not far:
        return None
    which = " and ".join(f"{e.name} {_times(e.factor)}" for e in far)
    return (
        f"warning: this prediction reaches beyond {WARN_REACH:.0f}x of the fitted range "
        f"({which} outside it): the law is extrapolated far past its runs; add larger runs"
    )


def _times(factor: float) -> str:
    """A factor as people write it: 2.66x, 40.1x, 1,667x."""
    return f"{factor:.3g}x" if factor < 100 else f"{factor:,.0f}x"


def _widen(point: float, interval: tuple[float, float], factor: float) -> tuple[float, float]:
    """Stretch `interval` about `point` in log space by `factor` (it then holds the point)."""
    low, high = interval
    if factor == 1.0 or not (math.isfinite(low) and math.isfinite(high)):
        return low, high
    low = point * (min(low, point) / point) ** factor
    high = point * (max(high, point) / point) ** factor
    return low, high
