"""Chinchilla's approach 2 on your own runs: IsoFLOP groups, a parabola each, then N* = k*C^a.

Runs of equal compute C = 6*N*D (within 5%) form an IsoFLOP group. Within a group the loss is a
valley in log N: a parabola L = c0 + c1*u + c2*u^2 (u = ln N) fitted to it has its minimum at
N*(C) = exp(-c1 / (2*c2)). Across groups, ln N* = ln k + a*ln C is a straight line. Its slope
`a` is what approach 3 (the parametric fit) predicts as beta/(alpha+beta), measured without
assuming the form of L, so the two should agree.

A group is used when it has runs of at least 3 sizes, its parabola curves up (c2 > 0) and its
minimum lies within the sizes run (a minimum outside them is an extrapolation of the parabola);
the exponent needs at least 2 groups used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from thrifty.plan.lawpoints import Point

GROUP_TOLERANCE = 0.05  # C within 5% of the group's smallest: one IsoFLOP budget
MIN_SIZES = 3
MIN_GROUPS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class IsoFlopGroup:
    """One budget: its compute (FLOPs, geometric mean of its runs'), the number of distinct
    sizes, N* at the parabola's minimum (parameters), or why the group was not used."""

    flops: float
    sizes: int
    params_opt: float | None
    skipped: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class IsoFlop:
    """Approach 2's result: N* = coefficient * C^exponent over the groups used; `exponent` is
    None (and `why` says why) when fewer than 2 groups could be used."""

    groups: list[IsoFlopGroup]
    exponent: float | None
    coefficient: float | None
    exponent_se: float | None  # the slope's standard error, with 3 groups or more
    why: str = ""

    @property
    def used(self) -> list[IsoFlopGroup]:
        return [g for g in self.groups if g.params_opt is not None]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def isoflop_fit(points: Sequence[Point], tolerance: float = GROUP_TOLERANCE) -> IsoFlop:
    """Approach 2 on `points`: group them by C = 6*N*D within `tolerance`, fit a parabola of
    loss in ln N per group, then the power law N*(C) across the groups."""
    groups = [_group_optimum(g) for g in _groups(points, tolerance)]
    groups = [g for g in groups if g.sizes >= MIN_SIZES]  # the rest are not IsoFLOP profiles
    used = [g for g in groups if g.params_opt is not None]
    if len(used) < MIN_GROUPS:
        why = (
            f"needs {MIN_GROUPS} IsoFLOP groups (runs of equal 6*N*D within {tolerance:.0%}, "
            f"{MIN_SIZES} sizes or more each, loss lowest inside the sizes run); the runs form "
            f"{len(groups)} group(s) of {MIN_SIZES} sizes or more, {len(used)} with the minimum "
            "inside"
        )
        return IsoFlop(groups=groups, exponent=None, coefficient=None, exponent_se=None, why=why)
    xs = [math.log(g.flops) for g in used]
    ys = [math.log(g.params_opt) for g in used if g.params_opt is not None]
    slope, intercept, se = _line(xs, ys)
    return IsoFlop(groups=groups, exponent=slope, coefficient=math.exp(intercept), exponent_se=se)


def _groups(points: Sequence[Point], tolerance: float) -> list[list[Point]]:
    """Points sorted by compute, cut wherever one exceeds its group's first by `tolerance`."""
    groups: list[list[Point]] = []
    for p in sorted(points, key=lambda p: p.flops):
        if groups and p.flops <= groups[-1][0].flops * (1.0 + tolerance):
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def _group_optimum(group: list[Point]) -> IsoFlopGroup:
    flops = math.exp(sum(math.log(p.flops) for p in group) / len(group))
    sizes = len({p.params for p in group})
    if sizes < MIN_SIZES:
        return IsoFlopGroup(
            flops=flops, sizes=sizes, params_opt=None, skipped=f"{sizes} size(s), needs 3"
        )
    logs = [math.log(p.params) for p in group]
    centre = sum(logs) / len(logs)
    c0, c1, c2 = _parabola([u - centre for u in logs], [p.loss for p in group])
    if c2 <= 0:
        return IsoFlopGroup(flops=flops, sizes=sizes, params_opt=None, skipped="no minimum")
    vertex = -c1 / (2.0 * c2) + centre
    if not min(logs) <= vertex <= max(logs):
        return IsoFlopGroup(
            flops=flops, sizes=sizes, params_opt=None, skipped="minimum outside the sizes run"
        )
    return IsoFlopGroup(flops=flops, sizes=sizes, params_opt=math.exp(vertex))


def _parabola(u: list[float], y: list[float]) -> tuple[float, float, float]:
    """Least-squares c0 + c1*u + c2*u^2 through (u, y): the 3x3 normal equations, solved."""
    s = [sum(ui**k for ui in u) for k in range(5)]
    t = [sum(yi * ui**k for ui, yi in zip(u, y, strict=True)) for k in range(3)]
    matrix = [[s[i + j] for j in range(3)] + [t[i]] for i in range(3)]
    for col in range(3):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, 3), key=lambda r: abs(matrix[r][col]))
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        if matrix[col][col] == 0:
            return 0.0, 0.0, 0.0  # degenerate (cannot happen with 3 distinct sizes)
        for row in range(col + 1, 3):
            factor = matrix[row][col] / matrix[col][col]
            matrix[row] = [a - factor * b for a, b in zip(matrix[row], matrix[col], strict=True)]
    coef = [0.0, 0.0, 0.0]
    for row in (2, 1, 0):
        rest = sum(matrix[row][j] * coef[j] for j in range(row + 1, 3))
        coef[row] = (matrix[row][3] - rest) / matrix[row][row]
    return coef[0], coef[1], coef[2]


def _line(xs: list[float], ys: list[float]) -> tuple[float, float, float | None]:
    """Least-squares slope, intercept and the slope's standard error (None with 2 points)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    if n < 3:
        return slope, intercept, None
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, intercept, math.sqrt(residual / (n - 2) / sxx)
