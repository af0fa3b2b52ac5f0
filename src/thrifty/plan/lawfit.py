"""Fit L(N, D) = E + A/N^alpha + B/D^beta to your own runs: Chinchilla's approach 3 as
Besiroglu et al. 2024 (arXiv 2404.10102) corrected it.

The fit works in log space, on a = ln A, b = ln B, e = ln E: a run of N parameters trained on
D tokens has predicted ln L = logsumexp(a - alpha*ln N, b - beta*ln D, e), and the objective
is the sum over the runs of the Huber loss (delta = 1e-3) of (predicted - observed ln L):
least squares on small residuals, absolute error on large ones, so one odd run does not drag
the fit. L-BFGS minimises it from every start of a grid (alpha, beta in {0, 0.5, 1, 1.5, 2};
e in {-1, -0.5, 0, 0.5, 1}; a, b in {0, 5, ..., 25}: 4,500 starts) and the lowest is kept.

All the grid's starts descend together for SCREEN_STEPS iterations, as one batch (the objective
is a sum over starts, so one tensor holds them all); the REFINED lowest then descend alone to
convergence. Alone, because one L-BFGS over a batch shares a line search and a curvature memory
among its starts: quick for sorting the starts, slow for finishing each of them.

Intervals come from the bootstrap: each resample draws the runs with replacement (drawn again
if it holds a single size or a single length), is fitted from the best fit and from the
BOOTSTRAP_STARTS grid starts that ended lowest, and its lowest minimum is refined alone. The
interval of a constant, or of anything computed from them (lawpredict), is the central
`confidence` share of its values over the resamples.

Cost. Both stages grow with runs x starts: on more than SCREEN_ROWS runs the grid is screened
on SCREEN_ROWS of them (an even spread of the runs ordered by compute, the same every time) and
the refinement uses every run; and each resample refines from the best fit alone, since with
that many runs a resample's minimum lies next to the whole fit's. The bootstrap runs in chunks
of CHUNK resamples, a progress line after each tenth of them.

Robust fit (`robust=True`). After the fit, the runs whose residual (predicted - observed ln L)
lies more than ROBUST_CUT scaled MADs (1.4826 x the median absolute deviation) from the median
residual (and more than HUBER_DELTA, 0.1%, from it) are left out and the law is fitted again on
the rest (refined from the fit), before the bootstrap; the runs left out are named in a note.

Influence. The runs that drive the fit are found by leaving each one out and fitting again
from the fit (one batched L-BFGS, all left-out fits at once): the INFLUENTIAL runs whose
absence moves the exponent a (N* ~ C^a) most are kept with the change of beta and of a. On
more than INFLUENCE_CANDIDATES runs, the candidates are those with the largest residuals and
the furthest from the centre of (ln N, ln D).

The grid, the descent and its constants (SCREEN_STEPS, REFINED, ...) are in
thrifty.plan.lawdescent. torch (float64, autograd) is imported when a fit runs: importing
thrifty.plan stays torch-free.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thrifty.errors import ConfigError
from thrifty.plan.chinchilla import LossFit
from thrifty.plan.lawdescent import (
    GRID_STARTS,
    HUBER_DELTA,
    REFINE_STEPS,
    SCREEN_ROWS,
    Constants,
    Descent,
    Influence,
    Progress,
)
from thrifty.plan.lawgroups import IsoFlop, isoflop_fit
from thrifty.plan.lawpoints import CONSTANTS, Point, check_points

if TYPE_CHECKING:
    import torch

DEFAULT_RESAMPLES = 1000  # tails within 5% of another run's on published data: docs/planner.md
MIN_RESAMPLES = 20
MAX_RESAMPLES = 100_000  # thrifty.plan.lawfile.MAX_RESAMPLES
ROBUST_CUT = 3.0  # scaled MADs from the median residual
MAD_SCALE = 1.4826  # a normal's standard deviation per median absolute deviation
CONFIDENCE = 0.95
LAW = "L(N, D) = E + A/N^alpha + B/D^beta"
METHOD = (
    f"Huber (delta {HUBER_DELTA:g}) on ln L, L-BFGS from {GRID_STARTS:,} starts (Besiroglu "
    "et al. 2024, arXiv 2404.10102); bootstrap percentile intervals"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranges:
    """The fitted runs' smallest and largest parameters, tokens, FLOPs (6*N*D) and loss."""

    params: tuple[float, float]
    tokens: tuple[float, float]
    flops: tuple[float, float]
    loss: tuple[float, float]

    @classmethod
    def of(cls, points: Sequence[Point]) -> Ranges:
        def span(values: list[float]) -> tuple[float, float]:
            return min(values), max(values)

        return cls(
            params=span([p.params for p in points]),
            tokens=span([p.tokens for p in points]),
            flops=span([p.flops for p in points]),
            loss=span([p.loss for p in points]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ScalingFit:
    """Constants fitted to your runs (`law`), each bootstrap resample's constants (`samples`,
    as E, A, B, alpha, beta), and what the fit saw: the number of runs, their ranges, where they
    came from, the objective reached and approach 2's exponent where the runs allow it."""

    law: LossFit
    samples: list[Constants]
    confidence: float
    seed: int
    points: int
    ranges: Ranges
    sources: list[str]
    objective: float
    isoflop: IsoFlop | None = None
    notes: list[str] = field(default_factory=list)
    influence: list[Influence] = field(default_factory=list)
    robust: bool = False

    @property
    def exponent(self) -> float:
        """a in N* ∝ C^a: beta / (alpha + beta); NaN where alpha + beta <= 0 (no optimum)."""
        total = self.law.alpha + self.law.beta
        return self.law.beta / total if total > 0 else math.nan

    def values(self, name: str) -> list[float]:
        """`name` (a constant, or 'exponent') over the bootstrap resamples."""
        if name == "exponent":
            return [s[4] / (s[3] + s[4]) for s in self.samples if s[3] + s[4] > 0]
        return [s[CONSTANTS.index(name)] for s in self.samples]

    def interval(self, name: str) -> tuple[float, float]:
        """The bootstrap interval of a constant or of 'exponent'."""
        return percentile_interval(self.values(name), self.confidence)

    def agreement(self) -> str | None:
        """Approach 2's exponent beside approach 3's interval, in words; None without it."""
        iso = self.isoflop
        if iso is None or iso.exponent is None:
            return None
        low, high = self.interval("exponent")
        share = f"{self.confidence:.0%}"
        if low <= iso.exponent <= high:
            return f"they agree: {iso.exponent:.3f} lies in approach 3's {share} interval"
        gap = iso.exponent - self.exponent
        return (
            f"they differ by {gap:+.3f}: {iso.exponent:.3f} lies outside approach 3's {share} "
            f"interval [{low:.3f}, {high:.3f}]; check the IsoFLOP groups' minima and the runs' "
            "schedules"
        )


def fit_scaling_law(
    points: Sequence[Point],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
    sources: Sequence[str] = (),
    notes: Sequence[str] = (),
    robust: bool = False,
    progress: Progress | None = None,
) -> ScalingFit:
    """Fit E, A, B, alpha, beta to `points` with `resamples` bootstrap resamples drawn with
    `seed`; `sources` (the paths read) and `notes` are kept with the fit. `robust` leaves out
    the runs with extreme residuals and fits again (module docstring); `progress` receives a
    line at each stage and each tenth of the bootstrap."""
    check_points(points)
    if not MIN_RESAMPLES <= resamples <= MAX_RESAMPLES:
        raise ConfigError(
            f"bootstrap must be at least {MIN_RESAMPLES} resamples for a {confidence:.0%} "
            f"interval and at most {MAX_RESAMPLES:,} (its cost grows with runs x resamples), got "
            f"{resamples:,} (default {DEFAULT_RESAMPLES})"
        )
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be a fraction in (0, 1), got {confidence!r}")
    if not 0 <= seed < 2**63:
        raise ConfigError(f"seed must be a whole number from 0 to 2**63 - 1, got {seed}")
    tell = progress or (lambda _line: None)
    notes = list(notes)
    with _one_thread():
        descent = Descent(points)
        screened = f" (the grid screened on {SCREEN_ROWS})" if len(points) > SCREEN_ROWS else ""
        tell(f"fitting {len(points):,} runs from {GRID_STARTS:,} starts{screened}")
        best, objective, starts = descent.fit()
        if robust:
            points, descent, best, objective, note = _trimmed(points, descent, best)
            notes.append(note)
        tell(f"bootstrap: {resamples:,} resamples of {len(points):,} runs")
        samples = descent.bootstrap(best, starts, resamples, seed, tell)
        influence = descent.influence(best, [p.source for p in points])
    iso = isoflop_fit(points)
    return ScalingFit(
        law=LossFit(*descent.constants(best), source="fitted now"),
        samples=samples,
        confidence=confidence,
        seed=seed,
        points=len(points),
        ranges=Ranges.of(points),
        sources=list(sources),
        objective=objective,
        isoflop=iso,
        notes=notes,
        influence=influence,
        robust=robust,
    )


def _trimmed(
    points: Sequence[Point], descent: Descent, best: torch.Tensor
) -> tuple[list[Point], Descent, torch.Tensor, float, str]:
    """The runs kept by the robust rule, their descent, the fit refined on them from `best`,
    its objective and a note naming the runs left out."""
    residuals = descent.residuals(best)
    middle = sorted(residuals)[len(residuals) // 2]
    spread = MAD_SCALE * sorted(abs(r - middle) for r in residuals)[len(residuals) // 2]
    cut = max(ROBUST_CUT * spread, HUBER_DELTA)  # runs that agree to 0.1% are never outliers
    out = [i for i, r in enumerate(residuals) if abs(r - middle) > cut]
    rule = (
        f"robust: runs whose residual in ln L lies over {ROBUST_CUT:g} scaled MADs "
        f"({cut:.3g}) from the median ({middle:+.3g}) are left out"
    )
    if not out:
        return list(points), descent, best, descent.objective(best), f"{rule}: none is"
    kept = [p for i, p in enumerate(points) if i not in set(out)]
    check_points(kept, what="the runs the robust rule keeps")
    refitted = Descent(kept)
    start = refitted.theta(descent.constants(best))
    theta, value = refitted.descend(start, refitted.ones(), REFINE_STEPS)
    named = ", ".join(points[i].source for i in out[:5]) + (", ..." if len(out) > 5 else "")
    note = f"{rule}: {len(out)} of {len(points)} ({named}); fitted again on the rest"
    return kept, refitted, theta, float(value[0]) * HUBER_DELTA, note


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread while the fit runs: its tensors hold thousands of numbers, where
    more threads cost more in handing work out than they save (many times over on a busy
    machine)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def percentile_interval(values: Sequence[float], confidence: float) -> tuple[float, float]:
    """The central `confidence` share of `values` (linear interpolation between order
    statistics); NaN for no values."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if not ordered:
        return math.nan, math.nan
    tail = (1.0 - confidence) / 2.0
    return _quantile(ordered, tail), _quantile(ordered, 1.0 - tail)


def _quantile(ordered: list[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def fit_as_dict(fit: ScalingFit) -> dict[str, Any]:
    """Everything a table or a saved fit shows, as JSON-ready values."""
    law = fit.law
    names = (*CONSTANTS, "exponent")
    ranges = fit.ranges
    return {
        "law": LAW,
        "method": METHOD,
        "constants": {n: getattr(law, n) for n in CONSTANTS},
        "exponent": fit.exponent,
        "intervals": {n: list(fit.interval(n)) for n in names},
        "confidence": fit.confidence,
        "bootstrap": {
            "resamples": len(fit.samples),
            "seed": fit.seed,
            "samples": [list(s) for s in fit.samples],
        },
        "points": {
            "count": fit.points,
            "params": list(ranges.params),
            "tokens": list(ranges.tokens),
            "flops": list(ranges.flops),
            "loss": list(ranges.loss),
        },
        "sources": fit.sources,
        "objective": fit.objective,
        "approach2": None if fit.isoflop is None else fit.isoflop.as_dict(),
        "approaches_agree": fit.agreement(),
        "notes": fit.notes,
        "robust": fit.robust,
        "influence": [i.as_dict() for i in fit.influence],
    }
