"""What a trial's throughput costs: the price, dollars per million tokens, and the projected
cost of the whole configured job.

The price is the config's [cost] section, or a catalog instance given with --instance; the
dollars come from `thrifty.measure.cost.CostMeter` (which bills whole catalog instances) and
the spot lever from the planner (`thrifty.plan.spot.spot_economics`). Units: seconds, US
dollars, dollars per hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from thrifty.config import CostConfig
from thrifty.errors import ConfigError, ThriftyError
from thrifty.measure.cost import CostMeter

if TYPE_CHECKING:
    from thrifty.config import RunConfig
    from thrifty.plan.catalog import Instance
    from thrifty.plan.spot import SpotPlan
    from thrifty.search.tune.trials import Trial

_COUNT = 10**9  # tokens (or samples) the meter is asked about: large enough to round nothing


@dataclass(frozen=True, slots=True)
class Price:
    """What the tuned job pays per hour; `cost` is None when no price was given.

    `instance` is the catalog instance (for the spot lever) and `instances` how many of it
    the job is billed for; `on_demand_usd_per_hour` is None where unknown.
    """

    cost: CostConfig | None
    source: str = "no price: give a [cost] section or --instance"
    usd_per_hour: float | None = None
    on_demand_usd_per_hour: float | None = None
    pricing: str = "on-demand"
    instance: Instance | None = None
    instances: int = 0
    gpus: int = 0

    @property
    def priced(self) -> bool:
        return self.cost is not None

    def meter(self) -> CostMeter:
        """A new meter at this price (for one process: the trials run one)."""
        assert self.cost is not None, "meter() needs a price"
        return CostMeter.from_config(self.cost, world_size=1)


def price_for(cost: CostConfig, instance: str | None, flag: str = "--instance") -> Price:
    """The price of `cost`, or of the catalog `instance` when given (at cost.pricing).
    An unknown instance is one line naming the closest catalog names."""
    from thrifty.plan.catalog import UnknownNameError, load_catalog

    if instance is not None:
        catalog = load_catalog(cost.catalog)
        try:
            found = catalog.instance(instance)
        except UnknownNameError as exc:
            raise ConfigError(f"{flag} {instance!r} is invalid: {exc}") from None
        cost = CostConfig(
            instance=found.name, pricing=cost.pricing, gpus=cost.gpus, catalog=cost.catalog
        )
    if not cost.enabled:
        return Price(None)
    meter = CostMeter.from_config(cost, world_size=1)
    listed = None
    if cost.instance is not None:
        listed = load_catalog(cost.catalog).instance(cost.instance)
    return Price(
        cost=cost,
        source=meter.source,
        usd_per_hour=meter.usd_per_hour,
        on_demand_usd_per_hour=meter.on_demand_usd_per_hour,
        pricing=meter.pricing,
        instance=listed,
        instances=meter.gpus // listed.gpu_count if listed else 0,
        gpus=meter.gpus,
    )


def usd_per_unit(price: Price, rate: float | None, unit: str) -> float | None:
    """Dollars per million tokens (unit "tokens") or per thousand samples, at `rate` per
    second; None without a price or a rate."""
    if not price.priced or not rate:
        return None
    meter = price.meter()
    if unit == "tokens":
        return meter.update(_COUNT / rate, tokens=_COUNT).usd_per_million_tokens
    return meter.update(_COUNT / rate, samples=_COUNT).usd_per_thousand_samples


@dataclass(frozen=True, slots=True)
class Job:
    """The configured job's length: run.max_tokens and run.max_steps (the first reached ends
    it). Time and epoch budgets are not projected: their length in work is not known here."""

    max_tokens: int | None
    max_steps: int | None

    @classmethod
    def of(cls, run: RunConfig) -> Job:
        return cls(run.max_tokens, run.max_steps)

    def seconds(self, trial: Trial) -> float | None:
        """How long the job takes at `trial`'s pace, None when it cannot be told."""
        options = []
        if self.max_tokens and trial.tokens_per_second:
            options.append(self.max_tokens / trial.tokens_per_second)
        if self.max_steps and trial.step_seconds:
            options.append(self.max_steps * trial.step_seconds)
        return min(options) if options else None

    def describe(self) -> str:
        parts = []
        if self.max_steps:
            parts.append(f"{self.max_steps:,} steps")
        if self.max_tokens:
            parts.append(f"{self.max_tokens:,} tokens")
        return " or ".join(parts) or "no run.max_steps or run.max_tokens"


def job_usd(price: Price, seconds: float | None) -> float | None:
    """Dollars for `seconds` of the job at `price`."""
    if not price.priced or seconds is None:
        return None
    return price.meter().project(remaining_seconds=seconds).total_usd


def spot_plan(
    price: Price, work_hours: float, interruption_rate: float | str
) -> tuple[SpotPlan | None, str]:
    """The planner's spot economics for the job on its catalog instance, and a note saying
    what it assumed or why there is none. `interruption_rate`: per hour, or an AWS advisor
    bucket (checkpoint.interruption_rate)."""
    from thrifty.plan.spot import interruption_rate as rate_of
    from thrifty.plan.spot import spot_economics

    found = price.instance
    if found is None:
        return None, "no catalog instance: give --instance (or cost.instance) for the spot lever"
    if found.spot_per_hour is None:
        return None, f"{found.name} has no spot price in the catalog: no spot lever"
    if isinstance(interruption_rate, str):
        rate = rate_of(advisor_bucket=interruption_rate)
    else:
        rate = rate_of(rate_per_hour=interruption_rate)
    try:
        plan = spot_economics(
            work_hours,
            on_demand_per_hour=found.on_demand_per_hour * price.instances,
            spot_per_hour=found.spot_per_hour * price.instances,
            rate_per_hour=rate,
            instances=price.instances,  # any one interrupted stops the job
        )
    except ThriftyError as exc:
        return None, f"no spot lever: {exc}"
    return plan, (
        f"spot: {found.name} ${found.spot_per_hour:g}/h ({found.dated_source}), "
        f"checkpoint.interruption_rate {interruption_rate!r} = {rate:.3g}/h, save "
        f"{plan.save_seconds:g} s and restart {plan.restart_seconds:g} s assumed: x"
        f"{plan.overhead_factor:.3f} more hours (thrifty.plan.spot)"
    )
