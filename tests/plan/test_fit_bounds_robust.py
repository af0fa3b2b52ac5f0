"""`thrifty plan fit` names the runs that drive the fit (leaving each out moves the optimum's
exponent most) and, with --robust, leaves out the runs whose residuals are extreme: on
synthetic runs of a known law, the runs named are the outliers planted in them."""

from __future__ import annotations

from pathlib import Path

import pytest

from plan.test_lawfit import SIZES, grid_points, true_loss  # tests/ is on the path
from plan.test_plan_fit_cli import write_csv
from thrifty.plan.lawpoints import Point


def planted(tokens: float, excess: float, sizes: tuple[float, ...] = SIZES) -> list[Point]:
    """One run of each size at `tokens` whose loss is `excess` times the law's: five outliers,
    like Chinchilla's five high-loss runs of large models at the smallest budget."""
    return [Point(n, tokens, true_loss(n, tokens) * excess, "planted") for n in sizes]


def test_the_runs_named_as_driving_the_fit_are_the_planted_outliers(cli, tmp_path: Path) -> None:
    # five high-loss runs of large models, shorter than every other run: together they pull
    # beta from 0.37 to 0.60, and the fit follows them (their residuals are small)
    outliers = planted(6e7, 1.25, sizes=(1e8, 2e8, 3e8, 6e8, 1e9))
    csv = write_csv(tmp_path / "runs.csv", grid_points() + outliers)
    r = cli("plan", "fit", str(csv), "--bootstrap", "20")
    assert r.code == 0, r.err
    driving = [line for line in r.out.splitlines() if "driven by:" in line]
    assert len(driving) == 5
    # the header is line 1 and the 30 grid runs lines 2 to 31: the planted ones are 32 to 36
    named = sorted(int(line.split(" line ")[1].split()[0]) for line in driving)
    assert named == [32, 33, 34, 35, 36]
    for line in driving:  # without any one of them, beta falls back near the law's 0.3658
        after = float(line.split("beta ")[1].split(" -> ")[1].split(",")[0])
        assert after == pytest.approx(0.37, abs=0.01)


def test_robust_leaves_out_the_planted_outliers_and_recovers_the_clean_fit(cli, tmp_path) -> None:
    clean = grid_points(seed=0) + grid_points(seed=1)
    csv = write_csv(tmp_path / "runs.csv", clean + planted(1e8, 1.2))  # lines 62 to 66
    robust = cli("plan", "fit", str(csv), "--bootstrap", "20", "--robust", "--json").json()["fit"]
    note = next(n for n in robust["notes"] if n.startswith("robust:"))
    assert "are left out: 5 of 65 (" in note
    left_out = note.split("5 of 65 (")[1].split(")")[0].split(", ")
    assert left_out == [f"{csv} line {k}" for k in range(62, 67)]
    alone = write_csv(tmp_path / "clean.csv", clean)
    expected = cli("plan", "fit", str(alone), "--bootstrap", "20", "--json").json()["fit"]
    for name in ("E", "A", "B", "alpha", "beta"):
        assert robust["constants"][name] == pytest.approx(expected["constants"][name], rel=1e-4)
    assert robust["robust"] is True and robust["points"]["count"] == 60
