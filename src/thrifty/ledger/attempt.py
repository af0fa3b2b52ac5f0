"""One run directory read for the ledger: one machine's attempts at a job.

A run directory holds config.toml (the price and the checkpoint location), metrics.jsonl (a
record per step; with a [cost] section its `cost.elapsed_seconds` are the training seconds
kept in the run, across restarts, and each `resumed` event carries the seconds preemptions
threw away so far) and, once the run ends, summary.json. Nothing here writes: a damaged file
makes the directory a `Skipped` with one line saying why, never a traceback.

Times: metrics carry no clock, so a run's end is the last write of summary.json or
metrics.jsonl, and its start the earlier of config.toml's write (each attempt writes it when
it starts) and the end less the seconds it trained.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from thrifty.errors import ThriftyError
from thrifty.ledger.figures import WHAT, damaged, fits, shown
from thrifty.ledger.files import NotAFile, check_regular, read_text, regular
from thrifty.records.stop import StopReason
from thrifty.redact import redact_text
from thrifty.rundir.files import read_metrics

LOCK_NAME = ".thrifty.lock"  # thrifty.rundir.holder.LOCK_FILE: held with flock while a run trains
# Tables that say what a run trains (not where it writes or how long): its "config" group.
_WHAT_IT_TRAINS = ("task", "optimizer", "schedule", "batch", "precision", "model")
# The files of a run the ledger opens or looks at: each must be a regular file (or absent).
_RUN_FILES = ("summary.json", "metrics.jsonl", "config.toml", LOCK_NAME)


class Skipped(ThriftyError):
    """A folder that looked like a run but cannot be read: the message is the line to print."""


@dataclass(frozen=True, slots=True)
class Price:
    """What the run paid: USD per hour for the whole job at `pricing` (on-demand or spot), the
    on-demand rate beside it (None when unknown), where the price came from, and the catalog
    it was read from ("given" for a price per GPU-hour)."""

    usd_per_hour: float
    pricing: str
    on_demand_usd_per_hour: float | None
    source: str
    catalog: str
    currency: str = "USD"  # thrifty prices in US dollars only (catalog.toml, cost.*)


@dataclass(frozen=True, slots=True)
class Saved:
    """What a stop before the budget did not spend: `by` (forecast, early_stopping, pruned,
    diverged), the steps left, their seconds at the measured step time, and their dollars."""

    by: str
    steps_not_run: int
    seconds: float
    usd: float | None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run directory. `timeline` pairs each recorded step with the training seconds kept
    at it (across restarts); `first_step` is where this directory's records begin (0, or the
    step a relaunch on a new machine resumed from); `wasted_seconds` and `redone_steps` are
    what preemptions threw away that this directory saw; `overhead_seconds` the wall time its
    attempts spent outside the training clock (set-up, what followed their last step)."""

    path: Path
    name: str
    location: str
    config: dict[str, Any]
    state: str  # finished | stopped | preempted | running
    reason: str | None
    started: datetime
    ended: datetime
    first_step: int
    last_step: int
    seconds: float
    timeline: tuple[tuple[int, float], ...]
    wasted_seconds: float = 0.0
    redone_steps: int = 0
    overhead_seconds: float = 0.0  # every attempt's wall time outside the training clock
    gpus: int = 1
    price: Price | None = None
    saved: Saved | None = None
    sweep: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def remote(self) -> bool:
        return "://" in self.location

    @property
    def config_label(self) -> str:
        """What it trains, for `--by config`: its run name and a digest of the tables that
        say what it trains (two runs of one config share it whatever their budget)."""
        tables = {k: self.config.get(k) for k in _WHAT_IT_TRAINS if k in self.config}
        digest = hashlib.sha256(json.dumps(tables, sort_keys=True, default=str).encode())
        return f"{self.config.get('run', {}).get('name', self.name)} ({digest.hexdigest()[:6]})"

    def seconds_at(self, step: int) -> float | None:
        """The training seconds kept at `step`, where this directory recorded that step."""
        return next((s for at, s in self.timeline if at == step), None)


def read_attempt(path: Path) -> Attempt:
    """The run in `path` (it holds metrics.jsonl or summary.json); `Skipped` when a file of it
    is damaged or unreadable (one line naming the file and the field)."""
    for name in _RUN_FILES:
        try:
            check_regular(path / name)
        except NotAFile as exc:
            raise Skipped(f"{exc}: skipped, never opened; move it away to count the run") from None
    summary = _read_summary(path)
    records = _read_records(path)
    steps = _step_records(path / "metrics.jsonl", records)
    if not steps and summary is None:
        raise Skipped(f"{path}: no step recorded yet: nothing to count")
    config = _read_config(path / "config.toml")
    first_step = _first_step(records)
    timeline = _timeline(steps)
    lost = _lost(records, summary)
    overhead = _overhead(records, summary)
    seconds = _kept_seconds(summary, timeline, overhead)
    last_step = max([s for s, _ in timeline] + [int((summary or {}).get("steps") or 0)])
    price, gpus = _price(summary, config, path)
    state, reason = _state(summary, path)
    ended = _mtime(path / "summary.json") or _mtime(path / "metrics.jsonl") or _now()
    own = seconds + overhead - _seconds_before(timeline, first_step)
    began = ended.timestamp() - max(0.0, own)
    config_written = _mtime(path / "config.toml")
    if config_written is not None:
        began = min(began, config_written.timestamp())
    return Attempt(
        path=path,
        name=str(config.get("run", {}).get("name") or path.resolve().name),
        location=_location(config, path),
        config=config,
        state=state,
        reason=reason,
        started=datetime.fromtimestamp(began, timezone.utc),
        ended=ended,
        first_step=first_step,
        last_step=last_step,
        seconds=seconds,
        timeline=timeline,
        wasted_seconds=lost[0],
        redone_steps=lost[1],
        overhead_seconds=overhead,
        gpus=gpus,
        price=price,
        saved=_saved(summary, price),
    )


# --- the files -------------------------------------------------------------------------------


def _read_summary(path: Path) -> dict[str, Any] | None:
    """summary.json (None before the run ends); a damaged one is `Skipped`, with the fix."""
    file = path / "summary.json"
    if not regular(file):
        return None
    try:
        data = json.loads(read_text(file))
    except OSError as exc:
        raise Skipped(f"{file}: cannot be read ({exc.strerror}): skipped") from None
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("stop_reason"), str):
        raise Skipped(
            f"{file} is damaged (not the JSON object a finished run writes): skipped; "
            "move it away to count the run from its metrics.jsonl"
        )
    steps = data.get("steps")
    if steps is not None and not fits(steps, "count"):
        raise Skipped(f"{file}: its steps are damaged ({shown(steps)}, not a count): skipped")
    cost = data.get("cost")
    if cost is not None and not isinstance(cost, dict):
        raise Skipped(f"{file}: its cost is damaged ({shown(cost)}, not a table): skipped")
    _check(file, "", data, _SUMMARY_FIGURES)
    _check(file, "cost.", cost or {}, _COST_FIGURES)
    guard = data.get("guard")
    saved = guard.get("saved") if isinstance(guard, dict) else None
    _check(file, "guard.saved.", saved if isinstance(saved, dict) else {}, _SAVED_FIGURES)
    return data


# What each figure the ledger reads must be, by kind (`figures.fits`); absent or null is fine.
_SUMMARY_FIGURES = {"wall_seconds": "seconds", "world_size": "gpus"}
_COST_FIGURES = {
    "seconds": "seconds", "wasted_seconds": "seconds", "usd": "dollars", "usd_per_hour": "rate",
    "gpu_hours": "dollars", "on_demand_usd": "dollars", "redone_steps": "count", "gpus": "gpus",
    "overhead_seconds": "seconds",
}  # fmt: skip
_SAVED_FIGURES = {"seconds": "seconds", "usd": "dollars", "steps_not_run": "count"}
_RESUMED_FIGURES = {
    "wasted_seconds": "seconds", "redone_steps": "count", "overhead_seconds": "seconds"
}  # fmt: skip
_STEP_FIGURES = {"step_seconds": "seconds"}


def _check(file: Path, prefix: str, data: Mapping[str, Any], figures: Mapping[str, str]) -> None:
    """`Skipped`, naming the file and the field, at the first of `figures` in `data` that is
    not of its kind (a null is absent)."""
    problem = damaged(data, figures)
    if problem is not None:
        raise Skipped(f"{file}: {prefix}{problem}: skipped")


def _step_records(file: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The step records (a loss, no event), their figures checked, and the `resumed` events'
    too: `Skipped` naming the field at the first that is damaged."""
    steps = []
    for record in records:
        is_step = "loss" in record and "event" not in record
        if not (is_step or record.get("event") == "resumed"):
            continue
        what = "a step record" if is_step else "a resumed event"
        step = record.get("step")
        if not fits(step, "count"):
            raise Skipped(f"{file}: {what}'s step is {shown(step)}, not {WHAT['count']}: skipped")
        cost = record.get("cost")
        clocks = {"elapsed_seconds": "seconds", "overhead_seconds": "seconds"}
        problem = damaged(cost if isinstance(cost, dict) else {}, clocks)
        if problem is not None:
            field, rest = problem.split(" is ", 1)
            raise Skipped(f"{file}: cost.{field} at step {step} is {rest}: skipped")
        figures = _STEP_FIGURES if is_step else _RESUMED_FIGURES
        _check(file, f"step {record['step']}: ", record, figures)
        if is_step:
            steps.append(record)
    return steps


def _read_records(path: Path) -> list[dict[str, Any]]:
    file = path / "metrics.jsonl"
    if not regular(file):
        return []
    try:
        return read_metrics(file)
    except OSError as exc:
        raise Skipped(f"{file}: cannot be read ({exc.strerror}): skipped") from None


def _read_config(path: Path) -> dict[str, Any]:
    """config.toml's tables; {} when it is missing or unreadable (the price then comes from
    summary.json alone)."""
    from thrifty.config import toml_loads

    try:
        tables = toml_loads(read_text(path))
    except (OSError, ValueError, RecursionError):
        return {}
    return {name: table for name, table in tables.items() if isinstance(table, dict)}


def _mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
    except OSError:
        return None


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _location(config: Mapping[str, Any], path: Path) -> str:
    """The checkpoint location, redacted: a URL as written, a local path made absolute (two
    run directories of one job meet on it)."""
    where = config.get("checkpoint", {}).get("location")
    if not isinstance(where, str) or not where:
        return str((path / "checkpoints").resolve())
    if "://" in where:
        return redact_text(where).rstrip("/")
    return str(Path(where).expanduser().resolve())


# --- seconds ---------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _first_step(records: list[dict[str, Any]]) -> int:
    """0, or the step a relaunch resumed from when its directory holds nothing before it (a
    new machine that pulled the checkpoint from the bucket)."""
    for record in records:
        if record.get("event") == "resumed":
            return int(record["step"])
        if "loss" in record:
            return 0
    return 0


def _timeline(steps: list[dict[str, Any]]) -> tuple[tuple[int, float], ...]:
    """(step, training seconds kept) for each step record: the cost meter's elapsed seconds
    where the run had [cost], else the step times added up from where the records begin."""
    points: dict[int, float] = {}
    running: float | None = None
    for record in steps:
        cost = record.get("cost")
        elapsed = _number(cost.get("elapsed_seconds")) if isinstance(cost, dict) else None
        step_seconds = _number(record.get("step_seconds")) or 0.0
        if elapsed is not None:
            running = elapsed
        else:
            running = (running if running is not None else 0.0) + step_seconds
        points[int(record["step"])] = running
    return tuple(sorted(points.items()))


def _seconds_before(timeline: tuple[tuple[int, float], ...], first_step: int) -> float:
    """Training seconds kept when this directory's records begin: 0 from step 0; for a
    relaunch, its first record's seconds less the steps' own time is not known, so the first
    recorded point stands in (the attempt's own seconds are a lower bound)."""
    if first_step == 0 or not timeline:
        return 0.0
    return timeline[0][1]


def _kept_seconds(
    summary: Mapping[str, Any] | None, timeline: tuple[tuple[int, float], ...], overhead: float
) -> float:
    """Training seconds kept in the run at its end: the summary's billed seconds less the
    work thrown away and the wall time outside the training clock, else the last recorded
    point."""
    cost = (summary or {}).get("cost")
    if isinstance(cost, dict) and _number(cost.get("seconds")) is not None:
        wasted = _number(cost.get("wasted_seconds")) or 0.0
        return max(0.0, float(cost["seconds"]) - wasted - overhead)
    if summary is not None and _number(summary.get("wall_seconds")) is not None:
        return float(summary["wall_seconds"])
    return timeline[-1][1] if timeline else 0.0


def _overhead(records: list[dict[str, Any]], summary: Mapping[str, Any] | None) -> float:
    """Every attempt's wall time outside the training clock, billed: the summary's, else the
    largest total a record carries (thrifty.measure.cost); 0 for records written before it
    was recorded."""
    cost = (summary or {}).get("cost")
    if isinstance(cost, dict) and _number(cost.get("overhead_seconds")) is not None:
        return float(cost["overhead_seconds"])
    found = [0.0]
    for record in records:
        snapshot = record.get("cost")
        if isinstance(snapshot, dict) and _number(snapshot.get("overhead_seconds")) is not None:
            found.append(float(snapshot["overhead_seconds"]))
        if record.get("event") == "resumed" and _number(record.get("overhead_seconds")):
            found.append(float(record["overhead_seconds"]))
    return max(found)


def _lost(records: list[dict[str, Any]], summary: Mapping[str, Any] | None) -> tuple[float, int]:
    """Seconds and steps preemptions threw away that this directory saw: the summary's, else
    the totals the last `resumed` event carries."""
    cost = (summary or {}).get("cost")
    if isinstance(cost, dict) and _number(cost.get("wasted_seconds")) is not None:
        return float(cost["wasted_seconds"]), int(cost.get("redone_steps") or 0)
    seconds, steps = 0.0, 0
    for record in records:
        if record.get("event") == "resumed":
            seconds = _number(record.get("wasted_seconds")) or seconds
            steps = int(record.get("redone_steps") or steps)
    return seconds, steps


# --- price, state, saving --------------------------------------------------------------------


def _price(
    summary: Mapping[str, Any] | None, config: Mapping[str, Any], path: Path
) -> tuple[Price | None, int]:
    """The run's price and GPUs billed: the summary's cost, else what config.toml's [cost]
    gives (None without one)."""
    table = config.get("cost", {})
    _check(path / "config.toml", "cost.", table, {"gpus": "gpus"})
    catalog = str(table.get("catalog") or ("built-in" if table.get("instance") else "given"))
    cost = (summary or {}).get("cost")
    world = int((summary or {}).get("world_size") or 1)
    if isinstance(cost, dict) and _number(cost.get("usd_per_hour")):
        hours = (_number(cost.get("seconds")) or 0.0) / 3600
        on_demand = _number(cost.get("on_demand_usd"))
        price = Price(
            usd_per_hour=float(cost["usd_per_hour"]),
            pricing=str(cost.get("pricing", "on-demand")),
            on_demand_usd_per_hour=on_demand / hours if on_demand is not None and hours else None,
            source=str(cost.get("source", "")),
            catalog=catalog,
        )
        return price, int(cost.get("gpus") or world)
    return _configured_price(table, catalog, world, path)


def _configured_price(
    table: Mapping[str, Any], catalog: str, world: int, path: Path
) -> tuple[Price | None, int]:
    if not (table.get("instance") or table.get("usd_per_gpu_hour")):
        return None, int(table.get("gpus") or world)
    from thrifty.config.cost import CostConfig
    from thrifty.measure.cost import CostMeter

    try:
        known = {k: v for k, v in table.items() if k in CostConfig.__dataclass_fields__}
        meter = CostMeter.from_config(CostConfig(**known), world_size=world)
    except (ThriftyError, TypeError) as exc:
        raise Skipped(f"{path}/config.toml: its [cost] cannot be priced ({exc}): skipped") from None
    price = Price(
        meter.usd_per_hour, meter.pricing, meter.on_demand_usd_per_hour, meter.source, catalog
    )
    return price, meter.gpus


def _state(summary: Mapping[str, Any] | None, path: Path) -> tuple[str, str | None]:
    """finished (its budget spent), stopped (and why: the forecast, early stopping, pruning,
    divergence), running (its lock is held now) or preempted (no summary: it resumes)."""
    if summary is not None:
        reason = str(summary["stop_reason"])
        try:
            early = StopReason(reason).early
        except ValueError:
            early = False
        return ("stopped" if early else "finished"), reason
    return ("running" if lock_held(path / LOCK_NAME) else "preempted"), None


def lock_held(path: Path) -> bool:
    """Whether a process holds the run's lock now: a shared flock on it is refused. The file
    is only opened for reading, and only when it is a regular file; nothing is written."""
    import fcntl

    if not regular(path):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)
    else:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _saved(summary: Mapping[str, Any] | None, price: Price | None) -> Saved | None:
    guard = (summary or {}).get("guard")
    saved = guard.get("saved") if isinstance(guard, dict) else None
    if not isinstance(saved, dict) or not isinstance(saved.get("by"), str):
        return None
    seconds = _number(saved.get("seconds")) or 0.0
    usd = _number(saved.get("usd"))
    if usd is None and price is not None:
        usd = seconds * price.usd_per_hour / 3600
    return Saved(saved["by"], int(saved.get("steps_not_run") or 0), seconds, usd)
