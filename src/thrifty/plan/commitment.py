"""Committed prices (1- and 3-year savings plans, reserved instances, committed use) beside
on-demand and spot: at what share of the committed hours a commitment pays.

A commitment of C USD per hour is billed for every hour of its term, used or not; on-demand
bills O per hour used; spot bills S per hour it runs, and a job on spot runs longer than its
work by the interruptions it meets (`thrifty.plan.spot`): per hour of finished work it costs
S_eff = expected spot cost / on-demand hours of the same job. Used at a share u of the term's
hours, a commitment costs C / u per hour used, so it beats on-demand above u = C / O and beats
spot above u = C / S_eff (above 1: never). Units: USD per hour per instance, hours per month.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from thrifty.errors import ConfigError
from thrifty.plan.catalog import Instance
from thrifty.plan.spot import HOURS_PER_MONTH, SpotPlan, spot_economics
from thrifty.plan.units import fmt_pct, require_positive

DEFAULT_JOB_HOURS = 24.0  # the spot model's job length when none is given: a day's run


@dataclass(frozen=True, slots=True, kw_only=True)
class Term:
    """One commitment: its price, and the share of its hours above which it pays."""

    term: str  # "1-year" or "3-year"
    per_hour: float  # USD per hour of the term, per instance
    discount: float  # off on-demand, 0-1
    break_even_on_demand: float  # share of the term's hours
    break_even_spot: float | None  # None without a spot price; above 1: never beats spot


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What a month of `instance_hours` costs each way, and which is cheapest."""

    instance_hours: float  # per month
    committed_instances: int
    utilisation: float  # of the committed instances' hours
    monthly_usd: dict[str, float]  # by pricing: on-demand, spot, 1-year, 3-year
    cheapest: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitmentPlan:
    """The break-even of each commitment an instance has, and (given a usage) which pays."""

    instance: str
    on_demand_per_hour: float
    spot_per_hour: float | None
    spot_effective_per_hour: float | None  # per hour of work, expected interruptions included
    terms: list[Term]
    source: str
    uncertain: bool
    usage: Usage | None = None
    assumptions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def commitment_plan(
    instance: Instance,
    *,
    rate_per_hour: float,
    job_hours: float = DEFAULT_JOB_HOURS,
    save_seconds: float = 60.0,
    restart_seconds: float = 600.0,
    instance_hours_per_month: float | None = None,
) -> CommitmentPlan:
    """The commitments of `instance` against on-demand and against spot at `rate_per_hour`
    interruptions per hour, for jobs of `job_hours` hours of work; with
    `instance_hours_per_month`, which pricing pays least for that usage."""
    terms = instance.commitments()
    if not terms:
        raise ConfigError(
            f"{instance.name} has no 1- or 3-year committed price in the catalog; add commit_1y "
            "or commit_3y to it in a --catalog file (see 'thrifty prices --instances')"
        )
    on_demand = instance.on_demand_per_hour
    spot_plan = None
    if instance.spot_per_hour is not None:
        spot_plan = spot_economics(
            require_positive(job_hours, "job hours"),
            on_demand_per_hour=on_demand,
            spot_per_hour=instance.spot_per_hour,
            rate_per_hour=rate_per_hour,
            save_seconds=save_seconds,
            restart_seconds=restart_seconds,
        )
    effective = spot_effective_per_hour(spot_plan) if spot_plan else None
    rows = [
        Term(
            term=term,
            per_hour=price,
            discount=1 - price / on_demand,
            break_even_on_demand=price / on_demand,
            break_even_spot=None if effective is None else price / effective,
        )
        for term, price in terms.items()
    ]
    usage = None
    if instance_hours_per_month is not None:
        usage = monthly_usage(instance_hours_per_month, on_demand, effective, terms)
    fields = {f"commit_{t[0]}y" for t in terms}
    return CommitmentPlan(
        instance=instance.name,
        on_demand_per_hour=on_demand,
        spot_per_hour=instance.spot_per_hour,
        spot_effective_per_hour=effective,
        terms=rows,
        source=f"{instance.commit_source}, {instance.commit_date}",
        uncertain=bool(fields & set(instance.uncertain)),
        usage=usage,
        assumptions=_assumptions(spot_plan, job_hours, rate_per_hour),
    )


def spot_effective_per_hour(plan: SpotPlan) -> float:
    """Expected spot USD per hour of finished work: the spot cost of the job, interruptions,
    lost work and restarts included, over its uninterrupted hours (work and final save)."""
    return plan.spot_cost / plan.on_demand_hours


def monthly_usage(
    instance_hours: float,
    on_demand_per_hour: float,
    spot_effective: float | None,
    commitments: dict[str, float],
) -> Usage:
    """A month of `instance_hours` on-demand, on spot and under each commitment; the
    commitment covers them with whole instances, each billed every hour of the month."""
    hours = require_positive(instance_hours, "instance-hours per month")
    committed = max(1, math.ceil(hours / HOURS_PER_MONTH - 1e-9))
    costs = {"on-demand": on_demand_per_hour * hours}
    if spot_effective is not None:
        costs["spot"] = spot_effective * hours
    for term, price in commitments.items():
        costs[term] = price * HOURS_PER_MONTH * committed
    return Usage(
        instance_hours=hours,
        committed_instances=committed,
        utilisation=hours / (HOURS_PER_MONTH * committed),
        monthly_usd=costs,
        cheapest=min(costs, key=costs.__getitem__),
    )


def _assumptions(plan: SpotPlan | None, job_hours: float, rate: float) -> list[str]:
    notes = [
        f"a commitment bills every hour of its term ({HOURS_PER_MONTH:g} hours a month), used "
        "or not; the break-even is the share of those hours you must use for it to pay"
    ]
    if plan is None:
        notes.append("no spot price in the catalog: commitments compared with on-demand only")
        return notes
    notes.append(
        f"spot per hour of work from the expected-cost model: jobs of {job_hours:g} h at "
        f"{rate:.3g} interruptions/h, {plan.expected_interruptions:.3g} expected each, "
        f"{fmt_pct(plan.overhead_factor - 1)} longer than uninterrupted"
    )
    return notes
