"""Fitting L(N, D) = E + A/N^alpha + B/D^beta to your own runs: the fit recovers known constants,
approach 2 recovers the optimum's exponent, predictions state their reach, runs are read from
CSV files and run directories, and a saved fit reads back the same."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from thrifty.errors import ConfigError
from thrifty.plan.chinchilla import FITS, chinchilla
from thrifty.plan.lawfile import load_fit, save_fit
from thrifty.plan.lawfit import ScalingFit, fit_scaling_law
from thrifty.plan.lawgroups import IsoFlop, IsoFlopGroup, isoflop_fit
from thrifty.plan.lawpoints import Point, read_points
from thrifty.plan.lawpredict import predict

TRUE = FITS["epoch"]  # Besiroglu et al. 2024: E=1.8172, A=482.01, B=2085.43, 0.3478, 0.3658
SIZES = (1e7, 3e7, 1e8, 3e8, 1e9)
LENGTHS = (1e8, 4e8, 1.6e9, 6.4e9, 2.5e10, 1e11)


def true_loss(params: float, tokens: float) -> float:
    return TRUE.loss(params, tokens)


def grid_points(noise: float = 0.005, seed: int = 0) -> list[Point]:
    """5 sizes x 6 lengths with lognormal noise of `noise` (0.5%: runs repeated with other seeds
    scatter about that much)."""
    rng = random.Random(seed)
    return [
        Point(n, d, true_loss(n, d) * rng.lognormvariate(0.0, noise), f"run n={n:g} d={d:g}")
        for n in SIZES
        for d in LENGTHS
    ]


def isoflop_points(noise: float = 0.002, seed: int = 0) -> list[Point]:
    """Four IsoFLOP budgets, 7 sizes each from N*/8 to 8*N* of the true law."""
    rng = random.Random(seed)
    points = []
    for flops in (1e17, 1e18, 1e19, 1e20):
        best = chinchilla(flops, fit="epoch").params
        for k in (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8):
            n, d = best * k, flops / (6 * best * k)
            points.append(Point(n, d, true_loss(n, d) * rng.lognormvariate(0.0, noise), "iso"))
    return points


@pytest.fixture(scope="module")
def fitted() -> ScalingFit:
    return fit_scaling_law(grid_points(), resamples=100, seed=0, sources=["synthetic"])


def test_the_fit_recovers_every_true_constant_within_its_interval(fitted: ScalingFit) -> None:
    for name in ("E", "A", "B", "alpha", "beta"):
        low, high = fitted.interval(name)
        assert low <= getattr(TRUE, name) <= high, (name, low, high)
    assert fitted.law.alpha == pytest.approx(TRUE.alpha, abs=0.03)
    assert fitted.law.beta == pytest.approx(TRUE.beta, abs=0.03)
    low, high = fitted.interval("alpha")
    assert high - low < 0.1  # an interval that says something


def test_the_fitted_optimum_at_1e21_flops_is_within_25_percent_of_the_true_one(
    fitted: ScalingFit,
) -> None:
    truth = chinchilla(1e21, fit="epoch")
    p = predict(fitted, 1e21)
    assert p.params == pytest.approx(truth.params, rel=0.25)
    assert p.intervals["params"][0] <= truth.params <= p.intervals["params"][1]
    assert 6 * p.params * p.tokens == pytest.approx(1e21)


def test_the_fit_is_the_same_for_the_same_seed() -> None:
    points = grid_points(seed=3)[::2]  # 15 runs: quick
    one = fit_scaling_law(points, resamples=20, seed=7)
    two = fit_scaling_law(points, resamples=20, seed=7)
    assert one.samples == two.samples and one.law == two.law


def test_approach_2_on_isoflop_groups_finds_the_true_exponent() -> None:
    iso = isoflop_fit(isoflop_points())
    assert iso.exponent is not None and len(iso.used) == 4
    assert iso.exponent == pytest.approx(TRUE.beta / (TRUE.alpha + TRUE.beta), abs=0.01)
    for group in iso.used:  # each parabola's minimum near the true N* of its budget
        assert group.params_opt == pytest.approx(chinchilla(group.flops).params, rel=0.15)


def test_approach_2_needs_two_groups_of_three_sizes(fitted: ScalingFit) -> None:
    iso = isoflop_fit(grid_points())  # a grid of sizes x lengths: no equal budgets
    assert iso.exponent is None and "needs 2 IsoFLOP groups" in iso.why
    assert fitted.agreement() is None


def test_approach_2_outside_approach_3s_interval_is_called_a_difference(
    fitted: ScalingFit,
) -> None:
    low, high = fitted.interval("exponent")
    group = IsoFlopGroup(flops=1e18, sizes=5, params_opt=1e8)
    iso = IsoFlop(groups=[group, group], exponent=high + 0.1, coefficient=1.0, exponent_se=None)
    words = dataclasses.replace(fitted, isoflop=iso).agreement()
    assert words is not None and words.startswith("they differ by +")
    iso = dataclasses.replace(iso, exponent=(low + high) / 2)
    assert str(dataclasses.replace(fitted, isoflop=iso).agreement()).startswith("they agree")


def test_a_prediction_inside_the_fitted_range_keeps_the_bootstrap_interval(
    fitted: ScalingFit,
) -> None:
    p = predict(fitted, 1e19)  # every fitted 6*N*D spans 6e15 to 6e20
    assert p.reach == 1.0 and p.widening == 1.0 and p.warning is None
    assert p.intervals == p.bootstrap_intervals
    assert "C lies within the fitted runs" in p.reach_line


def test_a_prediction_says_how_far_it_reaches_and_widens_its_interval(
    fitted: ScalingFit,
) -> None:
    p = predict(fitted, 1e21)
    ratio = p.params / 1e9
    assert f"N* is {ratio:.3g}x the largest fitted run's N (1B)" in p.reach_line
    assert "C is 1.67x the largest fitted budget (6e+20)" in p.reach_line
    assert p.warning is None
    assert p.widening == pytest.approx(1 + 0.5 * math.log10(p.reach))
    (low, high), (raw_low, raw_high) = p.intervals["params"], p.bootstrap_intervals["params"]
    assert low < raw_low and high > raw_high


def test_beyond_100x_of_the_fitted_range_a_prediction_warns(fitted: ScalingFit) -> None:
    p = predict(fitted, 1e24)  # 1,667x the largest fitted budget
    assert p.warning is not None and "beyond 100x of the fitted range" in p.warning
    assert "C 1,667x" in p.warning and "\n" not in p.warning
    assert predict(fitted, 5e22).warning is None  # 83x: within


def test_a_saved_fit_reads_back_the_same(fitted: ScalingFit, tmp_path: Path) -> None:
    path = tmp_path / "fit.json"
    save_fit(fitted, str(path))
    data = json.loads(path.read_text())
    assert data["format"] == "thrifty scaling-law fit" and data["version"] == 1
    assert data["points"]["count"] == 30 and data["sources"] == ["synthetic"]
    assert set(data["intervals"]) == {"E", "A", "B", "alpha", "beta", "exponent"}
    back = load_fit(str(path))
    assert back.samples == fitted.samples and back.ranges == fitted.ranges
    assert predict(back, 1e21).intervals == predict(fitted, 1e21).intervals
    save_fit(fitted, str(path))  # a saved fit may be replaced by another


def test_saving_refuses_to_replace_a_file_that_is_not_a_fit(
    fitted: ScalingFit, tmp_path: Path
) -> None:
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}')
    with pytest.raises(ConfigError, match="not a scaling-law fit thrifty wrote"):
        save_fit(fitted, str(other))
    assert other.read_text() == '{"mine": 1}'


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"mine": 1}', "is not a saved scaling-law fit"),
        ("not json", "is not JSON"),
        ('{"format": "thrifty scaling-law fit", "version": 9}', "format version 9"),
        (
            '{"format": "thrifty scaling-law fit", "version": 1, "constants": {"E": -1}}',
            "constants.E must be a finite number > 0, got -1",
        ),
    ],
)
def test_loading_a_wrong_file_says_what_is_wrong(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "fit.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_fit(str(path))


# --- reading the points ---------------------------------------------------------------------


def write_run(folder: Path, params: float, tokens: float, loss: float | None, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    summary = {"parameters": params, "tokens": tokens, "final_val_loss": loss}
    summary.update({"stop_reason": "max_steps", "steps": 100, **extra})
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_a_csv_is_read_by_its_header_whatever_the_other_columns(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(
        "# my runs\nname, Loss ,tokens,params,seed\na,3.1,1e9,1e7,0\n\nb,2.9,2B,30M,1\n"
        "c,2.8,4e9,1e8,2\nd,2.7,8e9,3e8,3\ne,2.6,1.6e10,1e9,4\n"
    )
    found = read_points([str(path)])
    assert [(p.params, p.tokens, p.loss) for p in found.points][:2] == [
        (1e7, 1e9, 3.1),
        (3e7, 2e9, 2.9),
    ]
    assert found.points[1].source == f"{path} line 5"  # the blank line 4 counts


def test_a_csv_a_spreadsheet_saved_with_a_byte_order_mark_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "runs.csv"
    rows = "params,tokens,loss\n1e7,1e9,3.1\n3e7,2e9,2.9\n1e8,4e9,2.8\n3e8,8e9,2.7\n1e9,2e10,2.6\n"
    path.write_text(rows, encoding="utf-8-sig")  # Excel's "CSV UTF-8"
    found = read_points([str(path)])
    assert [(p.params, p.tokens, p.loss) for p in found.points][0] == (1e7, 1e9, 3.1)


def test_runs_are_read_from_run_sweep_and_parent_folders(tmp_path: Path) -> None:
    run = write_run(tmp_path / "single", 1e7, 1e9, 3.0)
    sweep = tmp_path / "sweep"
    write_run(sweep / "trials" / "0000", 3e7, 1e9, 2.9)
    write_run(sweep / "trials" / "0001", 1e8, 2e9, 2.8)
    write_run(sweep / "trials" / "0002", 1e8, 1e8, 3.5, stop_reason="pruned")
    (sweep / "trials" / "0003").mkdir()  # a trial that never finished: no summary.json
    (sweep / "sweep.json").write_text("{}")
    parent = tmp_path / "many"
    write_run(parent / "group-a" / "r1", 3e8, 4e9, 2.7)
    write_run(parent / "group-a" / "r2", 1e9, 8e9, 2.6)
    found = read_points([str(run), str(sweep), str(parent)])
    assert sorted(p.params for p in found.points) == [1e7, 3e7, 1e8, 3e8, 1e9]
    assert str(sweep / "trials" / "0000") in {p.source for p in found.points}
    assert len(found.notes) == 1 and "left out 1 run(s)" in found.notes[0]
    assert str(sweep / "trials" / "0002") in found.notes[0]
    found = read_points([str(run / "summary.json"), str(sweep), str(parent)])  # the file itself
    assert len(found.points) == 5


def test_a_run_without_validation_loss_is_named(tmp_path: Path) -> None:
    for i, n in enumerate((1e7, 3e7, 1e8, 3e8, 1e9)):
        write_run(tmp_path / "runs" / f"r{i}", n, 1e9 * (i + 1), 3.0 - i / 10)
    bad = write_run(tmp_path / "runs" / "r9", 1e9, 1e10, None)
    with pytest.raises(ConfigError, match=f"run {bad} has no validation loss"):
        read_points([str(tmp_path / "runs")])


def test_importing_the_fit_modules_loads_neither_torch_nor_rich() -> None:
    code = (
        "import sys, thrifty.plan.lawfit, thrifty.plan.lawpoints, thrifty.plan.lawpredict, "
        "thrifty.plan.lawfile, thrifty.plan.lawgroups, thrifty.commands.plan.fit; "
        "print(sorted(m for m in ('torch', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
