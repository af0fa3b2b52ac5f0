"""The record a run inside another framework keeps under `<output dir>/thrifty/`, read back
when an attempt resumes: what earlier attempts paid that the checkpoint resumed from does not
hold, the figures the records carry, and the per-step means summary.json holds."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from thrifty.measure.resume_loss import LostWork


def lost_work(
    records: list[dict[str, Any]], resumed_step: int, summary: Mapping[str, Any] | None
) -> tuple[LostWork, list[dict[str, Any]]]:
    """What earlier attempts paid that the checkpoint of `resumed_step` does not hold, and the
    records kept (those up to that step). The `resumed` events and summary.json carry the
    totals so far; the training seconds of the steps recorded past the checkpoint are thrown
    away now."""
    kept = [r for r in records if "event" in r or _step(r) <= resumed_step]
    wasted, redone, overhead = 0.0, 0, 0.0
    for record in records:
        if record.get("event") == "resumed":
            wasted = figure(record, "wasted_seconds", wasted)
            redone = int(figure(record, "redone_steps", redone))
            overhead = max(overhead, figure(record, "overhead_seconds", 0.0))
        cost = record.get("cost")
        if isinstance(cost, dict):
            overhead = max(overhead, figure(cost, "overhead_seconds", 0.0))
    cost = (summary or {}).get("cost")
    if isinstance(cost, dict):
        overhead = max(overhead, figure(cost, "overhead_seconds", 0.0))
    at_resume, last = _elapsed(kept), _elapsed(records)
    past = max([_step(r) for r in records if "event" not in r], default=resumed_step)
    thrown = max(0.0, last - at_resume)
    return LostWork(
        wasted + thrown, redone + max(0, past - resumed_step), overhead, at_resume
    ), kept


def _step(record: Mapping[str, Any]) -> int:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


def figure(data: Mapping[str, Any], key: str, default: float) -> float:
    """`data[key]` as a float when it is a finite number >= 0, else `default`."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if math.isfinite(value) and value >= 0 else default


def _elapsed(records: list[dict[str, Any]]) -> float:
    """The training clock of the last record with a cost snapshot (0 without one)."""
    for record in reversed(records):
        cost = record.get("cost")
        if isinstance(cost, dict) and "event" not in record:
            return figure(cost, "elapsed_seconds", 0.0)
    return 0.0


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary.json an earlier attempt wrote in `run_dir` (None: none, or damaged)."""
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def rewrite_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the JSON lines file at `path` with `records`, one a line."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def last_finite(values: list[float]) -> float | None:
    """The last finite value of `values` (None: none)."""
    return next((v for v in reversed(values) if math.isfinite(v)), None)


def step_breakdown(data: float, compute: float, steps: int) -> dict[str, float] | None:
    """Mean seconds per step of each phase, as a thrifty run's summary holds them ("other":
    the framework's forward, backward and optimizer together)."""
    if steps <= 0:
        return None
    return {"data_wait": data / steps, "other": compute / steps}
