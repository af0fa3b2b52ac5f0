"""`thrifty prices`: the GPU and instance catalog, with dated prices and their sources.

Registering only builds the parser; the handler imports the planner when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from thrifty.console import add_output_options
from thrifty.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `prices` to the `thrifty` command line."""
    prices = subparsers.add_parser(
        "prices",
        help="list the GPU and instance catalog with dated prices",
        description="List GPUs (peak FLOP/s, memory, links) and instances (on-demand and spot "
        "$/hour, each with its source and date). Give NAME to show one entry.",
    )
    prices.add_argument("name", nargs="?", help="one GPU or instance to show in full")
    which = prices.add_mutually_exclusive_group()
    which.add_argument("--gpus", action="store_true", help="list only GPUs")
    which.add_argument("--instances", action="store_true", help="list only instances")
    prices.add_argument("--provider", help="only instances of this provider (aws, gcp, ...)")
    add_catalog_options(prices)
    prices.set_defaults(handler=run_prices)


def add_catalog_options(parser: argparse.ArgumentParser) -> None:
    """--catalog and --json, which `plan` takes too."""
    parser.add_argument(
        "--catalog",
        metavar="FILE",
        help="TOML file adding to or overriding the built-in catalog "
        "(default: $THRIFTY_CATALOG if set)",
    )
    add_output_options(parser, json="print JSON instead of tables")


def run_prices(args: argparse.Namespace) -> int:
    """List the catalog, or show one entry (`NAME`), as tables or JSON."""
    from thrifty.console import console, to_json
    from thrifty.plan import tables as report
    from thrifty.plan.catalog import load_catalog

    catalog = load_catalog(args.catalog)
    if args.name:
        item = catalog.find(args.name)
        commitment = _commitment(item)
        if args.json:
            data = report.item_dict(item)
            if commitment is not None:
                data["commitment"] = commitment.as_dict()
            print(to_json(data))
            return 0
        out = console()
        out.print(report.detail_table(item))
        if commitment is not None:
            out.print(report.commitment_table(commitment))
            for line in report.commitment_lines(commitment):
                out.print(f"  {line}", markup=False, soft_wrap=True)
            report.print_assumptions(out, commitment.assumptions)
        return 0
    instances = [
        i
        for i in catalog.instances.values()
        if not args.provider or i.provider == args.provider.lower()
    ]
    if args.provider and not instances:
        providers = sorted({i.provider for i in catalog.instances.values()})
        raise ConfigError(
            f"--provider {args.provider!r} has no instances; known: {', '.join(providers)}"
        )
    gpus = [] if args.instances else list(catalog.gpus.values())
    instances = [] if args.gpus else instances
    if args.json:
        print(to_json(report.catalog_dict(catalog, gpus, instances)))
        return 0
    out = console()
    if gpus:
        out.print(report.gpus_table(gpus))
    if instances:
        table, sources = report.instances_table(instances)
        out.print(table)
        for line in sources:
            out.print(f"  {line}", markup=False)
        out.print(
            "  spot: a single quoted price, or the median across the zones listed "
            "('thrifty prices NAME' shows them); the range's midpoint where zones are not listed"
        )
        committed = report.committed_line(instances)
        if committed is not None:
            out.print(f"  {committed}", markup=False)
        untraced = [i.name for i in instances if not i.price_traced]
        if untraced:
            out.print(
                "  † untraced (no primary source; check before relying on them): "
                + ", ".join(untraced),
                markup=False,
            )
    out.print(
        f"[dim]catalog: {', '.join(_short(f) for f in catalog.files)}; * = uncertain per its "
        "source; 'thrifty prices NAME' shows one entry with its sources[/dim]"
    )
    return 0


def _commitment(item: Any) -> Any:
    """An instance's commitments against on-demand and spot (jobs of a day, the 5-10% advisor
    bucket), or None for a GPU or an instance without committed prices."""
    from thrifty.plan.catalog import Instance
    from thrifty.plan.commitment import DEFAULT_JOB_HOURS, commitment_plan
    from thrifty.plan.spot import interruption_rate

    if not isinstance(item, Instance) or not item.commitments():
        return None
    plan = commitment_plan(item, rate_per_hour=interruption_rate(advisor_bucket="5-10%"))
    if item.spot_per_hour is not None:
        plan.assumptions.append(
            f"spot at the 5-10% advisor bucket, jobs of {DEFAULT_JOB_HOURS:g} h: 'thrifty plan "
            f"--instance {item.name} --hours H --advisor BUCKET' for yours"
        )
    return plan


def _short(path: str) -> str:
    from thrifty.plan.catalog import BUILTIN_PATH

    return "built-in catalog.toml" if path == str(BUILTIN_PATH) else path
