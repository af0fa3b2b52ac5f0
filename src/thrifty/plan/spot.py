"""Spot economics: interruption rates, the checkpoint interval, expected spot time and cost.

Interruptions are a Poisson process. A job on N instances stops whenever any one of them is
interrupted, so its rate is N times the rate of one instance: lambda = N * lambda_1.

The expected wall time is exact for that process. The W seconds of work are run as segments,
each of tau seconds of work followed by a save of delta seconds (the last segment's save writes
the finished model). An interruption loses the work since the last checkpoint and costs a
restart of R seconds, during which the job is not running and so cannot be interrupted again
(the interruption clock runs only while the job runs). A segment of L = tau + delta seconds is
retried until it runs uninterrupted; the number of interruptions before that is geometric with
mean e^(lambda*L) - 1, and each costs on average the time to the interruption plus R, which gives

    E[segment] = (1/lambda + R) * (e^(lambda*L) - 1)

and E[T] is the sum over segments. For a given number of segments the time is least when they
are equal, and over that number it is least at W/tau* rounded down or up, where tau* minimises
E[segment]/tau: (1 - lambda*tau*) * e^(lambda*tau*) = e^(-lambda*delta), independent of R.
The expectation is finite at every rate; it is refused only where it overflows a float.

Young (1974): tau = sqrt(2*delta*M) and Daly (2006): tau = sqrt(2*delta*M) * [1 +
1/3*sqrt(delta/(2M)) + 1/9*(delta/(2M))] - delta for delta < 2M, else tau = M (M = 1/lambda)
are first-order approximations of tau*, kept as interval formulas.

The finished model is written whatever the pricing, so every comparison charges the final save
to both sides: on-demand takes W + delta, a job without checkpoints is one segment of W + delta,
(1/lambda + R)(e^(lambda*(W + delta)) - 1), and only the saves before the last are checkpoint
overhead. A job shorter than one interval therefore costs the same with or without checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from thrifty.config.operations import ADVISOR_BUCKETS
from thrifty.errors import ConfigError
from thrifty.plan.units import fmt_pct, require_positive

HOURS_PER_MONTH = 730.5  # 365.25 * 24 / 12
SECONDS_PER_HOUR = 3600.0
DEFAULT_SAVE_SECONDS = 60.0
DEFAULT_RESTART_SECONDS = 600.0
# e**700 is about 1e304: a larger exponent overflows the expected time out of a float.
MAX_EXPONENT = 700.0


def rate_from_advisor(bucket: str) -> float:
    """Interruptions per hour of one instance for an AWS Spot Instance Advisor bucket.

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
        return SECONDS_PER_HOUR / require_positive(mtbi_seconds, "mean time between interruptions")
    assert advisor_bucket is not None  # exactly one of the three was given
    return rate_from_advisor(advisor_bucket)


def fleet_rate(rate_per_instance_per_hour: float, instances: int) -> float:
    """Interruptions per hour of a job on `instances` instances: any one stops the job."""
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ConfigError(f"instances must be a whole number >= 1, got {instances!r}")
    return instances * require_positive(rate_per_instance_per_hour, "interruption rate per hour")


def young_interval(save_seconds: float, mtbi_seconds: float) -> float:
    """Young's first-order checkpoint interval in seconds: sqrt(2 * save * MTBI)."""
    return math.sqrt(2.0 * save_seconds * mtbi_seconds)


def daly_interval(save_seconds: float, mtbi_seconds: float) -> float:
    """Daly's higher-order approximation of the checkpoint interval in seconds (compute time
    between saves)."""
    delta, m = save_seconds, mtbi_seconds
    if delta >= 2.0 * m:
        return m
    x = delta / (2.0 * m)
    return math.sqrt(2.0 * delta * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def optimal_interval(rate_per_hour: float, save_seconds: float) -> float:
    """The checkpoint interval in seconds that minimises the exact expected time per unit of
    work in a long job: the root of (1 - x) e^x = e^(-lambda*delta) with x = lambda*tau.

    Found by bisection on x in (0, 1), where x + ln(1 - x) + lambda*delta falls from
    lambda*delta to minus infinity. It does not depend on the restart time.
    """
    rate_s = require_positive(rate_per_hour, "interruption rate per hour") / SECONDS_PER_HOUR
    target = rate_s * require_positive(save_seconds, "checkpoint save time (seconds)")
    low, high = 0.0, 1.0
    for _ in range(200):
        mid = (low + high) / 2
        if mid + math.log1p(-mid) + target > 0:
            low = mid
        else:
            high = mid
        if high - low <= 1e-15 * high:
            break
    return (low + high) / 2 / rate_s


@dataclass(frozen=True, slots=True)
class CheckpointInterval:
    """Young and Daly checkpoint intervals in seconds for a save time and an MTBI."""

    save_seconds: float
    mtbi_seconds: float
    young_seconds: float
    daly_seconds: float

    @property
    def rate_per_hour(self) -> float:
        return SECONDS_PER_HOUR / self.mtbi_seconds


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
    mtbi = SECONDS_PER_HOUR / rate
    return CheckpointInterval(save, mtbi, young_interval(save, mtbi), daly_interval(save, mtbi))


@dataclass(frozen=True, slots=True)
class Schedule:
    """The job's work as `count` segments, each followed by a save: all but the last hold
    `interval_seconds` of work, the last `last_seconds`."""

    count: int
    interval_seconds: float
    last_seconds: float

    @classmethod
    def fixed(cls, work_seconds: float, interval_seconds: float) -> Schedule:
        """A checkpoint every `interval_seconds` of work; the last segment holds what is left."""
        count = max(1, math.ceil(work_seconds / interval_seconds - 1e-9))
        last = work_seconds - (count - 1) * interval_seconds
        return cls(count, interval_seconds, last)

    @classmethod
    def even(cls, work_seconds: float, count: int) -> Schedule:
        return cls(count, work_seconds / count, work_seconds / count)

    @classmethod
    def best(cls, work_seconds: float, rate_per_hour: float, save_seconds: float) -> Schedule:
        """The schedule with the least expected time: equal segments, as many as the work
        holds optimal intervals, rounded down or up (the time is convex in their number)."""
        per_interval = work_seconds / optimal_interval(rate_per_hour, save_seconds)
        counts = {max(1, math.floor(per_interval)), max(1, math.ceil(per_interval))}
        rate_s = rate_per_hour / SECONDS_PER_HOUR
        # E[T] = interruptions * (1/lambda + R): the fewest interruptions is the least time.
        return min(
            (cls.even(work_seconds, n) for n in counts),
            key=lambda s: s.expected_interruptions(rate_s, save_seconds),
        )

    def expected_interruptions(self, rate_per_second: float, save_seconds: float) -> float:
        """Expected interruptions before every segment has run through (inf on overflow)."""
        total = _retries(rate_per_second * (self.last_seconds + save_seconds))
        if self.count > 1:
            total += (self.count - 1) * _retries(
                rate_per_second * (self.interval_seconds + save_seconds)
            )
        return total


def _retries(exponent: float) -> float:
    """Mean number of interruptions before a segment of lambda*L = `exponent` runs through."""
    return math.expm1(exponent) if exponent <= MAX_EXPONENT else math.inf


def expected_hours(
    work_hours: float, rate_per_hour: float, interval_s: float, save_s: float, restart_s: float
) -> float:
    """Exact expected wall time in hours with a checkpoint every `interval_s` seconds of work
    (`rate_per_hour` is the job's rate; inf where it overflows a float)."""
    schedule = Schedule.fixed(work_hours * SECONDS_PER_HOUR, interval_s)
    return _hours(schedule, rate_per_hour, save_s, restart_s)


def _hours(schedule: Schedule, rate_per_hour: float, save_s: float, restart_s: float) -> float:
    """Each interruption costs the mean time to it plus the restart: E[T] = N * (1/lambda + R)."""
    rate_s = rate_per_hour / SECONDS_PER_HOUR
    interruptions = schedule.expected_interruptions(rate_s, save_s)
    return interruptions * (1.0 / rate_s + restart_s) / SECONDS_PER_HOUR


def no_checkpoint_hours(
    work_hours: float, rate_per_hour: float, save_s: float, restart_s: float
) -> float:
    """Expected wall time in hours when every interruption restarts the job from scratch: one
    segment of the work and the save that writes the finished model."""
    exponent = rate_per_hour * (work_hours + save_s / SECONDS_PER_HOUR)
    return _retries(exponent) * (1.0 / rate_per_hour + restart_s / SECONDS_PER_HOUR)


@dataclass(frozen=True, slots=True, kw_only=True)
class SpotPlan:
    """Expected spot cost beside on-demand. Hours are wall-clock; prices USD per hour for the
    whole job; rates are interruptions per hour (`rate_per_hour` is the job's).

    Both pricings write the finished model once: `on_demand_hours` is the work and that save,
    `checkpoints` counts every save (the last is that one), `checkpoint_overhead_hours` the
    saves before it."""

    work_hours: float
    on_demand_hours: float
    instances: int
    rate_per_instance_per_hour: float
    rate_per_hour: float
    interval_seconds: float
    interval_source: str
    checkpoints: int
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
    break_even_rate_per_instance_per_hour: float | None
    no_checkpoint_hours: float
    no_checkpoint_cost: float
    assumptions: list[str] = field(default_factory=list)

    @property
    def overhead_factor(self) -> float:
        """Expected wall time on spot over the uninterrupted time on-demand (>= 1): spot's
        cost over on-demand's is its price ratio times this."""
        return self.expected_hours / self.on_demand_hours

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        for key in ("no_checkpoint_hours", "no_checkpoint_cost"):
            data[key] = data[key] if math.isfinite(data[key]) else None
        data["overhead_factor"] = self.overhead_factor
        return data


def spot_economics(
    work_hours: float,
    *,
    on_demand_per_hour: float,
    spot_per_hour: float,
    rate_per_hour: float,
    instances: int = 1,
    save_seconds: float = DEFAULT_SAVE_SECONDS,
    restart_seconds: float = DEFAULT_RESTART_SECONDS,
    interval_seconds: float | None = None,
) -> SpotPlan:
    """Expected spot cost and time for `work_hours` of uninterrupted work, beside on-demand.

    Prices are USD per hour for all `instances`; `rate_per_hour` is the interruption rate of
    one instance, and the job's is `instances` times it. Times in seconds. Without
    `interval_seconds` the exact optimum for this job is used. Raises only where the expected
    time overflows, saying by how much.
    """
    work = require_positive(work_hours, "work hours")
    od = require_positive(on_demand_per_hour, "on-demand price ($/hour)")
    spot = require_positive(spot_per_hour, "spot price ($/hour)")
    rate = fleet_rate(rate_per_hour, instances)
    save = require_positive(save_seconds, "checkpoint save time (seconds)")
    restart = _restart(restart_seconds)
    given = interval_seconds is not None
    if interval_seconds is None:
        schedule = Schedule.best(work * SECONDS_PER_HOUR, rate, save)
    else:
        interval = require_positive(interval_seconds, "checkpoint interval (seconds)")
        schedule = Schedule.fixed(work * SECONDS_PER_HOUR, interval)
    hours = _hours(schedule, rate, save, restart)
    if not math.isfinite(hours):
        raise _never_finishes(rate, schedule, save, given)
    interruptions = schedule.expected_interruptions(rate / SECONDS_PER_HOUR, save)
    saves = schedule.count * save / SECONDS_PER_HOUR
    on_demand_hours = work + save / SECONDS_PER_HOUR  # the finished model is written either way
    no_ckpt = no_checkpoint_hours(work, rate, save, restart)
    break_even = break_even_rate(
        od, spot, save, restart, schedule.interval_seconds if given else None, work_hours=work
    )
    return SpotPlan(
        work_hours=work,
        on_demand_hours=on_demand_hours,
        instances=instances,
        rate_per_instance_per_hour=float(rate_per_hour),
        rate_per_hour=rate,
        interval_seconds=schedule.interval_seconds,
        interval_source="given" if given else "exact optimum",
        checkpoints=schedule.count,
        young_seconds=young_interval(save, SECONDS_PER_HOUR / rate),
        daly_seconds=daly_interval(save, SECONDS_PER_HOUR / rate),
        save_seconds=save,
        restart_seconds=restart,
        expected_interruptions=interruptions,
        lost_hours_per_interruption=(hours - work - saves) / interruptions,
        checkpoint_overhead_hours=saves - save / SECONDS_PER_HOUR,
        expected_hours=hours,
        on_demand_per_hour=od,
        spot_per_hour=spot,
        on_demand_cost=od * on_demand_hours,
        spot_cost=spot * hours,
        break_even_rate_per_hour=break_even,
        break_even_rate_per_instance_per_hour=None
        if break_even is None
        else break_even / instances,
        no_checkpoint_hours=no_ckpt,
        no_checkpoint_cost=spot * no_ckpt,
        assumptions=_assumptions(
            rate_per_hour, instances, schedule, given, save, restart, hours / on_demand_hours
        ),
    )


def _restart(restart_seconds: float) -> float:
    if not math.isfinite(restart_seconds) or restart_seconds < 0:
        raise ConfigError(f"restart time must be >= 0 seconds, got {restart_seconds!r}")
    return float(restart_seconds)


def _never_finishes(rate: float, schedule: Schedule, save: float, given: bool) -> ConfigError:
    """The error for a job whose expected time overflows, with the numbers that make it so."""
    longest = max(schedule.interval_seconds, schedule.last_seconds) + save
    exponent = rate * longest / SECONDS_PER_HOUR
    fix = (
        f"checkpoint more often (the optimum is {optimal_interval(rate, save):,.0f} s)"
        if given
        else "make the save shorter"
    )
    return ConfigError(
        f"interruption rate {rate:g}/h (one every {SECONDS_PER_HOUR / rate:,.0f} s on average): "
        f"a segment of {longest:,.0f} s of work and save runs "
        f"through with probability e^-{exponent:,.0f}, so the expected time exceeds 1e300 h "
        f"(the job effectively never finishes); {fix}, or use on-demand"
    )


def _assumptions(
    rate_per_instance: float,
    instances: int,
    schedule: Schedule,
    given: bool,
    save: float,
    restart: float,
    factor: float,
) -> list[str]:
    rate = rate_per_instance * instances
    parts = "1 interval" if schedule.count == 1 else f"{schedule.count:,} equal intervals"
    source = "given" if given else f"exact optimum: the work in {parts}"
    fleet = (
        f"{instances} instances x {rate_per_instance:.4g}/h = {rate:.4g}/h for the job "
        "(any interruption stops it)"
        if instances > 1
        else f"{rate:.4g}/h"
    )
    return [
        f"interruptions are a Poisson process: {fleet}",
        "exact expected time: each interval of work and its save is retried until it runs "
        "through; an interruption loses the work since the last checkpoint plus the restart, "
        "and a restart is not itself interrupted",
        f"checkpoint every {schedule.interval_seconds:.0f} s ({source}), save {save:g} s, "
        f"restart {restart:g} s",
        "Young and Daly intervals are first-order approximations, shown for reference",
        f"on-demand runs without interruptions; it writes the finished model too (one {save:g} s "
        "save), so both pay the final save and only the saves before it are checkpoint overhead",
        f"spot overhead factor {factor:.3f} ({fmt_pct(factor - 1)} more hours)",
    ]


def break_even_rate(
    on_demand_per_hour: float,
    spot_per_hour: float,
    save_seconds: float,
    restart_seconds: float,
    interval_seconds: float | None = None,
    *,
    work_hours: float | None = None,
) -> float | None:
    """The job's interruptions per hour above which spot costs more than on-demand (None: spot
    never pays), from the exact expected time.

    For a job of `work_hours` (None: per hour of work in a long job), whose on-demand time
    includes the final save as spot's does. The interval is the optimum at each rate unless
    `interval_seconds` is fixed. Found by bisection on log(rate): the expected time rises
    monotonically with the rate.
    """
    if spot_per_hour >= on_demand_per_hour:
        return None
    target = on_demand_per_hour / spot_per_hour

    def excess(rate: float) -> float:
        return (
            _time_multiple(rate, save_seconds, restart_seconds, interval_seconds, work_hours)
            - target
        )

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


def _time_multiple(
    rate: float, save: float, restart: float, interval: float | None, work_hours: float | None
) -> float:
    """Expected wall time on spot over the on-demand time (the work and the final save) at
    `rate` interruptions per hour; per unit of work in a long job without `work_hours`."""
    rate_s = rate / SECONDS_PER_HOUR
    if work_hours is None:
        tau = interval or optimal_interval(rate, save)
        return _retries(rate_s * (tau + save)) * (1.0 / rate_s + restart) / tau
    work = work_hours * SECONDS_PER_HOUR
    schedule = Schedule.fixed(work, interval) if interval else Schedule.best(work, rate, save)
    return _hours(schedule, rate, save, restart) / (work_hours + save / SECONDS_PER_HOUR)
