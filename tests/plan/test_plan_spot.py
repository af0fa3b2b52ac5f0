"""Spot economics: interruption rates, Young/Daly intervals, the exact expected time, cost,
break-even. The Monte-Carlo check of the exact model is in test_plan_spot_montecarlo.py."""

from __future__ import annotations

import math

import pytest

from thrifty.errors import ConfigError
from thrifty.plan import checkpoint_interval, daly_interval, spot_economics, young_interval
from thrifty.plan.spot import (
    HOURS_PER_MONTH,
    Schedule,
    break_even_rate,
    expected_hours,
    fleet_rate,
    no_checkpoint_hours,
    optimal_interval,
    rate_from_advisor,
)

# Issue 14's example: p4d.24xlarge@v7 prices (SkyPilot catalog snapshot v7: $32.77/h on-demand,
# spot midpoint $7.35/h), save 120 s, restart 900 s.
P4D_V7 = {"on_demand_per_hour": 32.77, "spot_per_hour": 7.35}


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


def test_expected_hours_are_exact_for_poisson_interruptions() -> None:
    # 100 h of work, 0.01/h, checkpoint every 1800 s taking 60 s, restart 600 s: 200 segments of
    # 1860 s, each (1/lambda + R)(e^(lambda*L) - 1) = (360000 + 600) * expm1(0.01 * 1860 / 3600)
    hours = expected_hours(100, 0.01, 1800, 60, 600)
    assert hours == pytest.approx(200 * 360600 * math.expm1(0.01 * 1860 / 3600) / 3600)
    assert hours == pytest.approx(103.77340600672383, rel=1e-12)


def test_the_exact_optimum_minimises_the_time_per_unit_of_work() -> None:
    def per_work(tau: float) -> float:  # 1/h, 60 s save: e^(lambda(tau + delta)) - 1 over tau
        return math.expm1((tau + 60) / 3600) / tau

    tau = optimal_interval(1.0, 60)
    assert tau == pytest.approx(617.8906, rel=1e-6)
    assert per_work(tau) <= min(per_work(tau * f) for f in (0.99, 0.999, 1.001, 1.01))
    # Young and Daly approximate it; Daly to 0.01% here
    assert daly_interval(60, 3600) == pytest.approx(tau, rel=1e-4)
    assert young_interval(60, 3600) == pytest.approx(tau, rel=0.07)


def test_the_best_schedule_beats_every_other_number_of_checkpoints() -> None:
    work, rate, save, restart = 20 * 3600.0, 0.5, 120.0, 900.0
    best = Schedule.best(work, rate, save)

    def hours(count: int) -> float:
        return expected_hours(work / 3600, rate, work / count, save, restart)

    assert all(hours(best.count) <= hours(n) for n in range(1, 200))
    assert best.interval_seconds == pytest.approx(work / best.count)


def test_issue_14_break_even_is_5_25_per_hour_not_2_23() -> None:
    # The first-order model put the break-even at 2.23/h, where it predicted 4.46x the work;
    # the exact model gives 2.35x there and a break-even of about 5.25/h.
    assert break_even_rate(32.77, 7.35, 120, 900) == pytest.approx(5.2518, rel=1e-4)
    at_old = spot_economics(
        1869.7, **P4D_V7, rate_per_hour=2.23, save_seconds=120, restart_seconds=900
    )
    assert at_old.overhead_factor == pytest.approx(2.3516, rel=1e-4)


def test_five_interruptions_an_hour_with_a_900_s_restart_finishes_in_about_3_5x_the_work() -> None:
    # Issue 14: refused before as "the job never finishes"
    plan = spot_economics(1869.7, **P4D_V7, rate_per_hour=5, restart_seconds=900)
    assert plan.overhead_factor == pytest.approx(3.4867, rel=1e-4)
    assert plan.break_even_rate_per_hour is not None
    assert plan.spot_cost < plan.on_demand_cost


def test_a_fleet_of_64_is_interrupted_64_times_as_often() -> None:
    # Issue 14: p5.48xlarge x 64, AWS advisor '>20%' = 3.94e-4/h per instance, 921 h of work
    # (70B, 1.4T tokens at 35% MFU): about 23 interruptions and an interval near 4,100 s,
    # where the single-instance rate gave 0.36 and 33,080 s.
    per_instance = rate_from_advisor(">20%")
    assert per_instance == pytest.approx(3.938e-4, rel=1e-3)
    plan = spot_economics(
        921.0,
        on_demand_per_hour=64 * 55.04,
        spot_per_hour=64 * 21.70,
        rate_per_hour=per_instance,
        instances=64,
    )
    assert plan.rate_per_hour == pytest.approx(64 * per_instance)
    assert plan.rate_per_instance_per_hour == pytest.approx(per_instance)
    assert plan.interval_seconds == pytest.approx(4100, rel=0.01)
    assert plan.daly_seconds == pytest.approx(4098, rel=0.01)
    assert plan.expected_interruptions == pytest.approx(23.9, abs=0.1)
    assert plan.rate_per_hour * plan.work_hours == pytest.approx(23.2, abs=0.1)
    assert plan.break_even_rate_per_instance_per_hour == pytest.approx(
        plan.break_even_rate_per_hour / 64
    )


def test_a_fleet_needs_a_whole_number_of_instances() -> None:
    assert fleet_rate(0.01, 8) == pytest.approx(0.08)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="instances must be a whole number >= 1"):
            fleet_rate(0.01, bad)  # type: ignore[arg-type]


def test_spot_cost_is_price_times_expected_hours_and_beats_on_demand_at_low_rates() -> None:
    plan = spot_economics(72, **P4D_V7, rate_per_hour=0.05)
    assert plan.interval_seconds == pytest.approx(optimal_interval(0.05, 60), rel=0.01)
    assert plan.interval_source == "exact optimum"
    assert plan.spot_cost == pytest.approx(7.35 * plan.expected_hours)
    assert plan.on_demand_cost == pytest.approx((72 + 60 / 3600) * 32.77)
    assert plan.checkpoint_overhead_hours == pytest.approx((plan.checkpoints - 1) * 60 / 3600)
    assert plan.expected_hours == pytest.approx(
        plan.on_demand_hours
        + plan.checkpoint_overhead_hours
        + plan.expected_interruptions * plan.lost_hours_per_interruption
    )
    assert plan.spot_cost < plan.on_demand_cost


def test_at_the_break_even_rate_spot_costs_what_on_demand_costs() -> None:
    rate = break_even_rate(32.77, 7.35, 60, 600, work_hours=10)
    assert rate is not None
    at = spot_economics(10, **P4D_V7, rate_per_hour=rate)
    assert at.spot_cost == pytest.approx(at.on_demand_cost, rel=1e-6)
    assert at.break_even_rate_per_hour == pytest.approx(rate)


def test_spot_never_pays_when_it_is_not_cheaper() -> None:
    assert break_even_rate(10, 10, 60, 600) is None


def test_without_checkpoints_a_job_restarts_from_scratch() -> None:
    # lambda * (W + save) = 1: (e - 1) * (1/lambda + R) hours
    assert no_checkpoint_hours(9.5, 0.1, 1800, 0) == pytest.approx((math.e - 1) * 10)
    plan = spot_economics(10, on_demand_per_hour=30, spot_per_hour=10, rate_per_hour=0.1)
    assert plan.no_checkpoint_hours == pytest.approx(
        math.expm1(0.1 * (10 + 60 / 3600)) * (10 + 600 / 3600)
    )
    assert plan.no_checkpoint_cost > plan.spot_cost


def test_more_than_one_interruption_per_checkpoint_interval_is_still_finite() -> None:
    # 2/h with an hour between checkpoints: each segment runs through with probability
    # e^(-2 * 3660/3600); refused before, yet the expectation is finite.
    plan = spot_economics(
        10, on_demand_per_hour=30, spot_per_hour=10, rate_per_hour=2, interval_seconds=3600
    )
    assert plan.expected_hours == pytest.approx(
        10 * (0.5 + 600 / 3600) * math.expm1(2 * 3660 / 3600)
    )


def test_only_an_expected_time_beyond_a_float_is_refused_with_its_numbers() -> None:
    with pytest.raises(
        ConfigError,
        match=r"one every 36 s on average\): a segment of 36,660 s of work and save runs through with probability e\^-1,018, so the expected time exceeds 1e300 h",
    ) as e:
        spot_economics(
            100, on_demand_per_hour=30, spot_per_hour=10, rate_per_hour=100, interval_seconds=36600
        )
    assert "checkpoint more often (the optimum is 33 s)" in str(e.value)


# A 125M model on 2.5B tokens on p5.48xlarge at 35% MFU: 676.75 s of work, shorter than one
# optimal checkpoint interval at the advisor's 5-10% (about 90,000 s), so the only save is the
# final one, which writes the finished model on spot and on on-demand alike.
SHORT_JOB = {
    "work_hours": 676.7487186890926 / 3600,
    "on_demand_per_hour": 55.04,
    "spot_per_hour": 20.2,
    "rate_per_hour": rate_from_advisor("5-10%"),
    "save_seconds": 120.0,
}


def _short_job_plan() -> object:
    job = dict(SHORT_JOB)
    return spot_economics(job.pop("work_hours"), **job)


def test_a_job_shorter_than_one_interval_costs_on_spot_what_it_costs_without_checkpoints() -> None:
    plan = _short_job_plan()
    assert plan.checkpoints == 1  # the final save only
    assert plan.checkpoint_overhead_hours == 0.0
    assert plan.spot_cost == pytest.approx(plan.no_checkpoint_cost, rel=1e-12)
    # the uninterrupted time is the work and the one save that both pricings pay; what spot
    # adds beyond it is only what interruptions cost
    uninterrupted = SHORT_JOB["work_hours"] + 120 / 3600
    assert plan.on_demand_hours == pytest.approx(uninterrupted, rel=1e-12)
    assert plan.on_demand_cost == pytest.approx(55.04 * uninterrupted, rel=1e-12)
    lost = plan.expected_interruptions * plan.lost_hours_per_interruption
    assert plan.spot_cost == pytest.approx(20.2 * (uninterrupted + lost), rel=1e-12)
    assert plan.overhead_factor == pytest.approx(1.0, abs=1e-4)


def test_the_final_save_is_paid_on_demand_as_well_as_on_spot() -> None:
    # 10 h of work in 4 intervals of 2.5 h, each followed by a 600 s save: on-demand also writes
    # the finished model once, so the checkpoint overhead is the 3 saves before the last.
    plan = spot_economics(
        10,
        on_demand_per_hour=30,
        spot_per_hour=10,
        rate_per_hour=0.01,
        save_seconds=600,
        interval_seconds=9000,
    )
    assert plan.checkpoints == 4
    assert plan.on_demand_hours == pytest.approx(10 + 600 / 3600)
    assert plan.checkpoint_overhead_hours == pytest.approx(3 * 600 / 3600)
    assert plan.overhead_factor == pytest.approx(plan.expected_hours / (10 + 600 / 3600))
    assert plan.expected_hours == pytest.approx(
        plan.on_demand_hours
        + plan.checkpoint_overhead_hours
        + plan.expected_interruptions * plan.lost_hours_per_interruption
    )


def test_without_checkpoints_the_finished_model_is_still_written_once() -> None:
    # one segment of work and the final save, retried from scratch until it runs through
    hours = no_checkpoint_hours(2, 0.5, 120, 600)
    assert hours == pytest.approx((2 + 600 / 3600) * math.expm1(0.5 * (2 + 120 / 3600)))


def test_break_even_on_a_short_job_compares_both_with_their_final_save() -> None:
    plan = _short_job_plan()
    # independent: the rate at which the best schedule's expected time over the work and the
    # final save reaches on-demand over spot, 55.04 / 20.2
    assert plan.break_even_rate_per_hour == pytest.approx(4.5142, rel=1e-4)
    job = dict(SHORT_JOB, rate_per_hour=plan.break_even_rate_per_hour)
    at = spot_economics(job.pop("work_hours"), **job)
    assert at.spot_cost == pytest.approx(at.on_demand_cost, rel=1e-6)
