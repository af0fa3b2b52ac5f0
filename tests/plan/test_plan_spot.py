"""Spot economics: interruption rates, Young/Daly intervals, expected cost, break-even."""

from __future__ import annotations

import math

import pytest

from thrifty.errors import ConfigError
from thrifty.plan import checkpoint_interval, daly_interval, spot_economics, young_interval
from thrifty.plan.spot import (
    HOURS_PER_MONTH,
    break_even_rate,
    expected_hours,
    no_checkpoint_hours,
    rate_from_advisor,
)


def test_young_interval_is_the_square_root_of_two_save_times_mtbi() -> None:
    # 60 s save, one interruption an hour: sqrt(2 * 60 * 3600) = sqrt(432000)
    assert young_interval(60, 3600) == pytest.approx(657.26707, rel=1e-6)


def test_daly_interval_matches_a_hand_computed_value() -> None:
    # sqrt(432000) = 657.267069; x = 60/7200 = 0.0083333; sqrt(x)/3 = 0.0304290; x/9 = 0.0009259
    # 657.267069 * (1 + 0.0304290 + 0.0009259) - 60 = 677.87565 - 60 = 617.87565 s
    assert daly_interval(60, 3600) == pytest.approx(617.87565, rel=1e-6)


def test_daly_interval_is_the_mtbi_when_saving_takes_longer_than_two_mtbi() -> None:
    assert daly_interval(800, 300) == 300


def test_checkpoint_interval_accepts_mtbi_rate_or_advisor_bucket() -> None:
    by_mtbi = checkpoint_interval(60, mtbi_seconds=3600)
    by_rate = checkpoint_interval(60, rate_per_hour=1.0)
    assert by_mtbi == by_rate
    assert by_mtbi.young_seconds == pytest.approx(young_interval(60, 3600))
    assert by_mtbi.daly_seconds == pytest.approx(617.87565, rel=1e-6)
    bucket = checkpoint_interval(60, advisor_bucket="<5%")
    assert bucket.rate_per_hour == pytest.approx(rate_from_advisor("<5%"))


def test_an_advisor_bucket_is_read_as_a_monthly_interruption_probability() -> None:
    assert rate_from_advisor("<5%") == pytest.approx(-math.log(1 - 0.025) / HOURS_PER_MONTH)
    assert rate_from_advisor("10-15%") > rate_from_advisor("5-10%")


def test_checkpoint_interval_needs_exactly_one_rate() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        checkpoint_interval(60)
    with pytest.raises(ConfigError, match="exactly one"):
        checkpoint_interval(60, mtbi_seconds=3600, rate_per_hour=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate_per_hour": 0}, "interruption rate per hour must be greater than 0, got 0"),
        ({"rate_per_hour": -1}, "must be greater than 0, got -1"),
        ({"advisor_bucket": "25%"}, "advisor bucket must be one of <5%, 5-10%"),
    ],
)
def test_bad_rates_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        checkpoint_interval(60, **kwargs)


def test_expected_hours_add_checkpoints_and_lost_work() -> None:
    # 100 h of work, 0.01/h, checkpoint every 1800 s taking 60 s, restart 600 s
    hours = expected_hours(100, 0.01, 1800, 60, 600)
    assert hours == pytest.approx(100 * (1 + 60 / 1800) / (1 - 0.01 * (900 + 600) / 3600))


def test_spot_cost_is_price_times_expected_hours_and_beats_on_demand_at_low_rates() -> None:
    plan = spot_economics(72, on_demand_per_hour=32.77, spot_per_hour=7.35, rate_per_hour=0.05)
    assert plan.interval_seconds == pytest.approx(daly_interval(60, 3600 / 0.05))
    assert plan.spot_cost == pytest.approx(7.35 * plan.expected_hours)
    assert plan.on_demand_cost == pytest.approx(72 * 32.77)
    assert plan.expected_interruptions == pytest.approx(0.05 * plan.expected_hours)
    assert plan.lost_hours_per_interruption == pytest.approx(
        (plan.interval_seconds / 2 + 600) / 3600
    )
    assert plan.spot_cost < plan.on_demand_cost


def test_at_the_break_even_rate_spot_costs_what_on_demand_costs() -> None:
    rate = break_even_rate(32.77, 7.35, 60, 600)
    assert rate is not None
    at = spot_economics(10, on_demand_per_hour=32.77, spot_per_hour=7.35, rate_per_hour=rate)
    assert at.spot_cost == pytest.approx(at.on_demand_cost, rel=1e-6)


def test_spot_never_pays_when_it_is_not_cheaper() -> None:
    assert break_even_rate(10, 10, 60, 600) is None


def test_without_checkpoints_a_job_restarts_from_scratch() -> None:
    # lambda * W = 1: (e - 1) * (1/lambda + R) hours
    assert no_checkpoint_hours(10, 0.1, 0) == pytest.approx((math.e - 1) * 10)
    plan = spot_economics(10, on_demand_per_hour=30, spot_per_hour=10, rate_per_hour=0.1)
    assert plan.no_checkpoint_hours == pytest.approx((math.e - 1) * (10 + 600 / 3600))
    assert plan.no_checkpoint_cost > plan.spot_cost


def test_a_rate_above_one_interruption_per_checkpoint_interval_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"above 1 per checkpoint interval \(3600 s gives 2.00\)"):
        spot_economics(
            10, on_demand_per_hour=30, spot_per_hour=10, rate_per_hour=2, interval_seconds=3600
        )
