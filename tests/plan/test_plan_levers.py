"""The three levers in sequence: price per hour, hours per run, runs needed."""

from __future__ import annotations

import pytest

from thrifty.errors import ConfigError
from thrifty.plan import LeverInputs, apply_levers


def case(**overrides) -> LeverInputs:
    values = dict(
        hours_per_run=72,
        on_demand_per_hour=32.77,
        runs=24,
        spot_per_hour=7.35,
        precision_speedup=72 / 48,
        microbatch_speedup=48 / 40,
        early_stopped_runs=4,
        early_stop_fraction=0.6,
        period="year",  # the article's 24 runs are a year's (2 a month x 12)
    )
    values.update(overrides)
    return LeverInputs(**values)


def test_the_case_studys_lever_arithmetic_at_the_catalog_price() -> None:
    plan = apply_levers(case())
    costs = [plan.baseline] + [s.after for s in plan.steps]
    assert costs == pytest.approx(
        [
            24 * 72 * 32.77,  # on-demand: $56,626.56
            24 * 72 * 7.35,  # spot: $12,700.80
            24 * 48 * 7.35,  # bf16: $8,467.20
            24 * 40 * 7.35,  # larger batch: $7,056.00
            22.4 * 40 * 7.35,  # 4 of 24 runs stopped at 60%: $6,585.60
        ]
    )
    assert [s.lever for s in plan.steps] == [
        "spot instances",
        "precision",
        "larger micro-batch",
        "early stopping",
    ]
    assert plan.saving_pct == pytest.approx(1 - 6585.60 / 56626.56)


def test_each_step_saves_the_difference_and_the_steps_add_up() -> None:
    plan = apply_levers(case())
    assert sum(s.saving for s in plan.steps) == pytest.approx(plan.saving)
    assert plan.steps[1].saving_pct == pytest.approx(1 / 3)


def test_interruption_overhead_raises_the_spot_price() -> None:
    plain = apply_levers(case()).steps[0].after
    assert apply_levers(case(spot_overhead=1.1)).steps[0].after == pytest.approx(1.1 * plain)


def test_a_lever_that_slows_the_run_shows_a_negative_saving() -> None:
    plan = apply_levers(case(microbatch_speedup=0.75))  # recompute cost not repaid
    assert plan.steps[2].saving < 0


def test_without_a_spot_price_the_price_lever_is_skipped() -> None:
    plan = apply_levers(case(spot_per_hour=None))
    assert plan.steps[0].lever == "precision"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"hours_per_run": 0}, "levers.hours_per_run must be greater than 0, got 0"),
        (
            {"early_stopped_runs": 30},
            r"levers.early_stopped_runs must be between 0 and runs \(24\)",
        ),
        ({"early_stop_fraction": 1.5}, r"levers.early_stop_fraction must be in \[0, 1\]"),
        ({"spot_per_hour": -1}, "levers.spot_per_hour must be greater than 0"),
    ],
)
def test_bad_lever_inputs_name_the_field(overrides: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        case(**overrides)


def test_the_waterfall_chart_is_written(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from thrifty.plan.levers import plot_waterfall

    path = tmp_path / "levers.png"
    plot_waterfall(apply_levers(case()), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
