"""The points a scaling law is fitted to: (parameters N, training tokens D, loss L) per run.

They come from a CSV file with a header naming `params`, `tokens` and `loss` (other columns are
ignored; counts may be written 1e7 or 10M), or from thrifty run directories: a finished run
holds summary.json (`parameters`, `tokens`, `final_val_loss`), a sweep's runs lie under
`trials/NNNN/`, and a folder of either is searched a few levels deep.

Runs a sweep's pruner, early stopping or the forecast stopped (and diverged runs) are left out
with a note: their loss was read before the end of their learning-rate schedule, which would
bias the fit. Every other problem is bad input, raised as one line naming the file or run.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.errors import ConfigError
from thrifty.plan.units import parse_count
from thrifty.records.stop import StopReason

CSV_COLUMNS = ("params", "tokens", "loss")
SUMMARY = "summary.json"
SEARCH_DEPTH = 3  # a folder of sweeps: FOLDER/SWEEP/trials/NNNN/summary.json
CONSTANTS = ("E", "A", "B", "alpha", "beta")


@dataclass(frozen=True, slots=True)
class Point:
    """One run: `params` parameters trained on `tokens` tokens reached validation loss `loss`
    (nats per token); `source` says where it was read (a CSV line or a run directory)."""

    params: float
    tokens: float
    loss: float
    source: str

    @property
    def flops(self) -> float:
        """Training FLOPs, C = 6*N*D."""
        return 6.0 * self.params * self.tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Points:
    """The points read from `sources` (the paths as given), with notes on what was left out."""

    points: list[Point]
    sources: list[str]
    notes: list[str] = field(default_factory=list)


def read_points(paths: Sequence[str]) -> Points:
    """Read points from each path (a CSV file, a run directory, a sweep directory or a folder of
    runs) and check that a fit of the five constants E, A, B, alpha, beta is possible."""
    if not paths:
        raise ConfigError("give at least one CSV file or folder of runs to fit")
    points: list[Point] = []
    notes: list[str] = []
    for text in paths:
        path = Path(text)
        if not path.exists():
            raise ConfigError(f"no such file or folder: {text}")
        if path.is_dir():
            points += _read_runs(path, notes)
        elif path.name == SUMMARY:
            points += _read_runs(path.parent, notes)
        else:
            points += read_csv(path)
    check_points(points, what=", ".join(paths))
    return Points(points=points, sources=list(paths), notes=notes)


def read_csv(path: Path) -> list[Point]:
    """The points of a CSV file whose header names `params`, `tokens` and `loss`."""
    try:
        # utf-8-sig: a spreadsheet's "CSV UTF-8" opens with a byte-order mark
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{path}: cannot read it as a CSV file: {why}") from None
    lines = [(number, row) for number, row in enumerate(rows, 1) if _has_data(row)]
    if not lines:
        raise ConfigError(
            f"{path}: empty; a CSV of points starts with the header params,tokens,loss"
        )
    header_line, header = lines[0]
    names = [cell.strip().lower() for cell in header]
    missing = [c for c in CSV_COLUMNS if c not in names]
    if missing:
        raise ConfigError(
            f"{path}: the header lacks the column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)}; found {','.join(cell.strip() for cell in header)!r} on line "
            f"{header_line}; the columns needed are params,tokens,loss"
        )
    where = {c: names.index(c) for c in CSV_COLUMNS}
    points = []
    for number, row in lines[1:]:
        source = f"{path} line {number}"
        cells = {c: row[i].strip() if i < len(row) else "" for c, i in where.items()}
        points.append(
            Point(
                params=_number(cells["params"], "params", source),
                tokens=_number(cells["tokens"], "tokens", source),
                loss=_number(cells["loss"], "loss", source),
                source=source,
            )
        )
    return points


def _has_data(row: list[str]) -> bool:
    """Not a blank line nor a comment (#...)."""
    first = next((cell.strip() for cell in row if cell.strip()), "")
    return bool(first) and not first.startswith("#")


def _number(text: Any, name: str, source: str) -> float:
    """A finite number > 0 read from a cell or a summary's value, or one line naming where."""
    if isinstance(text, bool) or text is None or text == "":
        raise ConfigError(f"{source}: {name} is missing; give a number > 0")
    try:
        value = float(text) if not isinstance(text, str) else _text_number(text)
    except (ConfigError, ValueError, TypeError):
        raise ConfigError(f"{source}: {name} {text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{source}: {name} must be a finite number > 0, got {text!r}")
    return value


def _text_number(text: str) -> float:
    try:
        return float(text)  # 1e7, 2.5, nan, inf: the last two are refused by the caller
    except ValueError:
        return parse_count(text, "")  # 10M, 1.4T


def _read_runs(folder: Path, notes: list[str]) -> list[Point]:
    """The finished runs in `folder`: the run itself, a sweep's trials, or runs below it."""
    summaries = _find_summaries(folder)
    if not summaries:
        raise ConfigError(
            f"{folder}: no runs found; a finished run's directory holds {SUMMARY} (looked "
            f"{SEARCH_DEPTH} levels deep and under trials/); or give a CSV with params,tokens,loss"
        )
    points = []
    stopped_early: list[str] = []
    for summary in summaries:
        point = _read_summary(summary, stopped_early)
        if point is not None:
            points.append(point)
    if stopped_early:
        shown = ", ".join(stopped_early[:3]) + (", ..." if len(stopped_early) > 3 else "")
        notes.append(
            f"left out {len(stopped_early)} run(s) under {folder} stopped before their schedule "
            f"ended (pruned, early stopping, forecast or diverged): {shown}"
        )
    if not points:
        raise ConfigError(
            f"{folder}: every run found was stopped early ({len(stopped_early)}); a fit needs "
            "runs that trained to the end of their schedule"
        )
    return points


def _find_summaries(folder: Path) -> list[Path]:
    if (folder / SUMMARY).is_file():
        return [folder / SUMMARY]
    found: dict[Path, Path] = {}
    patterns = ["trials/*/" + SUMMARY]
    patterns += ["/".join(["*"] * depth + [SUMMARY]) for depth in range(1, SEARCH_DEPTH + 1)]
    for pattern in patterns:
        for path in sorted(folder.glob(pattern)):
            if path.is_file():
                found.setdefault(path.resolve(), path)
    return sorted(found.values())


def _read_summary(path: Path, stopped_early: list[str]) -> Point | None:
    run = str(path.parent)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not valid JSON"
        raise ConfigError(f"run {run}: cannot read {SUMMARY}: {why}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"run {run}: {SUMMARY} is not a JSON object")
    if _stopped_early(data.get("stop_reason")):
        stopped_early.append(run)
        return None
    if data.get("final_val_loss") is None:
        raise ConfigError(
            f"run {run} has no validation loss (final_val_loss is null): give it validation data "
            "and evaluate at the end, or leave it out"
        )
    return Point(
        params=_number(data.get("parameters"), "parameters", f"run {run}"),
        tokens=_number(data.get("tokens"), "tokens", f"run {run}"),
        loss=_number(data.get("final_val_loss"), "final_val_loss", f"run {run}"),
        source=run,
    )


def _stopped_early(reason: Any) -> bool:
    try:
        return isinstance(reason, str) and StopReason(reason).early
    except ValueError:  # a reason this version does not know: read the run
        return False


def check_points(points: Iterable[Point], *, what: str = "the points") -> None:
    """Refuse points that cannot determine E, A, B, alpha and beta, in one line that says why."""
    points = list(points)
    if len(points) < len(CONSTANTS):
        raise ConfigError(
            f"{what}: {len(points)} point(s); a fit of the {len(CONSTANTS)} constants "
            f"{', '.join(CONSTANTS)} needs at least {len(CONSTANTS)}, better 20 or more: "
            "add runs of other sizes and lengths"
        )
    for p in points:
        for name in ("params", "tokens", "loss"):
            value = getattr(p, name)
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{p.source}: {name} must be a finite number > 0, got {value!r}")
    if len({p.params for p in points}) == 1:
        raise ConfigError(
            f"every point has the same parameter count ({points[0].params:.4g}): alpha cannot "
            "be fitted; add runs of other sizes"
        )
    if len({p.tokens for p in points}) == 1:
        raise ConfigError(
            f"every point has the same token count ({points[0].tokens:.4g}): beta cannot be "
            "fitted; add runs of other lengths"
        )
