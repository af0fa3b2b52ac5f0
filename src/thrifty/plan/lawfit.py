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

torch (float64, autograd) is imported when a fit runs: importing thrifty.plan stays torch-free.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
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
DEFAULT_RESAMPLES = 1000  # tails within 5% of another run's on published data: docs/planner.md
MIN_RESAMPLES = 20
MAX_RESAMPLES = 100_000  # thrifty.plan.lawfile.MAX_RESAMPLES
SCREEN_ROWS = 256  # more runs: the grid is screened on this many of them
CHUNK = 50  # resamples screened together
ROBUST_CUT = 3.0  # scaled MADs from the median residual
MAD_SCALE = 1.4826  # a normal's standard deviation per median absolute deviation
INFLUENTIAL = 5
INFLUENCE_CANDIDATES = 64
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
Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Influence:
    """A run that drives the fit: left out, beta becomes `beta` and a (N* ~ C^a) `exponent`;
    `residual` is its predicted - observed ln L under the fit."""

    source: str
    residual: float
    beta: float
    exponent: float

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("source", "residual", "beta", "exponent")}


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
        descent = _Descent(points)
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
    points: Sequence[Point], descent: _Descent, best: torch.Tensor
) -> tuple[list[Point], _Descent, torch.Tensor, float, str]:
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
    refitted = _Descent(kept)
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
        self.flops = [p.flops for p in points]
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

    def ones(self, rows: int = 1) -> torch.Tensor:
        import torch

        return torch.ones(rows, self.xc.shape[0], dtype=torch.float64)

    def screened_rows(self) -> _Descent:
        """This descent on SCREEN_ROWS runs spread evenly over the runs ordered by compute
        (itself when there are no more), in the same centring: the grid's screen costs starts
        x these runs."""
        n = self.xc.shape[0]
        if n <= SCREEN_ROWS:
            return self
        order = sorted(range(n), key=lambda i: self.flops[i])
        picked = [order[round(k * (n - 1) / (SCREEN_ROWS - 1))] for k in range(SCREEN_ROWS)]
        part = copy.copy(self)
        part.xc, part.yc, part.z = self.xc[picked], self.yc[picked], self.z[picked]
        return part

    def fit(self) -> tuple[torch.Tensor, float, torch.Tensor]:
        """The lowest minimum from the grid (one row), its objective (the sum of Huber losses,
        not divided by delta) and the BOOTSTRAP_STARTS grid starts whose descents ended lowest."""
        import torch

        grid = self.grid()
        rows = self.screened_rows()
        screened, values = rows.descend(grid, rows.ones().expand(len(grid), -1), SCREEN_STEPS)
        order = torch.argsort(values)
        best, lowest = grid[:1], math.inf
        for row in order[:REFINED].tolist():
            theta, value = self.descend(screened[row : row + 1], self.ones(), REFINE_STEPS)
            if float(value[0]) < lowest:
                best, lowest = theta, float(value[0])
        if not math.isfinite(lowest):
            raise ConfigError("the fit did not converge from any start: check the runs' losses")
        return best, lowest * HUBER_DELTA, grid[order[:BOOTSTRAP_STARTS]]

    def objective(self, theta: torch.Tensor) -> float:
        """The sum of Huber losses at `theta` over every run."""
        import torch

        with torch.no_grad():
            return float(self.losses(theta, self.ones())[0]) * HUBER_DELTA

    def residuals(self, theta: torch.Tensor) -> list[float]:
        """Predicted - observed ln L of each run under `theta`."""
        import torch

        a, b, e, alpha, beta = (float(v) for v in theta.reshape(-1))
        with torch.no_grad():
            predicted = torch.logaddexp(
                torch.logaddexp(a - alpha * self.xc, b - beta * self.yc), torch.tensor(e)
            )
            return (predicted - self.z).tolist()

    def theta(self, constants: Constants) -> torch.Tensor:
        """The row (a', b', e, alpha, beta) of `constants` in this descent's centring."""
        import torch

        e, a, b, alpha, beta = constants
        row = [math.log(a) - alpha * self.x0, math.log(b) - beta * self.y0, math.log(e)]
        return torch.tensor([[*row, alpha, beta]], dtype=torch.float64)

    def bootstrap(
        self,
        best: torch.Tensor,
        starts: torch.Tensor,
        resamples: int,
        seed: int,
        tell: Progress = lambda _line: None,
    ) -> list[Constants]:
        """The constants fitted to each of `resamples` resamples of the runs, in chunks of
        CHUNK; a line to `tell` after each tenth of them."""
        samples: list[Constants] = []
        began, step = time.monotonic(), max(1, resamples // 10)
        for chunk in self.resample_weights(resamples, seed):
            for r, start in enumerate(self.chunk_starts(best, starts, chunk)):
                theta, _ = self.descend(start, chunk[r : r + 1], REFINE_STEPS)
                samples.append(self.constants(theta))
                done = len(samples)
                if done % step == 0 or done == resamples:
                    spent = time.monotonic() - began
                    left = spent / done * (resamples - done)
                    tell(
                        f"bootstrap: {done:,}/{resamples:,} resamples ({spent:.0f} s, about "
                        f"{left:.0f} s left)"
                    )
        return samples

    def chunk_starts(
        self, best: torch.Tensor, starts: torch.Tensor, weights: torch.Tensor
    ) -> list[torch.Tensor]:
        """Where each resample of `weights` is refined from: the best fit, or the lowest of
        the `starts` screened together, whichever is lower; on more than SCREEN_ROWS runs the
        best fit alone (a resample's minimum lies next to it)."""
        import torch

        count = len(weights)
        if self.xc.shape[0] > SCREEN_ROWS:
            return [best] * count
        k = len(starts)
        rows = starts.repeat(count, 1)  # resample r's starts are rows r*k ... r*k + k-1
        screened, values = self.descend(rows, weights.repeat_interleave(k, 0), SCREEN_STEPS)
        with torch.no_grad():
            at_best = self.losses(best.expand(count, -1), weights)
        chosen = []
        for r in range(count):
            row = r * k + int(torch.argmin(values[r * k : (r + 1) * k]))
            lower = float(at_best[r]) <= float(values[row])
            chosen.append(best if lower else screened[row : row + 1])
        return chosen

    def influence(self, best: torch.Tensor, sources: Sequence[str]) -> list[Influence]:
        """The INFLUENTIAL runs whose absence moves the exponent a most, each left out in turn
        and the law refitted from `best` (all at once, one batched L-BFGS)."""
        import torch

        residuals = self.residuals(best)
        candidates = self.influence_candidates(residuals)
        weights = self.ones(len(candidates))
        weights[range(len(candidates)), candidates] = 0.0
        theta, _ = self.descend(best.expand(len(candidates), -1), weights, REFINE_STEPS)
        exponent = _exponent(float(best[0, 3]), float(best[0, 4]))
        found = [
            Influence(
                source=sources[i],
                residual=residuals[i],
                beta=float(row[4]),
                exponent=_exponent(float(row[3]), float(row[4])),
            )
            for i, row in zip(candidates, theta.detach(), strict=True)
            if bool(torch.isfinite(row).all())
        ]
        found.sort(key=lambda f: -abs(f.exponent - exponent) if math.isfinite(f.exponent) else 0)
        return found[:INFLUENTIAL]

    def influence_candidates(self, residuals: list[float]) -> list[int]:
        """Every run, or on more than INFLUENCE_CANDIDATES: three quarters of them the largest
        residuals, the rest the furthest from the centre of (ln N, ln D)."""
        n = len(residuals)
        if n <= INFLUENCE_CANDIDATES:
            return list(range(n))
        by_residual = sorted(range(n), key=lambda i: -abs(residuals[i]))
        sx, sy = float(self.xc.std()) or 1.0, float(self.yc.std()) or 1.0
        reach = [
            float(x / sx) ** 2 + float(y / sy) ** 2 for x, y in zip(self.xc, self.yc, strict=True)
        ]
        by_reach = sorted(range(n), key=lambda i: -reach[i])
        chosen = by_residual[: INFLUENCE_CANDIDATES * 3 // 4]
        for i in by_reach:
            if len(chosen) == INFLUENCE_CANDIDATES:
                break
            if i not in chosen:
                chosen.append(i)
        return chosen

    def resample_weights(self, resamples: int, seed: int) -> Iterator[torch.Tensor]:
        """How many times each run is drawn, per resample: (at most CHUNK, runs) tensors, one
        chunk at a time (100,000 resamples of 20,000 runs would be 16 GB at once). A draw with
        one size or one length only is drawn again (alpha or beta would be arbitrary)."""
        import torch

        n = len(self.params)
        generator = torch.Generator().manual_seed(seed)
        rows: list[torch.Tensor] = []
        given, tries = 0, 0
        while given < resamples:
            if tries == 1000 * resamples:
                raise ConfigError(
                    "the bootstrap could not draw resamples with two sizes and two lengths"
                )
            tries += 1
            drawn = torch.randint(0, n, (n,), generator=generator)
            picked = drawn.tolist()
            if (
                len({self.params[i] for i in picked}) > 1
                and len({self.tokens[i] for i in picked}) > 1
            ):
                rows.append(torch.bincount(drawn, minlength=n))
                given += 1
                if len(rows) == CHUNK or given == resamples:
                    yield torch.stack(rows).to(torch.float64)
                    rows = []

    def constants(self, theta: torch.Tensor) -> Constants:
        a, b, e, alpha, beta = (float(v) for v in theta.reshape(-1))
        return (
            math.exp(e),
            math.exp(a + alpha * self.x0),
            math.exp(b + beta * self.y0),
            alpha,
            beta,
        )


def _exponent(alpha: float, beta: float) -> float:
    """a in N* ~ C^a: beta / (alpha + beta); NaN without an optimum."""
    return beta / (alpha + beta) if alpha + beta > 0 else math.nan


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
