"""A run's headline figures and its tables, from summary.json where the run finished and from
its records where it did not (preempted, stopped by its data, or still running)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

from thrifty.plan.units import fmt_usd
from thrifty.reporting.runs import Run
from thrifty.reporting.series import number, step_counts, unit_of

STRAGGLER_KEYS = ("straggler", "ranks")
MAX_STRAGGLER_ROWS = 50


@dataclass(frozen=True, slots=True)
class Figure:
    """One headline tile: `value` as shown, `detail` a smaller line under it."""

    label: str
    value: str
    detail: str = ""


def fmt_seconds(seconds: float | None) -> str:
    """Seconds for people: 9.99 s, 12 min 3 s, 3 h 12 min."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def fmt_figure(value: float) -> str:
    """Three significant figures, never in exponent notation: 1,234; 12.3; 0.00009."""
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 0.01:
        return f"{value:.3g}"
    decimals = 1 - math.floor(math.log10(abs(value)))
    return f"{value:.{decimals}f}".rstrip("0")


def fmt_count(value: float | None) -> str:
    """A count or a rate: whole numbers with thousands separators."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:,.4g}"


def _last(run: Run, key: str) -> Any:
    """The newest record's value of `key`, or None."""
    for record in reversed(run.steps):
        if key in record:
            return record[key]
    return None


def _summary(run: Run, key: str) -> Any:
    return (run.summary or {}).get(key)


def _measured(run: Run, key: str) -> Any:
    measured = (run.diagnosis or {}).get("measured")
    return measured.get(key) if isinstance(measured, dict) else None


def attempts(run: Run) -> int:
    """How many times the run was started: once, plus once per resume."""
    return 1 + sum(1 for e in run.events if e["event"] == "resumed")


def wall_time(run: Run) -> Figure:
    """Seconds of the run: the summary's wall time for a run started once; over several
    attempts (or unfinished), the training seconds the run kept (the newest cost snapshot's,
    else its steps' seconds added up)."""
    wall = number(_summary(run, "wall_seconds"))
    if wall is not None and attempts(run) == 1:
        return Figure("wall time", fmt_seconds(wall))
    kept = number(_summary(run, "training_seconds"))
    if kept is not None and wall is not None:  # the summary's own two figures
        return Figure(
            "wall time",
            fmt_seconds(kept),
            f"training, over {attempts(run)} attempts; the last took {fmt_seconds(wall)}",
        )
    cost = _last(run, "cost")
    elapsed = number(cost.get("elapsed_seconds")) if isinstance(cost, dict) else None
    if elapsed is None:
        elapsed = sum(number(r.get("step_seconds")) or 0.0 for r in run.steps) or None
    tries = attempts(run)
    detail = f"training, over {tries} attempts" if tries > 1 else "training"
    return Figure("wall time", fmt_seconds(elapsed), detail + ("" if run.finished else ", so far"))


def rate(run: Run) -> float | None:
    """Tokens (samples) per second: the summary's, else over the records after the first step
    (the warm-up the summary leaves out too)."""
    unit = unit_of(run)
    given = number(_summary(run, f"{unit}_per_second"))
    if given:
        return given
    counts = step_counts(run)
    counts = counts[1:] or counts
    seconds = sum(s for _, _, s in counts)
    return sum(a for _, a, _ in counts) / seconds if seconds else None


def mfu(run: Run) -> float | None:
    given = number(_summary(run, "mfu"))
    if given is not None:
        return given
    values = [v for r in run.steps if (v := number(r.get("mfu"))) is not None]
    return statistics.mean(values) if values else None


def dollars(run: Run) -> Figure:
    cost = _summary(run, "cost")
    if isinstance(cost, dict):
        detail = str(cost.get("pricing") or "")
        if cost.get("pricing") != "on-demand" and number(cost.get("on_demand_usd")) is not None:
            detail += f"; on-demand {fmt_usd(cost['on_demand_usd'])}"
        return Figure("dollars", fmt_usd(number(cost.get("usd"))), detail)
    snapshot = _last(run, "cost")
    if isinstance(snapshot, dict):
        return Figure("dollars", fmt_usd(number(snapshot.get("usd"))), "so far")
    return Figure("dollars", "-", "no price: set [cost]")


def stop_reason(run: Run) -> Figure:
    reason = _summary(run, "stop_reason")
    if reason:
        return Figure("stop reason", str(reason).replace("_", " "))
    if run.diagnosis is not None:
        return Figure("stop reason", "not finished", "preempted or stopped by its data")
    return Figure("stop reason", "not finished", "still running, or killed")


def precision(run: Run) -> str:
    given = _summary(run, "precision") or _measured(run, "precision")
    return str(given or run.config.get("precision", {}).get("mode") or "-")


def batch(run: Run) -> Figure:
    """Micro-batch × accumulation steps, and the effective batch they make."""
    configured = run.config.get("batch", {})
    micro = _whole(_summary(run, "micro_batch")) or _whole(_measured(run, "micro_batch"))
    accumulation = _whole(_summary(run, "accumulation_steps")) or _whole(
        _measured(run, "accumulation_steps")
    )
    effective = _whole(_summary(run, "effective_batch"))
    given = configured.get("micro")
    if micro is None and given is None:
        return Figure("micro-batch × accumulation", "-")
    shown = micro if micro is not None else given  # "auto" as configured, when not measured
    micro = micro or _whole(given)
    wanted = _whole(configured.get("effective"))
    if accumulation is None and wanted is not None and micro is not None:
        accumulation = max(1, wanted // micro)
    accumulation = accumulation or 1
    if effective is None and micro is not None:
        effective = micro * accumulation
    detail = f"effective batch {effective}" if effective else ""
    return Figure("micro-batch × accumulation", f"{shown} × {accumulation}", detail)


def _whole(value: Any) -> int | None:
    """`value` when it is a positive whole number (a batch size), else None."""
    return value if type(value) is int and value > 0 else None


def headline(run: Run) -> list[Figure]:
    """Steps, tokens, wall time, throughput, MFU, dollars, stop reason, precision, batch."""
    unit = unit_of(run)
    steps = _summary(run, "steps") or run.steps[-1]["step"]
    count = _summary(run, unit) or _last(run, unit)
    share = mfu(run)
    figures = [
        Figure("steps", fmt_count(number(steps))),
        Figure(unit, fmt_count(number(count))),
        wall_time(run),
        Figure(f"{unit}/s", fmt_count(rate(run)), "after the first step"),
        Figure("MFU", "-" if share is None else f"{share * 100:.3g}%"),
        dollars(run),
        stop_reason(run),
        Figure("precision", precision(run)),
        batch(run),
    ]
    world = number(_summary(run, "world_size"))
    if world and world > 1:
        figures.append(Figure("processes", f"{world:.0f}", str(_summary(run, "strategy") or "")))
    return figures


def comparison(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """The runs side by side: a header (figure, then one column per run) and one row per
    figure (the headline's, then the final losses and dollars per unit)."""
    heads = [headline(run) for run in runs]
    labels = [f.label for f in heads[0]]
    rows = []
    for i, label in enumerate(labels):
        rows.append(
            [label, *(h[i].value if i < len(h) and h[i].label == label else "-" for h in heads)]
        )
    rows.append(["final train loss", *(_loss(_last(r, "loss")) for r in runs)])
    rows.append(
        ["final validation loss", *(_loss(r.evals[-1][1] if r.evals else None) for r in runs)]
    )
    rows.append(["$ per million tokens", *(_per_million(r) for r in runs)])
    return ["", *(run.name for run in runs)], rows


def _loss(value: Any) -> str:
    value = number(value)
    return "-" if value is None else f"{value:.4g}"


def _per_million(run: Run) -> str:
    cost = _summary(run, "cost") or _last(run, "cost")
    if not isinstance(cost, dict):
        return "-"
    value = number(cost.get("usd_per_million_tokens"))
    return "-" if value is None else fmt_usd(value)


def stragglers(run: Run) -> tuple[list[str], list[list[str]]] | None:
    """The records that carry per-rank figures ("straggler" or "ranks"), flattened into a
    table: step, then one column per key. None when no record has them."""
    records = [r for r in run.steps + run.events if any(k in r for k in STRAGGLER_KEYS)]
    if not records:
        return None
    rows: list[dict[str, str]] = []
    for record in records[-MAX_STRAGGLER_ROWS:]:
        row = {"step": str(record["step"])}
        for key in STRAGGLER_KEYS:
            row.update(_flatten(key, record.get(key)))
        rows.append(row)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return columns, [[row.get(c, "") for c in columns] for row in rows]


def _flatten(prefix: str, value: Any) -> dict[str, str]:
    """A value as cells: a dict one column per key, anything else one cell."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return {f"{prefix}.{k}": _cell(v) for k, v in value.items()}
    return {prefix: _cell(value)}


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and all(number(v) is not None for v in value):
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)
