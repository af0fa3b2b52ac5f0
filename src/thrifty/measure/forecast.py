"""Forecast the validation loss at the end of the budget, and stop a run that cannot reach a target.

The curve is a saturating power law in optimizer steps, L(t) = a + b·t^(−c) with a, b ≥ 0 and c
in [0.01, 4]: `a` is the loss the run approaches, `b·t^(−c)` what is still to gain. It is fitted
with numpy alone: for each c on a log-spaced grid, (a, b) is a constrained linear least-squares
problem with a closed form, and the c with the smallest squared error wins.

The band is a parametric bootstrap: the fitted curve plus Gaussian noise, refitted (all three
parameters) a few hundred times with a fixed seed. The noise level of each replica is drawn from
its uncertainty (σ² = SSE / χ²(n − 3)), so a forecast from a handful of evaluations, whose
residuals say little about the noise, gets the wide band it deserves. Refitting c in every
replica matters: a short curve fits almost equally well with a low asymptote and a small
exponent as with a high asymptote and a large one, and that trade-off, not the noise of the last
point, is what makes a forecast far past the data uncertain.

`cannot_reach` stops a run only when even the optimistic edge of the band misses the target by
more than a margin, three forecasts in a row. It decides nothing before `min_evals`
evaluations, while the curve is not clearly falling (a plateau may still break), while the
latest evaluations bend away from the fit, or once the target has been reached. The margin is
there because the fit sees only the curve so far: a learning-rate decay (thrifty's default
cosine schedule) buys an extra drop near the end that no power law fitted before it can see.

Units: steps are optimizer steps (positive); losses are whatever the validation loss measures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from thrifty.errors import ConfigError, ThriftyError

Floats = Sequence[float] | np.ndarray  # evaluation steps or losses, as a list or an array

# Exponents tried. Below 0.01 the law is indistinguishable from a log-linear trend; above 4 the
# gain is over within a few evaluations. A ratio of ~1.04 between neighbours moves a forecast far
# less than the band is wide, so no refinement between grid points is needed.
_EXPONENTS = np.geomspace(0.01, 4.0, 160)
_PARAMETERS = 3
# Share of the evaluations' variation the fitted curve must explain before it is trusted to
# extrapolate. A real validation curve is smooth next to its drop; a plateau, pure noise or a
# curve that turns back up fails this.
MIN_EXPLAINED = 0.9
BOOTSTRAP_SAMPLES = 400


@dataclass(frozen=True, slots=True)
class PowerLaw:
    """L(t) = a + b·t^(−c), t in optimizer steps."""

    a: float
    b: float
    c: float

    def __call__(self, steps: float | np.ndarray) -> np.ndarray:
        return self.a + self.b * np.power(np.asarray(steps, dtype=float), -self.c)


@dataclass(frozen=True, slots=True)
class Forecast:
    """The loss expected at `at_step` and its band (`confidence`, two-sided)."""

    at_step: int
    value: float
    low: float
    high: float
    confidence: float
    params: PowerLaw
    explained: float  # R² of the fit: share of the evaluations' variation it explains
    evaluations: int

    def describe(self) -> str:
        """For a summary: "2.41 at step 10000 (95% band 2.35–2.48)"."""
        return (
            f"{self.value:.4g} at step {self.at_step} "
            f"({self.confidence:.0%} band {self.low:.4g}–{self.high:.4g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "at_step": self.at_step,
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "params": {"a": self.params.a, "b": self.params.b, "c": self.params.c},
            "explained": self.explained,
            "evaluations": self.evaluations,
        }


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether to stop, and why (one line either way). Truthy when the run should stop."""

    stop: bool
    reason: str
    forecast: Forecast | None = None

    def __bool__(self) -> bool:
        return self.stop


# --------------------------------------------------------------------------------------------
# Fitting


def _as_curve(steps: Floats, losses: Floats) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(steps, dtype=float).ravel()
    y = np.asarray(losses, dtype=float).ravel()
    if t.shape != y.shape:
        raise ThriftyError(f"forecast needs one loss per step: got {t.size} steps, {y.size} losses")
    if t.size and not (np.all(np.isfinite(t)) and t.min() > 0):
        raise ThriftyError("forecast needs steps greater than 0 (optimizer steps, counted from 1)")
    return t, y


def _fit_grid(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Best (a, b ≥ 0) for every curve in `y` (rows) and exponent in `x` (rows of s^−c).

    Returns a, b and the squared error, each shaped (curves, exponents). Works from sums only
    (n·curves·exponents multiply-adds), so hundreds of bootstrap curves cost milliseconds.
    """
    n = x.shape[1]
    sx, sxx = x.sum(1)[None, :], (x * x).sum(1)[None, :]
    sy, syy = y.sum(1)[:, None], (y * y).sum(1)[:, None]
    sxy = y @ x.T

    def sse(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return syy - 2 * a * sy - 2 * b * sxy + n * a * a + 2 * a * b * sx + b * b * sxx

    # The error is a convex quadratic in (a, b): either the free optimum is feasible, or the
    # constrained one lies on the edge a = 0 or the edge b = 0. Try all three, keep the best.
    var_x = np.maximum(sxx - sx * sx / n, 1e-300)
    b_free = (sxy - sx * sy / n) / var_x
    a_free = (sy - b_free * sx) / n
    a_edge = np.broadcast_to(np.maximum(sy / n, 0.0), b_free.shape)  # b = 0: a constant
    b_edge = np.maximum(sxy / sxx, 0.0)  # a = 0: a pure power law
    zero = np.zeros_like(b_free)
    candidates = [
        (a_free, b_free, np.where((a_free >= 0) & (b_free >= 0), sse(a_free, b_free), np.inf)),
        (a_edge, zero, sse(a_edge, zero)),
        (zero, b_edge, sse(zero, b_edge)),
    ]
    best = np.argmin(np.stack([c[2] for c in candidates]), axis=0)
    pick = [np.choose(best, [c[i] for c in candidates]) for i in range(3)]
    return pick[0], pick[1], np.maximum(pick[2], 0.0)


def _fit_many(t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, c) per row of `y`, for steps `t` scaled so the last step is 1 (then b is the
    loss still to gain at the last evaluation, and powers of large step counts stay tame)."""
    scale = t.max()
    x = np.power(t[None, :] / scale, -_EXPONENTS[:, None])
    a, b, err = _fit_grid(x, y)
    k = np.argmin(err, axis=1)
    rows = np.arange(y.shape[0])
    c = _EXPONENTS[k]
    return a[rows, k], b[rows, k] * np.power(scale, c), c


def fit_power_law(steps: Floats, losses: Floats) -> PowerLaw:
    """The least-squares L(t) = a + b·t^(−c), a ≥ 0, b ≥ 0, 0.01 ≤ c ≤ 4 (steps > 0)."""
    t, y = _as_curve(steps, losses)
    if t.size < _PARAMETERS:
        raise ThriftyError(f"forecast needs at least {_PARAMETERS} evaluations, got {t.size}")
    a, b, c = _fit_many(t, y[None, :])
    return PowerLaw(float(a[0]), float(b[0]), float(c[0]))


def _explained(y: np.ndarray, fitted: np.ndarray) -> float:
    total = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - fitted) ** 2)) / total if total > 0 else 0.0


def forecast(
    steps: Floats,
    losses: Floats,
    at_step: int,
    *,
    confidence: float = 0.95,
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> Forecast:
    """The loss at `at_step` (optimizer steps) from the evaluations so far, with a band.

    `confidence`: the band's two-sided coverage, e.g. 0.95 for the 2.5%–97.5% quantiles of
    `samples` bootstrap refits. Seeded: the same evaluations always give the same forecast.
    Needs at least four evaluations (three parameters and one to spare).
    """
    t, y = _as_curve(steps, losses)
    if t.size <= _PARAMETERS:
        raise ThriftyError(f"forecast needs at least {_PARAMETERS + 1} evaluations, got {t.size}")
    if not np.all(np.isfinite(y)):
        raise ThriftyError("forecast needs finite losses: drop the NaN or infinite evaluations")
    if not 0 < confidence < 1:
        raise ThriftyError(f"forecast confidence = {confidence!r} is invalid: must be in (0, 1)")
    law = fit_power_law(t, y)
    fitted = law(t)
    rng = np.random.default_rng(seed)
    dof = t.size - _PARAMETERS
    sse = max(float(np.sum((y - fitted) ** 2)), 1e-24)
    sigma = np.sqrt(sse / rng.chisquare(dof, samples))
    replicas = fitted[None, :] + rng.normal(0.0, 1.0, (samples, t.size)) * sigma[:, None]
    a, b, c = _fit_many(t, replicas)
    spread = a + b * np.power(float(at_step), -c)
    tail = (1 - confidence) / 2
    value = float(law(at_step))
    return Forecast(
        at_step=int(at_step),
        value=value,
        low=min(value, float(np.quantile(spread, tail))),
        high=max(value, float(np.quantile(spread, 1 - tail))),
        confidence=confidence,
        params=law,
        explained=_explained(y, fitted),
        evaluations=int(t.size),
    )


# --------------------------------------------------------------------------------------------
# Deciding


# Forecasts in a row that must all miss the target before a run stops: one noisy evaluation
# can tilt a fit, three consecutive ones rarely all tilt the same way.
CONFIRMATIONS = 3


def cannot_reach(
    steps: Floats,
    losses: Floats,
    target: float,
    end_step: int,
    *,
    min_evals: int = 5,
    confidence: float = 0.99,
    margin: float = 0.05,
) -> Decision:
    """Stop when the validation loss forecast at `end_step` (optimizer steps) cannot reach `target`.

    True only when the optimistic edge of the band (`low`) misses the target by more than
    `margin` (a fraction of the target) in the last three forecasts in a row, the first of them
    from at least `min_evals` evaluations (so the earliest stop comes at `min_evals + 2`).
    Decides nothing (False, with the reason) while a loss is not finite or below 0, once the
    target has been reached, while the power law explains less than 90% of the evaluations'
    variation (a plateau, noise: no trend to extrapolate) or while the latest evaluations sit
    above the fit (the curve is turning back up).
    `margin` allows for what no fit to the curve so far can see, above all the extra drop a
    learning-rate decay gives near the end of a run.
    """
    t, y = _as_curve(steps, losses)
    waiting = _why_no_forecast(t, y, target, end_step, min_evals)
    if waiting is not None:
        return Decision(False, waiting)
    untrusted = _why_not_trusted(t, y, fit_power_law(t, y))
    if untrusted is not None:
        return Decision(False, untrusted)
    result = forecast(t, y, end_step, confidence=confidence)
    bar = target * (1 + margin)
    if result.low <= bar:
        return Decision(
            False, f"forecast {result.describe()} can reach the target {target:g}", result
        )
    earlier = (
        forecast(t[:-k], y[:-k], end_step, confidence=confidence) for k in range(1, CONFIRMATIONS)
    )
    if any(f.low <= bar for f in earlier):
        return Decision(
            False,
            f"forecast {result.describe()} misses the target {target:g}; waiting for "
            f"{CONFIRMATIONS} forecasts in a row to agree",
            result,
        )
    return Decision(True, f"forecast {result.describe()} stays above the target {target:g}", result)


def _why_not_trusted(t: np.ndarray, y: np.ndarray, law: PowerLaw) -> str | None:
    """Why the fitted law may not be extrapolated, or None when it may."""
    residuals = y - law(t)
    explained = _explained(y, law(t))
    if explained < MIN_EXPLAINED:
        return (
            f"the validation loss is not falling steadily: the power law explains "
            f"{explained:.0%} of it (needs {MIN_EXPLAINED:.0%}); no decision yet"
        )
    # The last three evaluations above the fit by more than two standard errors: the curve is
    # bending away from the law (turning back up), so its forecast means nothing.
    noise = math.sqrt(float(np.sum(residuals**2)) / (t.size - _PARAMETERS))
    noise = max(noise, 1e-9 * float(np.abs(y).max()))  # a clean curve leaves rounding only
    recent = residuals[-3:]
    if float(recent.mean()) > 2 * noise / math.sqrt(recent.size):
        return (
            "the latest validation losses sit above the fitted curve (the loss is turning back "
            "up, which a power law cannot describe); no decision"
        )
    return None


def _why_no_forecast(
    t: np.ndarray, y: np.ndarray, target: float, end_step: int, min_evals: int
) -> str | None:
    needed = max(min_evals, _PARAMETERS + 1) + CONFIRMATIONS - 1
    if t.size < needed:
        return f"{t.size} of {needed} evaluations needed before a forecast can stop the run"
    if not np.all(np.isfinite(y)):
        return "a validation loss is not finite: no forecast"
    if y.min() < 0:
        return "a validation loss is below 0: the power law assumes losses of 0 or more"
    if y.min() <= target:
        return f"the target {target:g} has been reached ({y.min():.4g})"
    if end_step <= t.max():
        return f"no steps left to forecast (end {end_step}, now {t.max():.0f})"
    return None


def require_validation(target: float | None, has_validation: bool) -> None:
    """Raise when `early_stopping.target` is set but there is no validation data to forecast."""
    if target is not None and not has_validation:
        raise ConfigError(
            f"early_stopping.target = {target!r} needs validation data: pass val_data to the "
            "Trainer (or set task.val_data), or remove early_stopping.target"
        )
