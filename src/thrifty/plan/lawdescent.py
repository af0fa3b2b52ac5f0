"""The descent behind `thrifty.plan.lawfit`: the Huber objective of L(N, D) = E + A/N^alpha +
B/D^beta over the runs in torch float64, L-BFGS on it from the grid's starts (screened together,
the lowest refined alone), the bootstrap's resamples and the leave-one-out fits that find the
influential runs. `thrifty.plan.lawfit` describes the method and the constants below.

torch is imported inside each method: importing this module stays torch-free.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thrifty.errors import ConfigError
from thrifty.plan.lawpoints import Point

if TYPE_CHECKING:
    import torch

GRID_EXPONENTS = (0.0, 0.5, 1.0, 1.5, 2.0)  # alpha and beta
GRID_E = (-1.0, -0.5, 0.0, 0.5, 1.0)  # ln E
GRID_AB = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)  # ln A and ln B
GRID_STARTS = len(GRID_EXPONENTS) ** 2 * len(GRID_E) * len(GRID_AB) ** 2
HUBER_DELTA = 1e-3
SCREEN_ROWS = 256  # more runs: the grid is screened on this many of them
CHUNK = 50  # resamples screened together
INFLUENTIAL = 5
INFLUENCE_CANDIDATES = 64
SCREEN_STEPS = 50
REFINE_STEPS = 500
REFINED = 4
BOOTSTRAP_STARTS = 3

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


class Descent:
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

    def screened_rows(self) -> Descent:
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
