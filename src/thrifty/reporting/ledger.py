"""The ledger on the report of several runs or a folder of runs: spend over time, stacked by
run, and beside it what the runs saved over the same time, stacked by where it came from.

Each run's dollars are spread evenly from its start to its end (the records carry no clock
between), so the top edge of the stack is the team's spend so far on each day. Savings: spot
against the on-demand price, the stops before the budget (the forecast, early stopping,
pruning), and the levers a tune measured; the work preemptions threw away is its own layer
of the spend chart's legend note.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from thrifty.ledger.jobs import Job
from thrifty.reporting.charts import Chart, Series

UNITS = ((86400.0 * 2, 86400.0, "days"), (7200.0, 3600.0, "hours"), (120.0, 60.0, "minutes"))


def _unit(jobs: Sequence[Job], origin: datetime) -> tuple[float, str]:
    """The time axis' unit in seconds, and its name: days, hours, minutes or seconds, by
    the span the runs cover."""
    span = max(((j.ended - origin).total_seconds() for j in jobs), default=0.0)
    return next(((size, name) for above, size, name in UNITS if span >= above), (1.0, "seconds"))


def _spread(job: Job, amount: float, day: float, origin: datetime, unit: float) -> float:
    """How much of `amount` a job had spent (or saved) by `day` units after `origin`."""
    start = (job.started - origin).total_seconds() / unit
    end = (job.ended - origin).total_seconds() / unit
    if day >= end:
        return amount
    if day <= start or end <= start:
        return 0.0
    return amount * (day - start) / (end - start)


def _days(jobs: Sequence[Job], origin: datetime, unit: float) -> list[float]:
    """Where the stack changes slope: every start and end, in units after `origin`."""
    points = {0.0}
    for job in jobs:
        points.add((job.started - origin).total_seconds() / unit)
        points.add((job.ended - origin).total_seconds() / unit)
    return sorted(points)


def _layers(
    kinds: Sequence[tuple[str, Sequence[Job], Callable[[Job], float]]], jobs: Sequence[Job]
) -> tuple[tuple[Series, ...], str]:
    """One stacked layer per (name, its jobs, the amount of each), on one time axis; and the
    axis' label."""
    origin = min(j.started for j in jobs) if jobs else datetime.now().astimezone()
    unit, name = _unit(jobs, origin)
    days = _days(jobs, origin, unit)
    layers = tuple(
        Series(
            label,
            tuple((d, sum(_spread(j, amount(j), d, origin, unit) for j in members)) for d in days),
        )
        for label, members, amount in kinds
    )
    return layers, f"{name} since {origin:%Y-%m-%d %H:%M} UTC"


def spend_chart(jobs: Sequence[Job], names: Sequence[str]) -> Chart:
    """Dollars spent so far, one layer a run (`names` in the jobs' order)."""
    priced = [(j, n) for j, n in zip(jobs, names, strict=True) if j.usd is not None]
    layers, axis = _layers(
        [(n, [j], lambda job: job.usd or 0.0) for j, n in priced], [j for j, _ in priced]
    )
    wasted = sum(j.wasted_usd or 0.0 for j, _ in priced)
    return Chart(
        "ledger-spend",
        "Dollars spent, stacked by run",
        "USD",
        layers,
        stacked=True,
        y_format="usd",
        x_label=axis,
        note=f"${wasted:,.4g} of it paid for work preemptions threw away" if wasted else "",
        size="half",
    )


def savings_chart(jobs: Sequence[Job]) -> Chart:
    """What the runs saved so far: spot against on-demand, stops before the budget, levers."""
    priced = [j for j in jobs if j.usd is not None]
    kinds: list[tuple[str, Callable[[Job], float]]] = [
        (
            "spot against on-demand",
            lambda j: max(0.0, (j.on_demand_usd or j.usd or 0.0) - (j.usd or 0.0)),
        ),
        ("stops before the budget", lambda j: (j.saved.usd or 0.0) if j.saved else 0.0),
        ("levers a tune measured", lambda j: sum(j.levers.values())),
    ]
    layers, axis = _layers([(name, priced, amount) for name, amount in kinds], priced)
    return Chart(
        "ledger-saved",
        "Dollars saved, stacked by lever",
        "USD",
        tuple(s for s in layers if s.points and s.points[-1][1] > 0),
        stacked=True,
        y_format="usd",
        x_label=axis,
        size="half",
    )


HEADER = (
    "run",
    "start",
    "state",
    "steps",
    "GPU-h",
    "USD",
    "thrown away",
    "saved",
    "levers",
    "kept",
)


def ledger_rows(jobs: Sequence[Job]) -> list[Sequence[str]]:
    """The ledger's rows as `thrifty runs` prints them, and the total."""
    from thrifty.ledger.groups import total
    from thrifty.ledger.tables import display_name, fmt_bytes, fmt_usd, state_text

    names = [j.name for j in jobs]
    rows: list[Sequence[str]] = [
        (
            display_name(j, names),
            f"{j.started:%Y-%m-%d}",
            state_text(j),
            f"{j.steps:,}",
            f"{j.gpu_hours:.3g}",
            fmt_usd(j.usd),
            fmt_usd(j.wasted_usd) if j.wasted_usd else "-",
            fmt_usd(j.saved.usd) if j.saved else "-",
            fmt_usd(sum(j.levers.values())) if j.levers else "-",
            fmt_bytes(j.bytes),
        )  # fmt: skip
        for j in jobs
    ]
    t = total("total", jobs)
    rows.append(("total", "", f"{t.runs} run(s)", "", f"{t.gpu_hours:.3g}", fmt_usd(t.usd),
                 fmt_usd(t.wasted_usd), fmt_usd(t.saved_usd), fmt_usd(t.levers_usd),
                 fmt_bytes(t.storage_bytes)))  # fmt: skip
    return rows
