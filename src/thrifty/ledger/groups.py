"""Totals of the ledger's rows, whole or grouped by month, config or sweep; and each row as data.

A total adds what every row has: seconds, GPU-hours, dollars (a row without a price leaves
the dollar totals unknown, and the total says how many it left out), the dollars thrown away
by preemptions, what stops before the budget saved, and what measured levers saved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from thrifty.errors import ThriftyError
from thrifty.ledger.jobs import Job

GROUPINGS = ("month", "config", "sweep")


@dataclass(frozen=True, slots=True)
class Total:
    """The sums over `runs` rows. `unpriced`: rows whose dollars are unknown (left out)."""

    label: str
    runs: int
    seconds: float
    gpu_hours: float
    usd: float
    wasted_usd: float
    saved_usd: float
    levers_usd: float
    storage_bytes: int
    storage_usd_month: float
    unpriced: int = 0
    levers: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def total(label: str, jobs: Sequence[Job]) -> Total:
    """The sums over `jobs`."""
    priced = [j for j in jobs if j.usd is not None]
    levers: dict[str, float] = {}
    for job in jobs:
        for name, usd in job.levers.items():
            levers[name] = levers.get(name, 0.0) + usd
    return Total(
        label=label,
        runs=len(jobs),
        seconds=sum(j.seconds for j in jobs),
        gpu_hours=sum(j.gpu_hours for j in jobs),
        usd=sum(j.usd or 0.0 for j in priced),
        wasted_usd=sum(j.wasted_usd or 0.0 for j in priced),
        saved_usd=sum((j.saved.usd or 0.0) for j in jobs if j.saved is not None),
        levers_usd=sum(levers.values()),
        storage_bytes=sum(j.bytes or 0 for j in jobs),
        storage_usd_month=sum(j.storage_usd_month or 0.0 for j in jobs),
        unpriced=sum(1 for j in jobs if j.usd is None and j.state != "in bucket"),
        levers=levers,
    )


def key_of(by: str) -> Callable[[Job], str]:
    """What groups rows `by` month (the month a job started, UTC), config or sweep."""
    if by == "month":
        return lambda j: j.started.strftime("%Y-%m")
    if by == "config":
        return lambda j: j.config_label
    if by == "sweep":
        return lambda j: j.sweep or "(no sweep)"
    raise ThriftyError(f"--by {by!r} is invalid: use {', '.join(GROUPINGS)}")


def grouped(jobs: Sequence[Job], by: str) -> list[Total]:
    """One total per group, in the order the groups first appear (months in order)."""
    key = key_of(by)
    groups: dict[str, list[Job]] = {}
    for job in sorted(jobs, key=lambda j: j.started):
        groups.setdefault(key(job), []).append(job)
    return [total(label, members) for label, members in groups.items()]


def job_dict(job: Job) -> dict[str, Any]:
    """A row as data (what --json prints): dollars in USD, seconds, bytes."""
    saved = job.saved
    return {
        "name": job.name,
        "started": job.started.isoformat(timespec="seconds"),
        "ended": job.ended.isoformat(timespec="seconds"),
        "state": job.state,
        "reason": job.reason,
        "sweep": job.sweep,
        "config": job.config_label,
        "steps": job.steps,
        "seconds": job.seconds,
        "gpu_hours": job.gpu_hours,
        "pricing": job.pricing,
        "usd": job.usd,
        "on_demand_usd": job.on_demand_usd,
        "wasted_usd": job.wasted_usd,
        "wasted_seconds": job.wasted_seconds,
        "redone_steps": sum(p.redone_steps for p in job.parts),
        "saved": None if saved is None else asdict(saved),
        "levers": job.levers,
        "location": job.location,
        "checkpoints": list(job.checkpoints),
        "storage_bytes": job.bytes,
        "storage_usd_month": job.storage_usd_month,
        "machines": [
            {
                "run_dir": str(p.attempt.path),
                "seconds": p.seconds,
                "usd": p.usd(),
                "wasted_seconds": p.wasted_seconds,
                "first_step": p.attempt.first_step,
                "last_step": p.attempt.last_step,
            }  # fmt: skip
            for p in job.parts
        ],
        "notes": [n for p in job.parts for n in p.attempt.notes],
    }
