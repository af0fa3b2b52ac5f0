"""`thrifty plan`'s priced sections: hours of work on an instance on-demand and on spot at an
interruption rate (given, or an advisor bucket), and the instance's 1- and 3-year commitments;
and the hardware and prices they rest on."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thrifty.errors import ConfigError
from thrifty.plan.catalog import Catalog
from thrifty.plan.estimate import Estimate, Hardware, resolve_hardware
from thrifty.plan.spot import SpotPlan

if TYPE_CHECKING:
    from thrifty.commands.plan.sections import Sections


def rate_given(args: argparse.Namespace) -> bool:
    """Whether the options give an interruption rate (per hour, MTBI or an advisor bucket)."""
    return any(v is not None for v in (args.interruptions_per_hour, args.mtbi_hours, args.advisor))


def spot_section(
    args: argparse.Namespace, hardware: Hardware, est: Estimate | None, sections: Sections
) -> SpotPlan | None:
    """The job's spot economics, added to `sections` when an estimate and a rate are given
    (None otherwise); one line when the instance has no spot price."""
    if est is None or not rate_given(args):
        return None
    if hardware.instance is None or hardware.instance.spot_per_hour is None:
        name = hardware.instance.name if hardware.instance else hardware.gpu.name
        raise ConfigError(
            f"spot economics need a spot price: {name} has none in the catalog; "
            "choose a spot-priced --instance (see 'thrifty prices --instances')"
        )
    plan = spot_plan(args, hardware, est.hours)
    sections.add("spot", plan)
    return plan


def hours_section(args: argparse.Namespace, catalog: Catalog, sections: Sections) -> None:
    """`--hours H` on `--instance NAME` (or on the cheapest catalog instance with `--count`
    GPUs `--gpu`): H hours of work priced on-demand, on spot with the interruptions the rate
    given (or the 5-10% advisor bucket) makes expected, and under each commitment."""
    hardware = priced_hardware(args, catalog, "--hours")
    instance = hardware.instance
    assert instance is not None  # priced_hardware found one
    if instance.spot_per_hour is not None:
        sections.add("spot", spot_plan(args, hardware, args.hours, default_bucket="5-10%"))
    else:
        sections.add("hours", _on_demand_hours(hardware, args.hours))
    commitment_section(args, hardware, args.hours, sections)


def priced_hardware(args: argparse.Namespace, catalog: Catalog, what: str) -> Hardware:
    """`--instance`, or for `--gpu` the cheapest catalog instance with `--count` of that GPU."""
    from thrifty.plan.estimate import priced_gpu

    if args.instance is not None and args.gpu is not None:
        raise ConfigError("give --instance or --gpu, not both (an instance names its GPU)")
    if args.instance is not None:
        return resolve_hardware(instance=args.instance, gpu=None, count=args.count, catalog=catalog)
    if args.gpu is None:
        raise ConfigError(
            f"{what} needs a priced --instance, e.g. --instance p4d.24xlarge, or --gpu NAME "
            "(e.g. --gpu A10G: priced on the cheapest catalog instance with it)"
        )
    hardware = priced_gpu(args.gpu, args.count, catalog)
    if hardware.instance is None:
        raise ConfigError(
            f"{what}: no catalog instance has {args.count} x {hardware.gpu.name} to price it on; "
            "give --instance (see 'thrifty prices --instances') or add one in a --catalog file"
        )
    return hardware


@dataclass
class OnDemandHours:
    """Hours of work on an instance without a spot price: what they cost on-demand."""

    instance: str
    instances: int
    hours: float
    on_demand_per_hour: float  # USD per hour for all the instances
    cost: float  # USD
    assumptions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _on_demand_hours(hardware: Hardware, hours: float) -> OnDemandHours:
    instance = hardware.instance
    assert instance is not None  # priced hardware
    price = usd_per_hour(hardware, "on-demand")
    return OnDemandHours(
        instance=instance.name,
        instances=hardware.count,
        hours=hours,
        on_demand_per_hour=price,
        cost=price * hours,
        assumptions=[
            f"prices for {instance.name}: {instance.dated_source}; no spot price in the catalog"
        ],
    )


def commitment_section(
    args: argparse.Namespace, hardware: Hardware, job_hours: float, sections: Sections
) -> None:
    """The instance's 1- and 3-year commitments against on-demand and spot, for jobs of
    `job_hours`, at the interruption rate given (else the 5-10% advisor bucket)."""
    from thrifty.plan.commitment import commitment_plan

    instance = hardware.instance
    if instance is None or not instance.commitments():
        return
    rate, bucket = _rate(args, "5-10%")
    plan = commitment_plan(
        instance,
        rate_per_hour=rate,
        job_hours=job_hours,
        save_seconds=args.save_seconds,
        restart_seconds=args.restart_seconds,
    )
    if bucket and not rate_given(args) and instance.spot_per_hour is not None:
        plan.assumptions.append(f"advisor bucket {bucket} (no rate given: thrifty's default)")
    sections.add("commitment", plan)


def _rate(args: argparse.Namespace, default_bucket: str | None) -> tuple[float, str | None]:
    """Interruptions per hour of one instance from the options, else `default_bucket`."""
    from thrifty.plan.spot import interruption_rate

    bucket = args.advisor or (None if rate_given(args) else default_bucket)
    rate = interruption_rate(
        rate_per_hour=args.interruptions_per_hour,
        mtbi_seconds=args.mtbi_hours * 3600 if args.mtbi_hours is not None else None,
        advisor_bucket=bucket,
    )
    return rate, bucket


def spot_plan(
    args: argparse.Namespace,
    hardware: Hardware,
    work_hours: float,
    default_bucket: str | None = None,
) -> SpotPlan:
    """`work_hours` on `hardware` on-demand and on spot, at the interruption rate the options
    give (else `default_bucket`, an advisor bucket, said so among the assumptions)."""
    from thrifty.plan.spot import spot_economics

    default = None if rate_given(args) else default_bucket
    rate, bucket = _rate(args, default_bucket)
    plan = spot_economics(
        work_hours,
        on_demand_per_hour=usd_per_hour(hardware, "on-demand"),
        spot_per_hour=usd_per_hour(hardware, "spot"),
        rate_per_hour=rate,
        instances=hardware.count,
        save_seconds=args.save_seconds,
        restart_seconds=args.restart_seconds,
        interval_seconds=args.checkpoint_interval,
    )
    if bucket:
        why = " (no rate given: thrifty's default)" if default else ""
        plan.assumptions.append(
            f"advisor bucket {bucket}{why}: its midpoint read as the monthly probability of an "
            "interruption"
        )
    return plan


def usd_per_hour(hardware: Hardware, pricing: str) -> float:
    """USD per hour of the job's instances at `pricing`, which its section checked they have."""
    price = hardware.price_per_hour(pricing)
    if price is None:
        raise ConfigError(f"this section needs a {pricing} price: give a priced --instance")
    return price
