"""Spot economics: interruption rates, the optimal checkpoint interval, expected spot cost.

Interruptions are taken as a Poisson process with rate lambda per hour (mean time between
interruptions M = 1/lambda). With a checkpoint every tau seconds that takes delta seconds to
save, and R seconds to restart after an interruption, the first-order model for a job of W hours
of work is:

    expected wall time  T = W * (1 + delta/tau) / (1 - lambda * (tau/2 + R))

that is, W of work, W/tau checkpoints of delta each, and lambda*T interruptions that each lose
half an interval of work plus the restart. It holds while lambda*tau is well below 1.

Young (1974): tau = sqrt(2*delta*M).
Daly (2006): tau = sqrt(2*delta*M) * [1 + 1/3*sqrt(delta/(2M)) + 1/9*(delta/(2M))] - delta for
delta < 2M, else tau = M.
Without checkpoints a job restarts from scratch: E[T] = (exp(lambda*W) - 1) * (1/lambda + R).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from thrifty.errors import ConfigError
from thrifty.plan.units import fmt_pct, require_positive

HOURS_PER_MONTH = 730.5  # 365.25 * 24 / 12
DEFAULT_SAVE_SECONDS = 60.0
DEFAULT_RESTART_SECONDS = 600.0

# AWS Spot Instance Advisor buckets of monthly interruption frequency: (low, high, typical).
# The typical value is the bucket's midpoint; ">20%" has no upper edge, so 25% is assumed.
ADVISOR_BUCKETS: dict[str, tuple[float, float | None, float]] = {
    "<5%": (0.0, 0.05, 0.025),
    "5-10%": (0.05, 0.10, 0.075),
    "10-15%": (0.10, 0.15, 0.125),
    "15-20%": (0.15, 0.20, 0.175),
    ">20%": (0.20, None, 0.25),
}


def rate_from_advisor(bucket: str) -> float:
    """Interruptions per hour for an AWS Spot Instance Advisor bucket ('<5%', '5-10%', ...).

    The bucket's typical monthly interruption frequency p is read as the probability that an
    instance is interrupted within a month: lambda = -ln(1 - p) / 730.5 hours.
    """
    key = bucket.replace(" ", "").replace("–", "-")
    if key not in ADVISOR_BUCKETS:
        raise ConfigError(
            f"advisor bucket must be one of {', '.join(ADVISOR_BUCKETS)}, got {bucket!r}"
        )
    monthly = ADVISOR_BUCKETS[key][2]
    return -math.log1p(-monthly) / HOURS_PER_MONTH


def interruption_rate(
    *,
    rate_per_hour: float | None = None,
    mtbi_seconds: float | None = None,
    advisor_bucket: str | None = None,
) -> float:
    """Interruptions per hour from exactly one of: a rate per hour, a mean time between
    interruptions in seconds, or an AWS advisor bucket."""
    given = [x is not None for x in (rate_per_hour, mtbi_seconds, advisor_bucket)]
    if sum(given) != 1:
        raise ConfigError(
            f"give exactly one of rate_per_hour, mtbi_seconds or advisor_bucket (got {sum(given)})"
        )
    if rate_per_hour is not None:
        return require_positive(rate_per_hour, "interruption rate per hour")
    if mtbi_seconds is not None:
        return 3600.0 / require_positive(mtbi_seconds, "mean time between interruptions")
    assert advisor_bucket is not None  # exactly one of the three was given
    return rate_from_advisor(advisor_bucket)


def young_interval(save_seconds: float, mtbi_seconds: float) -> float:
    """Young's optimal checkpoint interval in seconds: sqrt(2 * save * MTBI)."""
    return math.sqrt(2.0 * save_seconds * mtbi_seconds)


def daly_interval(save_seconds: float, mtbi_seconds: float) -> float:
    """Daly's higher-order optimal checkpoint interval in seconds (compute time between saves)."""
    delta, m = save_seconds, mtbi_seconds
    if delta >= 2.0 * m:
        return m
    x = delta / (2.0 * m)
    return math.sqrt(2.0 * delta * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


@dataclass(frozen=True, slots=True)
class CheckpointInterval:
    """Young and Daly checkpoint intervals in seconds for a save time and an MTBI."""

    save_seconds: float
    mtbi_seconds: float
    young_seconds: float
    daly_seconds: float

    @property
    def rate_per_hour(self) -> float:
        return 3600.0 / self.mtbi_seconds


def checkpoint_interval(
    save_seconds: float,
    *,
    mtbi_seconds: float | None = None,
    rate_per_hour: float | None = None,
    advisor_bucket: str | None = None,
) -> CheckpointInterval:
    """Young and Daly checkpoint intervals (seconds) for a checkpoint that takes `save_seconds`.

    Give exactly one of `mtbi_seconds` (mean time between interruptions, seconds),
    `rate_per_hour` (interruptions per hour) or `advisor_bucket` ('<5%', '5-10%', '10-15%',
    '15-20%', '>20%': AWS Spot Instance Advisor monthly frequency).
    """
    save = require_positive(save_seconds, "checkpoint save time (seconds)")
    rate = interruption_rate(
        rate_per_hour=rate_per_hour, mtbi_seconds=mtbi_seconds, advisor_bucket=advisor_bucket
    )
    mtbi = 3600.0 / rate
    return CheckpointInterval(save, mtbi, young_interval(save, mtbi), daly_interval(save, mtbi))


@dataclass(frozen=True, slots=True, kw_only=True)
class SpotPlan:
    """Expected spot cost beside on-demand. Hours are wall-clock; prices USD per hour."""

    work_hours: float
    rate_per_hour: float
    interval_seconds: float
    interval_source: str
    young_seconds: float
    daly_seconds: float
    save_seconds: float
    restart_seconds: float
    expected_interruptions: float
    lost_hours_per_interruption: float
    checkpoint_overhead_hours: float
    expected_hours: float
    on_demand_per_hour: float
    spot_per_hour: float
    on_demand_cost: float
    spot_cost: float
    break_even_rate_per_hour: float | None
    no_checkpoint_hours: float
    no_checkpoint_cost: float
    assumptions: list[str] = field(default_factory=list)

    @property
    def overhead_factor(self) -> float:
        """Expected wall time over work time on spot (>= 1)."""
        return self.expected_hours / self.work_hours

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        for key in ("no_checkpoint_hours", "no_checkpoint_cost"):
            data[key] = data[key] if math.isfinite(data[key]) else None
        data["overhead_factor"] = self.overhead_factor
        return data


def expected_hours(
    work_hours: float, rate_per_hour: float, interval_s: float, save_s: float, restart_s: float
) -> float:
    """First-order expected wall time in hours with checkpoints (infinite if it never finishes)."""
    loss = rate_per_hour * (interval_s / 2 + restart_s) / 3600.0
    if loss >= 1.0:
        return math.inf
    return work_hours * (1.0 + save_s / interval_s) / (1.0 - loss)


def no_checkpoint_hours(work_hours: float, rate_per_hour: float, restart_s: float) -> float:
    """Expected wall time in hours when every interruption restarts the job from scratch."""
    exponent = rate_per_hour * work_hours
    if exponent > 700:
        return math.inf
    return math.expm1(exponent) * (1.0 / rate_per_hour + restart_s / 3600.0)


def spot_economics(
    work_hours: float,
    *,
    on_demand_per_hour: float,
    spot_per_hour: float,
    rate_per_hour: float,
    save_seconds: float = DEFAULT_SAVE_SECONDS,
    restart_seconds: float = DEFAULT_RESTART_SECONDS,
    interval_seconds: float | None = None,
) -> SpotPlan:
    """Expected spot cost and time for `work_hours` of uninterrupted work, beside on-demand.

    Prices are USD per hour; `rate_per_hour` interruptions per hour; times in seconds.
    Without `interval_seconds` the Daly optimum is used. Raises if the rate is above one
    interruption per checkpoint interval (the first-order model no longer holds).
    """
    work = require_positive(work_hours, "work hours")
    od = require_positive(on_demand_per_hour, "on-demand price ($/hour)")
    spot = require_positive(spot_per_hour, "spot price ($/hour)")
    rate = require_positive(rate_per_hour, "interruption rate per hour")
    save = require_positive(save_seconds, "checkpoint save time (seconds)")
    if not math.isfinite(restart_seconds) or restart_seconds < 0:
        raise ConfigError(f"restart time must be >= 0 seconds, got {restart_seconds!r}")
    given = interval_seconds is not None
    interval = (
        daly_interval(save, 3600.0 / rate)
        if interval_seconds is None
        else require_positive(interval_seconds, "checkpoint interval (seconds)")
    )
    _check_rate(rate, interval, restart_seconds)
    hours = expected_hours(work, rate, interval, save, restart_seconds)
    lost = (interval / 2 + restart_seconds) / 3600.0
    overhead = work * save / interval
    no_ckpt = no_checkpoint_hours(work, rate, restart_seconds)
    return SpotPlan(
        work_hours=work,
        rate_per_hour=rate,
        interval_seconds=interval,
        interval_source="given" if given else "Daly optimum",
        young_seconds=young_interval(save, 3600.0 / rate),
        daly_seconds=daly_interval(save, 3600.0 / rate),
        save_seconds=save,
        restart_seconds=float(restart_seconds),
        expected_interruptions=rate * hours,
        lost_hours_per_interruption=lost,
        checkpoint_overhead_hours=overhead,
        expected_hours=hours,
        on_demand_per_hour=od,
        spot_per_hour=spot,
        on_demand_cost=od * work,
        spot_cost=spot * hours,
        break_even_rate_per_hour=break_even_rate(
            od, spot, save, restart_seconds, interval if given else None
        ),
        no_checkpoint_hours=no_ckpt,
        no_checkpoint_cost=spot * no_ckpt,
        assumptions=[
            "interruptions are a Poisson process; first-order model: each loses half an "
            "interval of work plus the restart time",
            f"checkpoint every {interval:.0f} s ({'given' if given else 'Daly optimum'}), "
            f"save {save:g} s, restart {restart_seconds:g} s",
            "on-demand runs without interruptions or checkpoint overhead",
            f"spot overhead factor {hours / work:.3f} ({fmt_pct(hours / work - 1)} more hours)",
        ],
    )


def _check_rate(rate: float, interval_s: float, restart_s: float) -> None:
    per_interval = rate * interval_s / 3600.0
    if per_interval > 1.0:
        raise ConfigError(
            f"interruption rate {rate:g}/h is above 1 per checkpoint interval "
            f"({interval_s:.0f} s gives {per_interval:.2f}); checkpoint more often or use on-demand"
        )
    if rate * (interval_s / 2 + restart_s) / 3600.0 >= 1.0:
        raise ConfigError(
            f"interruption rate {rate:g}/h: half an interval ({interval_s / 2:.0f} s) plus the "
            f"restart ({restart_s:.0f} s) exceeds the mean time between interruptions "
            f"({3600 / rate:.0f} s), so the job never finishes; shorten the interval or restart"
        )


def break_even_rate(
    on_demand_per_hour: float,
    spot_per_hour: float,
    save_seconds: float,
    restart_seconds: float,
    interval_seconds: float | None = None,
) -> float | None:
    """Interruptions per hour above which spot costs more than on-demand (None: spot never pays).

    The checkpoint interval is re-optimised (Daly) at each rate unless `interval_seconds` is fixed.
    Found by bisection on log(rate); the expected spot cost rises monotonically with the rate.
    """
    if spot_per_hour >= on_demand_per_hour:
        return None

    def excess(rate: float) -> float:
        interval = interval_seconds or daly_interval(save_seconds, 3600.0 / rate)
        hours = expected_hours(1.0, rate, interval, save_seconds, restart_seconds)
        return spot_per_hour * hours - on_demand_per_hour

    low, high = 1e-9, 1e4
    if excess(low) >= 0:
        return None
    for _ in range(200):
        mid = math.sqrt(low * high)
        if excess(mid) < 0:
            low = mid
        else:
            high = mid
        if high / low < 1 + 1e-9:
            break
    return math.sqrt(low * high)
