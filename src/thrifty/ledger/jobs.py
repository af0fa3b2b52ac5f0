"""Attempts that share a checkpoint location are one job: one row, their costs summed.

A job relaunched on a new machine (SkyPilot after a spot reclaim, Slurm after a requeue on
another node) leaves a run directory on each machine, all resuming from one checkpoint
location. Each directory was billed for the seconds it trained itself: from step 0, or from
the step it resumed at, to its last record, plus what preemptions it saw threw away. Those
parts add up to the job's bill; the work an earlier machine did past the step the next one
resumed from was paid for and done again, so it is counted as thrown away, apart.

A run killed and resumed in one directory is one attempt already: its summary (or its last
`resumed` event) carries the seconds it threw away.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from thrifty.ledger.attempt import Attempt, Price, Saved


@dataclass(frozen=True, slots=True)
class Part:
    """One attempt's share of a job: the seconds it was billed for, `wasted_seconds` of them
    thrown away (by a preemption it saw, or past the step the next attempt resumed from)."""

    attempt: Attempt
    seconds: float
    wasted_seconds: float
    redone_steps: int

    @property
    def price(self) -> Price | None:
        return self.attempt.price

    def usd(self, seconds: float | None = None) -> float | None:
        """Dollars for `seconds` (default: all its own) at this attempt's price."""
        price = self.attempt.price
        seconds = self.seconds if seconds is None else seconds
        return None if price is None else seconds * price.usd_per_hour / 3600


@dataclass(frozen=True, slots=True)
class Job:
    """One row of the ledger: a run and its relaunches. Dollars are None where a part had no
    price; `bytes` and `storage_usd_month` are its checkpoint location's (None: not read)."""

    location: str
    parts: tuple[Part, ...]
    bytes: int | None = None
    storage_usd_month: float | None = None
    checkpoints: tuple[int, ...] = ()
    levers: dict[str, float] = field(default_factory=dict)  # lever -> dollars it saved (tune)
    notes: tuple[str, ...] = ()

    @property
    def last(self) -> Attempt:
        """The attempt that ended last: its name and state are the job's."""
        return max((p.attempt for p in self.parts), key=lambda a: (a.last_step, a.ended))

    @property
    def name(self) -> str:
        return self.last.name

    @property
    def state(self) -> str:
        running = any(p.attempt.state == "running" for p in self.parts)
        return "running" if running else self.last.state

    @property
    def reason(self) -> str | None:
        return self.last.reason

    @property
    def sweep(self) -> str | None:
        return self.last.sweep

    @property
    def started(self) -> datetime:
        return min(p.attempt.started for p in self.parts)

    @property
    def ended(self) -> datetime:
        return max(p.attempt.ended for p in self.parts)

    @property
    def steps(self) -> int:
        return max(p.attempt.last_step for p in self.parts)

    @property
    def machines(self) -> int:
        return len(self.parts)

    @property
    def seconds(self) -> float:
        """Seconds billed, every relaunch and resume included."""
        return sum(p.seconds for p in self.parts)

    @property
    def gpu_hours(self) -> float:
        return sum(p.seconds * p.attempt.gpus for p in self.parts) / 3600

    @property
    def usd(self) -> float | None:
        return _total(p.usd() for p in self.parts)

    @property
    def wasted_usd(self) -> float | None:
        return _total(p.usd(p.wasted_seconds) for p in self.parts)

    @property
    def wasted_seconds(self) -> float:
        return sum(p.wasted_seconds for p in self.parts)

    @property
    def on_demand_usd(self) -> float | None:
        """What the same seconds would have cost on-demand (None where a rate is unknown)."""
        rates = [
            (p.seconds, p.price.on_demand_usd_per_hour if p.price else None) for p in self.parts
        ]
        return _total(None if rate is None else s * rate / 3600 for s, rate in rates)

    @property
    def pricing(self) -> str:
        found = sorted({p.price.pricing for p in self.parts if p.price is not None})
        return "+".join(found) or "-"

    @property
    def saved(self) -> Saved | None:
        return self.last.saved

    @property
    def config_label(self) -> str:
        return self.last.config_label


def _total(values: Iterable[float | None]) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def join(attempts: Sequence[Attempt]) -> list[Job]:
    """The jobs `attempts` make: those sharing a checkpoint location are one, in the order
    they trained. Ordered by start."""
    by_location: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        by_location.setdefault(attempt.location, []).append(attempt)
    jobs = [Job(location, _parts(group)) for location, group in by_location.items()]
    return sorted(jobs, key=lambda j: (j.started, j.name))


def _parts(attempts: list[Attempt]) -> tuple[Part, ...]:
    """Each attempt's own seconds: its training from where it began, the work it threw away,
    and its wall time outside the training clock. One that resumed where the earlier one had
    recorded its step starts from that record's seconds (exact); otherwise from its own first
    record's."""
    ordered = sorted(attempts, key=lambda a: (a.first_step, a.ended))
    parts: list[Part] = []
    for index, attempt in enumerate(ordered):
        start = _start_seconds(attempt, ordered[:index])
        later = ordered[index + 1] if index + 1 < len(ordered) else None
        lost_seconds, lost_steps = 0.0, 0
        if later is not None and later.first_step < attempt.last_step:
            at = attempt.seconds_at(later.first_step)
            resume_seconds = at if at is not None else _start_seconds(later, [attempt])
            lost_seconds = max(0.0, attempt.seconds - resume_seconds)
            lost_steps = attempt.last_step - later.first_step
        parts.append(
            Part(
                attempt,
                seconds=max(0.0, attempt.seconds - start)
                + attempt.wasted_seconds
                + attempt.overhead_seconds,
                wasted_seconds=attempt.wasted_seconds + lost_seconds,
                redone_steps=attempt.redone_steps + lost_steps,
            )
        )
    return tuple(parts)


def _start_seconds(attempt: Attempt, earlier: list[Attempt]) -> float:
    if attempt.first_step == 0:
        return 0.0
    for before in reversed(earlier):
        at = before.seconds_at(attempt.first_step)
        if at is not None:
            return at
    return attempt.timeline[0][1] if attempt.timeline else 0.0
