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

torch (float64, autograd) is imported when a fit runs: importing thrifty.plan stays torch-free.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thrifty.errors import ConfigError
from thrifty.plan.chinchilla import LossFit
from thrifty.plan.lawgroups import IsoFlop, isoflop_fit
from thrifty.plan.lawpoints import CONSTANTS, Point, check_points

if TYPE_CHECKING:
    import torch

GRID_EXPONENTS = (0.0, 0.5, 1.0, 1.5, 2.0)  # alpha and beta
GRID_E = (-1.0, -0.5, 0.0, 0.5, 1.0)  # ln E
GRID_AB = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)  # ln A and ln B
HUBER_DELTA = 1e-3
DEFAULT_RESAMPLES = 200
MIN_RESAMPLES = 20
CONFIDENCE = 0.95
SCREEN_STEPS = 50
REFINE_STEPS = 500
REFINED = 4
BOOTSTRAP_STARTS = 3
LAW = "L(N, D) = E + A/N^alpha + B/D^beta"
GRID_STARTS = len(GRID_EXPONENTS) ** 2 * len(GRID_E) * len(GRID_AB) ** 2
METHOD = (
    f"Huber (delta {HUBER_DELTA:g}) on ln L, L-BFGS from {GRID_STARTS:,} starts (Besiroglu "
    "et al. 2024, arXiv 2404.10102); bootstrap percentile intervals"
)

Constants = tuple[float, float, float, float, float]  # E, A, B, alpha, beta


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
) -> ScalingFit:
    """Fit E, A, B, alpha, beta to `points` with `resamples` bootstrap resamples drawn with
    `seed`; `sources` (the paths read) and `notes` are kept with the fit."""
    check_points(points)
    if not MIN_RESAMPLES <= resamples:
        raise ConfigError(
            f"bootstrap must be at least {MIN_RESAMPLES} resamples for a {confidence:.0%} "
            f"interval, got {resamples} (default {DEFAULT_RESAMPLES})"
        )
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be a fraction in (0, 1), got {confidence!r}")
    if not 0 <= seed < 2**63:
        raise ConfigError(f"seed must be a whole number from 0 to 2**63 - 1, got {seed}")
    with _one_thread():
        descent = _Descent(points)
        best, objective, starts = descent.fit()
        samples = descent.bootstrap(best, starts, resamples, seed)
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
        notes=list(notes),
    )


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


class _Descent:
    """The objective over the runs in torch float64, and L-BFGS on it.

    Internally a and b are centred: a' = a - alpha*mean(ln N), b' = b - beta*mean(ln D). It is
    the same model, but a' and alpha are no longer nearly collinear (ln N spans ~16 to ~21),
    which L-BFGS needs to converge in tens of steps rather than hundreds."""

    def __init__(self, points: Sequence[Point]) -> None:
        import torch

        f64 = torch.float64
        self.params = [p.params for p in points]
        self.tokens = [p.tokens for p in points]
        x = torch.tensor([math.log(v) for v in self.params], dtype=f64)
        y = torch.tensor([math.log(v) for v in self.tokens], dtype=f64)
        self.z = torch.tensor([math.log(p.loss) for p in points], dtype=f64)
        self.x0, self.y0 = float(x.mean()), float(y.mean())
        self.xc, self.yc = x - self.x0, y - self.y0

    def losses(self, theta: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The objective of each row of `theta` (a', b', e, alpha, beta) over the runs weighted
        by that row of `weights`, divided by delta so that its scale is that of |residual|."""
        import torch

        a, b, e, alpha, beta = (v[:, None] for v in theta.unbind(1))
        # logsumexp of the three terms, as two logaddexp: fewer autograd nodes per step
        predicted = torch.logaddexp(torch.logaddexp(a - alpha * self.xc, b - beta * self.yc), e)
        r = (predicted - self.z).abs()
        delta = HUBER_DELTA
        huber = torch.where(r <= delta, 0.5 * r * r / delta, r - 0.5 * delta)
        return (huber * weights).sum(1)

    def descend(
        self, starts: torch.Tensor, weights: torch.Tensor, steps: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """L-BFGS from every row of `starts` at once (their objectives summed) for at most
        `steps` iterations; the rows reached and each row's objective (inf if not finite)."""
        import torch

        theta = starts.clone().requires_grad_(True)
        lbfgs = torch.optim.LBFGS(
            [theta],
            lr=1.0,
            max_iter=steps,
            tolerance_grad=1e-9,
            tolerance_change=1e-12,
            history_size=20,
            line_search_fn="strong_wolfe",
        )

        def closure() -> torch.Tensor:
            lbfgs.zero_grad()
            value = self.losses(theta, weights).sum()
            value.backward()
            return value

        lbfgs.step(closure)
        with torch.no_grad():
            reached = theta.detach()
            values = self.losses(reached, weights)
        return reached, torch.where(torch.isfinite(values), values, math.inf)

    def grid(self) -> torch.Tensor:
        import torch

        rows = [
            [a - alpha * self.x0, b - beta * self.y0, e, alpha, beta]
            for alpha, beta, e, a, b in itertools.product(
                GRID_EXPONENTS, GRID_EXPONENTS, GRID_E, GRID_AB, GRID_AB
            )
        ]
        return torch.tensor(rows, dtype=torch.float64)

    def fit(self) -> tuple[torch.Tensor, float, torch.Tensor]:
        """The lowest minimum from the grid (one row), its objective (the sum of Huber losses,
        not divided by delta) and the BOOTSTRAP_STARTS grid starts whose descents ended lowest."""
        import torch

        grid = self.grid()
        weights = torch.ones(1, self.xc.shape[0], dtype=torch.float64)
        screened, values = self.descend(grid, weights.expand(len(grid), -1), SCREEN_STEPS)
        order = torch.argsort(values)
        best, lowest = grid[:1], math.inf
        for row in order[:REFINED].tolist():
            theta, value = self.descend(screened[row : row + 1], weights, REFINE_STEPS)
            if float(value[0]) < lowest:
                best, lowest = theta, float(value[0])
        if not math.isfinite(lowest):
            raise ConfigError("the fit did not converge from any start: check the runs' losses")
        return best, lowest * HUBER_DELTA, grid[order[:BOOTSTRAP_STARTS]]

    def bootstrap(
        self, best: torch.Tensor, starts: torch.Tensor, resamples: int, seed: int
    ) -> list[Constants]:
        """The constants fitted to each of `resamples` resamples of the runs."""
        import torch

        weights = self.resample_weights(resamples, seed)
        k = len(starts)
        rows = starts.repeat(resamples, 1)  # resample r's starts are rows r*k ... r*k + k-1
        screened, values = self.descend(rows, weights.repeat_interleave(k, 0), SCREEN_STEPS)
        at_best = self.losses(best.expand(resamples, -1), weights)
        samples = []
        for r in range(resamples):
            row = r * k + int(torch.argmin(values[r * k : (r + 1) * k]))
            start = best if float(at_best[r]) <= float(values[row]) else screened[row : row + 1]
            theta, _ = self.descend(start, weights[r : r + 1], REFINE_STEPS)
            samples.append(self.constants(theta))
        return samples

    def resample_weights(self, resamples: int, seed: int) -> torch.Tensor:
        """How many times each run is drawn, per resample: a (resamples, runs) tensor. A draw
        with one size or one length only is drawn again (alpha or beta would be arbitrary)."""
        import torch

        n = len(self.params)
        generator = torch.Generator().manual_seed(seed)
        rows: list[torch.Tensor] = []
        for _ in range(1000 * resamples):
            drawn = torch.randint(0, n, (n,), generator=generator)
            picked = drawn.tolist()
            if (
                len({self.params[i] for i in picked}) > 1
                and len({self.tokens[i] for i in picked}) > 1
            ):
                rows.append(torch.bincount(drawn, minlength=n))
                if len(rows) == resamples:
                    return torch.stack(rows).to(torch.float64)
        raise ConfigError("the bootstrap could not draw resamples with two sizes and two lengths")

    def constants(self, theta: torch.Tensor) -> Constants:
        a, b, e, alpha, beta = (float(v) for v in theta.reshape(-1))
        return (
            math.exp(e),
            math.exp(a + alpha * self.x0),
            math.exp(b + beta * self.y0),
            alpha,
            beta,
        )


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
    }
