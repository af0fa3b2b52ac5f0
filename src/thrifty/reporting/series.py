"""A run's charts, computed from its records: loss, throughput and MFU, the step-time
breakdown, system sampling and dollars, each over the optimizer step.

`run_charts(run)` returns them keyed by section, so that what a chart holds can be checked
against the records it came from.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from thrifty.reporting.charts import PALETTE, Chart, Mark, Series
from thrifty.reporting.runs import Run

# The step phases in the order the Trainer runs them (thrifty.measure.evidence.PHASES).
PHASES = ("data_wait", "host_to_device", "forward", "backward", "optimizer", "checkpoint", "other")
PHASE_COLORS = ("#f59f00", "#ced4da", "#4c6ef5", "#7048e8", "#12b886", "#e64980", "#adb5bd")
# System metrics the sampler records (thrifty.measure.system), with the unit each is in.
STACK_POINTS = 300  # the breakdown's points at most: a run of more steps is drawn in buckets
SYSTEM_METRICS = {
    "cpu_percent": ("CPU utilization", "%"),
    "load_per_cpu": ("load average per CPU", "threads"),
    "steal_percent": ("CPU time stolen", "%"),
    "ram_percent": ("RAM used", "%"),
    "process_rss_gib": ("process resident memory", "GiB"),
    "gpu_util_percent": ("GPU utilization", "%"),
    "gpu_memory_used_gib": ("GPU memory used", "GiB"),
    "gpu_power_watts": ("GPU power", "W"),
}


def number(value: Any) -> float | None:
    """`value` as a finite float, or None (absent, null, NaN, a bool, or not a number)."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    return float(value) if kind is int else None


def unit_of(run: Run) -> str:
    """The unit the run's throughput is in: tokens where it counted them, else samples."""
    return "tokens" if any((number(r.get("tokens")) or 0) > 0 for r in run.steps) else "samples"


def run_charts(run: Run) -> dict[str, Chart]:
    """The charts of one run, keyed by section: loss, throughput, mfu, breakdown, cost, and
    one `system-<metric>` per metric sampled. Charts with no data are left out."""
    charts = [
        loss_chart([run]),
        throughput_chart([run]),
        mfu_chart(run),
        breakdown_chart(run),
        cost_chart([run]),
        *system_charts(run),
    ]
    return {c.id: c for c in charts if c.has_data}


# --------------------------------------------------------------------------------------------
# Loss and what happened along the way


def loss_chart(runs: list[Run]) -> Chart:
    """Training and validation loss; with one run, its resumes, rollbacks and saves marked."""
    series: list[Series] = []
    for i, run in enumerate(runs):
        prefix = f"{run.name}: " if len(runs) > 1 else ""
        color = _run_color(i) if len(runs) > 1 else ""
        train = _points(((r["step"], r.get("loss")) for r in run.steps), said=True)
        series.append(Series(f"{prefix}train loss", train, color=color))
        if run.evals:
            val = _points(run.evals, said=True)
            series.append(
                Series(f"{prefix}validation loss", val, color=color or "#e8590c", dashed=True)
            )
    marks = run_marks(runs[0]) if len(runs) == 1 else ()
    return Chart(
        "loss", "Training and validation loss", "loss", tuple(series), marks=marks, from_zero=False
    )


def run_marks(run: Run) -> tuple[Mark, ...]:
    """Resumes, rollbacks and the other events, then the checkpoint saves."""
    marks = [_event_mark(e) for e in run.events]
    marks += [
        Mark(float(s), "checkpoint", f"checkpoint saved at step {s}") for s in run.checkpoints
    ]
    return tuple(marks)


def _event_mark(event: Mapping[str, Any]) -> Mark:
    step, kind = int(event["step"]), str(event["event"])
    if kind == "resumed":
        text = f"resumed at step {step}"
        if event.get("redone_steps"):
            text += f" ({event['redone_steps']} steps redone in all)"
        return Mark(float(step), "resumed", text)
    if kind == "rollback":
        text = (
            f"loss spike from step {event.get('spike_start')}: rolled back from step "
            f"{event.get('from_step', step)} to the weights of step {event.get('to_step')}"
        )
        return Mark(float(step), "rollback", text)
    if kind == "config_changed" and isinstance(event.get("changes"), list):
        details = ", ".join(
            f"{c.get('setting')} {c.get('old')} → {c.get('new')}"
            for c in event["changes"]
            if isinstance(c, dict)
        )
    else:
        details = ", ".join(f"{k} {v}" for k, v in event.items() if k not in ("step", "event"))
    text = f"{kind.replace('_', ' ')} at step {step}" + (f": {details}" if details else "")
    return Mark(float(step), "event", text if len(text) <= 300 else text[:299] + "…")


# --------------------------------------------------------------------------------------------
# Throughput, MFU, the breakdown


def step_counts(run: Run) -> list[tuple[float, float, float]]:
    """(step, tokens or samples it added, its seconds) of each timed step that added some."""
    unit = unit_of(run)
    counts, before = [], 0.0
    for record in run.steps:
        count, seconds = number(record.get(unit)), number(record.get("step_seconds"))
        if count is None:
            continue
        added, before = count - before, count
        if seconds and seconds > 0 and added > 0:
            counts.append((float(record["step"]), added, seconds))
    return counts


def rates(run: Run) -> list[tuple[float, float]]:
    """(step, tokens or samples per second) of each step: the count it added over its seconds."""
    return [(step, added / seconds) for step, added, seconds in step_counts(run)]


def throughput_chart(runs: list[Run]) -> Chart:
    unit = unit_of(runs[0])
    series = tuple(
        Series(run.name if len(runs) > 1 else f"{unit}/s", tuple(rates(run))) for run in runs
    )
    marks = tuple(m for m in run_marks(runs[0]) if m.kind != "checkpoint") if len(runs) == 1 else ()
    return Chart(
        "throughput",
        f"Throughput ({unit} per second)",
        f"{unit}/s",
        series,
        marks=marks,
        size="half",
    )


def mfu_chart(run: Run) -> Chart:
    """MFU of each logging interval (recorded on its last step)."""
    points = _points((r["step"], r.get("mfu")) for r in run.steps)
    return Chart(
        "mfu",
        "Model FLOPs utilization",
        "MFU",
        (Series("MFU", points),),
        y_format="percent",
        size="half",
    )


def breakdown_chart(run: Run) -> Chart:
    """Seconds per step in each phase, stacked: they add up to the step's time. A run of more
    than STACK_POINTS steps is drawn in buckets of k steps, each at its last step with the
    mean of the k."""
    records = [r for r in run.steps if isinstance(r.get("breakdown"), dict)]
    size = math.ceil(len(records) / STACK_POINTS) or 1
    buckets = [records[i : i + size] for i in range(0, len(records), size)]
    series = tuple(
        Series(
            phase.replace("_", " "),
            tuple(
                (
                    float(b[-1]["step"]),
                    sum(number(r["breakdown"].get(phase)) or 0.0 for r in b) / len(b),
                )
                for b in buckets
            ),
            color=color,
        )
        for phase, color in zip(PHASES, PHASE_COLORS, strict=True)
    )
    note = "other: the step's time no phase accounts for (launch overhead, waiting on the host)"
    if size > 1:
        note = f"each point: the mean of {size} steps; " + note
    return Chart(
        "breakdown",
        "Where each step's time went",
        "seconds per step",
        series,
        stacked=True,
        note=note,
    )


def mean_phases(run: Run) -> dict[str, float]:
    """Mean seconds per step of each phase: the summary's, else over the records after the
    first step (the warm-up the summary leaves out too)."""
    given = (run.summary or {}).get("breakdown")
    if isinstance(given, dict) and given:
        return {p: number(given.get(p)) or 0.0 for p in PHASES}
    records = [r["breakdown"] for r in run.steps[1:] if isinstance(r.get("breakdown"), dict)]
    totals = dict.fromkeys(PHASES, 0.0)
    for record in records:
        for phase in PHASES:
            totals[phase] += number(record.get(phase)) or 0.0
    return {p: t / len(records) for p, t in totals.items()} if records else {}


# --------------------------------------------------------------------------------------------
# System sampling


@dataclass(frozen=True, slots=True)
class SystemFigure:
    """One sampled metric over the run: `mean` of the intervals' means, `swing` the mean of
    their standard deviations, in `unit`."""

    key: str
    name: str
    unit: str
    mean: float
    swing: float
    low: float
    high: float


def system_figures(run: Run) -> list[SystemFigure]:
    """Each sampled metric over the whole run, the known ones first."""
    figures = []
    for key in _system_keys(run):
        means = [m for s in _systems(run) if (m := number(s.get(f"{key}_mean"))) is not None]
        swings = [d for s in _systems(run) if (d := number(s.get(f"{key}_std"))) is not None]
        name, unit = SYSTEM_METRICS.get(key, (key.replace("_", " "), ""))
        figures.append(
            SystemFigure(
                key,
                name,
                unit,
                statistics.mean(means),
                statistics.mean(swings) if swings else 0.0,
                min(means),
                max(means),
            )
        )
    return figures


def system_charts(run: Run) -> list[Chart]:
    """One small chart per metric: each interval's mean, its swing (± one standard deviation,
    never below zero, nor above 100% for a percentage) shaded around it."""
    charts = []
    for key in _system_keys(run):
        name, unit = SYSTEM_METRICS.get(key, (key.replace("_", " "), ""))
        rows = []
        for record in run.steps:
            system = record.get("system")
            if not isinstance(system, dict):
                continue
            mean = number(system.get(f"{key}_mean"))
            if mean is not None:
                swing = number(system.get(f"{key}_std")) or 0.0
                rows.append((float(record["step"]), mean, swing))
        points = tuple((x, m) for x, m, _ in rows)
        top = 100.0 if unit == "%" else math.inf
        band = tuple((x, max(0.0, m - d), min(top, m + d)) for x, m, d in rows)
        series = Series(name, points, band=band)
        charts.append(Chart(f"system-{key}", name, unit, (series,), size="small"))
    return charts


def _systems(run: Run) -> Iterable[dict[str, Any]]:
    return (r["system"] for r in run.steps if isinstance(r.get("system"), dict))


def _system_keys(run: Run) -> list[str]:
    """The metrics sampled, the known ones first in their usual order."""
    keys = {k[: -len("_mean")] for s in _systems(run) for k in s if k.endswith("_mean")}
    known = [k for k in SYSTEM_METRICS if k in keys]
    return known + sorted(keys - set(known))


# --------------------------------------------------------------------------------------------
# Ranks


def rank_charts(run: Run) -> list[Chart]:
    """One chart per list of per-rank figures the records carry under "ranks" (each rank's
    work seconds per step, say), a line per rank."""
    found: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for record in run.steps:
        ranks = record.get("ranks")
        for key, values in ranks.items() if isinstance(ranks, dict) else ():
            if not isinstance(values, list):
                continue
            lines = found.setdefault(key, {})
            for rank, value in enumerate(values):
                if (y := number(value)) is not None:
                    lines.setdefault(rank, []).append((float(record["step"]), y))
    return [
        Chart(
            f"ranks-{key}",
            f"{key.replace('_', ' ')} of each rank",
            key.replace("_", " "),
            tuple(Series(f"rank {rank}", tuple(points)) for rank, points in sorted(lines.items())),
            size="half",
        )
        for key, lines in found.items()
    ]


# --------------------------------------------------------------------------------------------
# Dollars


def on_demand_ratio(run: Run) -> float | None:
    """On-demand price over the price paid, when the run paid less than on-demand."""
    cost = (run.summary or {}).get("cost")
    if isinstance(cost, dict):
        usd, on_demand = number(cost.get("usd")), number(cost.get("on_demand_usd"))
        if usd and on_demand and cost.get("pricing") != "on-demand":
            return on_demand / usd
        return None
    given = run.config.get("cost", {})
    paid, on_demand = (
        number(given.get("usd_per_gpu_hour")),
        number(given.get("on_demand_usd_per_gpu_hour")),
    )
    return on_demand / paid if paid and on_demand and given.get("pricing") == "spot" else None


def cost_chart(runs: list[Run]) -> Chart:
    """Dollars spent; with one run, the projected total at the end of its budget and what
    on-demand would have cost."""
    series: list[Series] = []
    for i, run in enumerate(runs):
        costs = [
            (float(r["step"]), r["cost"]) for r in run.steps if isinstance(r.get("cost"), dict)
        ]
        spent = _points((x, c.get("usd")) for x, c in costs)
        if len(runs) > 1:
            series.append(Series(run.name, spent, color=_run_color(i)))
            continue
        series.append(Series("spent", spent))
        projected = _points(
            (x, c["projected"].get("total_usd"))
            for x, c in costs
            if isinstance(c.get("projected"), dict)
        )
        if projected:
            series.append(
                Series("projected total at the end of the budget", projected, dashed=True)
            )
        ratio = on_demand_ratio(run)
        if ratio is not None:
            series.append(
                Series(
                    "on-demand would have cost",
                    tuple((x, y * ratio) for x, y in spent),
                    color="#868e96",
                )
            )
    return Chart("cost", "Dollars spent, and the projection", "USD", tuple(series), y_format="usd")


# --------------------------------------------------------------------------------------------


def _points(
    pairs: Iterable[tuple[Any, Any]], *, said: bool = False
) -> tuple[tuple[float, float], ...]:
    """The pairs whose values are both finite numbers, as floats. `said`: a y that is NaN or
    infinite is kept too, for the chart to leave out and say (a loss that diverged)."""
    kept = []
    for x, y in pairs:
        fx, fy = number(x), number(y)
        if said and fy is None and type(y) is float:
            fy = y
        if fx is not None and fy is not None:
            kept.append((fx, fy))
    return tuple(kept)


def _run_color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]
