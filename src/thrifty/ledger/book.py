"""The ledger of the folders and buckets given: its jobs, with storage and tune savings.

`read_ledger` finds the runs, joins the attempts of each job, reads each job's checkpoint
location (the bytes kept there, priced per month from the catalog's storage rows), adds the
lever savings a tune measured for the config a job ran, and says in one line each what it
could not read or count.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from thrifty.checkpointing.store.errors import CheckpointError
from thrifty.config.checks import is_number
from thrifty.errors import ThriftyError
from thrifty.ledger.attempt import Attempt, Price
from thrifty.ledger.finding import WHAT_TO_GIVE, Found, Tune, find
from thrifty.ledger.jobs import Job, Part, join
from thrifty.ledger.locations import Location, find_locations, read_location
from thrifty.plan.catalog import Catalog, StoragePrice, load_catalog

# The settings a tune chooses (thrifty.search.tune.space): a run whose config has the winner's
# values for each, and the same task, ran what the tune measured.
LEVER_KEYS = (
    ("precision", "mode"),
    ("batch", "micro"),
    ("activation_checkpointing", "policy"),
    ("compile", "mode"),
    ("data", "num_workers"),
)


@dataclass(slots=True)
class Ledger:
    """The jobs (one row each), the checkpoint locations read (by URL or path), the tunes
    found, and one line for each thing skipped or worth saying."""

    jobs: list[Job]
    locations: dict[str, Location] = field(default_factory=dict)
    tunes: list[Tune] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    storage_prices: dict[str, StoragePrice] = field(default_factory=dict)


def read_ledger(
    paths: Sequence[str],
    *,
    since: datetime | None = None,
    storage_options: Mapping[str, Any] | None = None,
    catalog: Catalog | None = None,
) -> Ledger:
    """The ledger of `paths` (folders of runs, bucket prefixes); runs started before `since`
    are left out. No run found is a ThriftyError naming the paths and the fix."""
    found = find(paths)
    catalog = catalog or load_catalog()
    ledger = Ledger([], tunes=found.tunes, skipped=list(found.skipped))
    locations = _bucket_locations(found, storage_options, ledger)
    attempts = found.attempts + _bucket_only(locations, found.attempts)
    jobs = [_with_storage(j, locations, storage_options, catalog, ledger) for j in join(attempts)]
    jobs = [_with_levers(j, found.tunes) for j in jobs]
    ledger.jobs = [j for j in jobs if since is None or j.started >= since]
    if not ledger.jobs:
        raise ThriftyError(_nothing(paths, found, since))
    ledger.notes += _price_notes(ledger.jobs)
    return ledger


def _nothing(paths: Sequence[str], found: Found, since: datetime | None) -> str:
    where = " ".join(paths)
    if since is not None and (found.attempts or found.buckets):
        return f"no run under {where} started on or after {since.date()}: give an earlier --since"
    if found.skipped:
        return f"no readable run under {where}: {found.skipped[0]}"
    return f"no thrifty run under {where}: {WHAT_TO_GIVE}"


# --- buckets and storage ---------------------------------------------------------------------


def _bucket_locations(
    found: Found, storage_options: Mapping[str, Any] | None, ledger: Ledger
) -> dict[str, Location]:
    """The locations under each bucket prefix given, by URL. A bucket that cannot be listed
    is a ThriftyError: it was asked for by name."""
    locations: dict[str, Location] = {}
    for url in found.buckets:
        try:
            under = find_locations(url, storage_options)
        except CheckpointError as exc:
            raise ThriftyError(str(exc)) from None
        if not under:
            ledger.skipped.append(f"{under_text(url)}: no checkpoint thrifty wrote is there")
        ledger.skipped += [line for loc in under for line in loc.skipped]
        locations.update((loc.url, loc) for loc in under)
    ledger.locations.update(locations)
    return locations


def under_text(url: str) -> str:
    from thrifty.redact import redact_text

    return redact_text(url)


def _bucket_only(locations: Mapping[str, Location], attempts: Sequence[Attempt]) -> list[Attempt]:
    """A row for each bucket location no run directory given resumed from: what its
    checkpoints tell (steps, when they were written), its dollars unknown."""
    known = {a.location for a in attempts}
    return [from_location(loc) for url, loc in locations.items() if url not in known]


def from_location(location: Location) -> Attempt:
    """An attempt read from a location alone (no run directory): its newest published step,
    the span its manifests were written in, and what the run had paid at its newest save (the
    cost record its manifest carries, every machine before it included)."""
    times = [c.created for c in location.checkpoints.values() if c.created is not None]
    steps = location.published or list(location.checkpoints)
    when = min(times) if times else datetime.fromtimestamp(0).astimezone()
    paid = _paid(location.newest_record)
    note = (
        "no run directory given: its dollars as of its newest checkpoint"
        if paid
        else "no run directory given: its dollars are unknown; give its run directories too"
    )
    return Attempt(
        path=Path(location.url.rsplit("/", 1)[-1] or location.url),
        name=location.url.rsplit("/", 1)[-1] or location.url,
        location=location.url,
        config={},
        state="in bucket",
        reason=None,
        started=when,
        ended=max(times) if times else when,
        first_step=0,
        last_step=max(steps, default=0),
        timeline=(),
        notes=(note,),
        **(paid or {"seconds": 0.0}),
    )


def _paid(record: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An Attempt's cost fields from a manifest's cost record (thrifty.measure.cost.CostMeter
    .record); None without a priced one."""
    if record is None or not is_number(record.get("usd_per_hour")):
        return None
    on_demand = record.get("on_demand_usd_per_hour")
    price = Price(
        usd_per_hour=float(record["usd_per_hour"]),
        pricing=str(record.get("pricing", "on-demand")),
        on_demand_usd_per_hour=float(on_demand) if isinstance(on_demand, (int, float)) else None,
        source=str(record.get("source", "")),
        catalog="checkpoint manifest",
    )
    return {
        "seconds": float(record.get("seconds") or 0.0),
        "wasted_seconds": float(record.get("wasted_seconds") or 0.0),
        "redone_steps": int(record.get("redone_steps") or 0),
        "overhead_seconds": float(record.get("overhead_seconds") or 0.0),
        "gpus": int(record.get("gpus") or 1),
        "price": price,
    }


def _with_storage(
    job: Job,
    locations: Mapping[str, Location],
    storage_options: Mapping[str, Any] | None,
    catalog: Catalog,
    ledger: Ledger,
) -> Job:
    """`job` with its location's bytes and their monthly price (a local disk is not priced)."""
    location = locations.get(job.location)
    if location is None:
        try:
            location = read_location(job.location, storage_options)
        except (CheckpointError, ThriftyError) as exc:
            ledger.notes.append(f"{job.name}: the bytes at {job.location} are unknown: {exc}")
            return job
        if location is not None:
            ledger.locations[location.url] = location
            ledger.skipped += location.skipped
    if location is None:
        return dataclasses.replace(job, bytes=0, storage_usd_month=0.0)
    price = catalog.storage_price(location.protocol)
    if price is not None:
        ledger.storage_prices[location.protocol] = price
    return dataclasses.replace(
        job,
        bytes=location.bytes,
        checkpoints=tuple(location.published),
        storage_usd_month=None if price is None else price.usd_per_month(location.bytes),
    )


# --- levers a tune measured ------------------------------------------------------------------


def _with_levers(job: Job, tunes: Sequence[Tune]) -> Job:
    """`job` with the dollars each lever saved it, where a tune measured the config it ran:
    its own cost at the baseline's pace less its cost, lever by lever in the tune's order."""
    tune = next((t for t in tunes if _ran_winner(job.last.config, t.winner)), None)
    usd = job.usd
    if tune is None or not usd:
        return job
    ratios = _measured_ratios(tune.data)
    if not ratios:
        return job
    levers, after = {}, usd
    for name, ratio in reversed(ratios):
        before = after * ratio
        levers[name] = before - after
        after = before
    return dataclasses.replace(job, levers=dict(reversed(list(levers.items()))))


def _ran_winner(config: Mapping[str, Any], winner: Mapping[str, Any] | None) -> bool:
    if not winner or not config or config.get("task") != winner.get("task"):
        return False
    return all(
        config.get(section, {}).get(key) == winner.get(section, {}).get(key)
        for section, key in LEVER_KEYS
        if key in winner.get(section, {})
    )


def _measured_ratios(data: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(lever, speed-up) of each step of the tune's waterfall that a paired comparison
    measured, in the waterfall's order; the price lever is not one (it is the run's own)."""
    waterfall = data.get("waterfall")
    steps = waterfall.get("steps") if isinstance(waterfall, dict) else None
    found = []
    for step in steps if isinstance(steps, list) else []:
        measured = step.get("measured") if isinstance(step, dict) else None
        ratio = measured.get("ratio") if isinstance(measured, dict) else None
        if isinstance(ratio, int | float) and math.isfinite(ratio) and ratio > 0:
            found.append((str(step.get("lever")), float(ratio)))
    return found


# --- what the sums mix -----------------------------------------------------------------------


def _price_notes(jobs: Sequence[Job]) -> list[str]:
    """A line when the rows were priced from different catalogs or currencies: their dollars
    are summed as billed, which the reader should know."""
    parts: list[Part] = [p for j in jobs for p in j.parts if p.price is not None]
    notes = []
    currencies = sorted({p.price.currency for p in parts if p.price})
    if len(currencies) > 1:
        notes.append(f"runs priced in different currencies ({', '.join(currencies)})")
    catalogs: dict[str, int] = {}
    for p in parts:
        if p.price is not None and p.price.catalog != "given":
            catalogs[p.price.catalog] = catalogs.get(p.price.catalog, 0) + 1
    if len(catalogs) > 1:
        listed = ", ".join(f"{name} ({count} run(s))" for name, count in sorted(catalogs.items()))
        notes.append(
            f"runs priced from different catalogs: {listed}; their dollars are summed as billed"
        )
    unpriced = [j.name for j in jobs if j.usd is None and j.state != "in bucket"]
    if unpriced:
        notes.append(
            f"{len(unpriced)} run(s) had no [cost] section, so no dollars: {', '.join(unpriced[:5])}"
        )
    return notes
