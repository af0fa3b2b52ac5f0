"""The points a scaling law is fitted to: (parameters N, training tokens D, loss L) per run.

They come from a CSV file with a header naming `params`, `tokens` and `loss` (other columns are
ignored; counts may be written 1e7 or 10M), or from thrifty run directories: a finished run
holds summary.json (`parameters`, `tokens`, `final_val_loss`), a sweep's runs lie under
`trials/NNNN/`, and a folder of either is searched a few levels deep.

Runs a sweep's pruner, early stopping or the forecast stopped (and diverged runs) are left out
with a note: their loss was read before the end of their learning-rate schedule, which would
bias the fit. Every other problem is bad input, raised as one line naming the file or run.

Every file read is bounded before it is opened: a regular file (a FIFO, a device or a socket
is refused, never opened, so nothing can block the read), of at most MAX_CSV_BYTES (a CSV) or
MAX_JSON_BYTES (a summary.json), a CSV cell of at most MAX_CELL characters, JSON nested at
most MAX_JSON_DEPTH deep, at most MAX_POINTS points, and each number within RANGES.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import stat
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
MAX_CSV_BYTES = 64 * 2**20
MAX_JSON_BYTES = 16 * 2**20  # a run's summary.json is a few kB
MAX_CELL = 128 * 2**10  # characters; csv's own field limit, now named in the refusal
MAX_JSON_DEPTH = 64  # thrifty's own files nest 4 deep
MAX_POINTS = 1_000_000  # the fit costs about rows x resamples (docs/scale.md)
# What each number may be: a model of 1 to 10^15 parameters, trained on 1 to 10^17 tokens, to a
# loss in nats per token above 0 and at most 1000 (a uniform guess over e^1000 tokens).
RANGES = {"params": (1.0, 1e15), "tokens": (1.0, 1e17), "loss": (0.0, 1e3)}
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


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
        if not path.is_dir():
            regular_size(path, "a CSV file of params,tokens,loss or a folder of runs")
        if path.is_dir():
            points += _read_runs(path, notes)
        elif path.name == SUMMARY:
            points += _read_runs(path.parent, notes)
        else:
            points += read_csv(path)
    if len(points) > MAX_POINTS:
        raise ConfigError(
            f"{', '.join(paths)}: {len(points):,} points; the most a fit takes is {MAX_POINTS:,} "
            "(its cost grows with rows x resamples): fit a sample of the runs"
        )
    check_points(points, what=", ".join(paths))
    return Points(points=points, sources=list(paths), notes=notes)


def read_csv(path: Path) -> list[Point]:
    """The points of a CSV file whose header names `params`, `tokens` and `loss`."""
    text = read_text(path, MAX_CSV_BYTES, "a CSV file of params,tokens,loss")
    reader = csv.reader(text.splitlines(), strict=False)
    rows: list[list[str]] = []
    try:
        for row in reader:
            rows.append(row)
    except csv.Error:  # a cell over csv's field limit (MAX_CELL), or a NUL
        raise ConfigError(
            f"{path} line {reader.line_num}: a cell longer than {MAX_CELL // 1024} KiB or "
            "holding a NUL byte; a CSV of points holds short numbers: params,tokens,loss"
        ) from None
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


def _number(text: Any, name: str, source: str, field: str | None = None) -> float:
    """A number within RANGES[field] read from a cell or a summary's value, or one line naming
    where, the value and the range allowed."""
    field = field or name
    if isinstance(text, bool) or text is None or text == "":
        raise ConfigError(f"{source}: {name} is missing; give a number > 0")
    try:
        value = float(text) if not isinstance(text, str) else _text_number(text)
    except OverflowError:  # a JSON integer of hundreds of digits
        value = math.inf
    except (ConfigError, ValueError, TypeError):
        raise ConfigError(f"{source}: {name} {shown(text)} is not a number") from None
    low, high = RANGES[field]
    if not (math.isfinite(value) and low <= value <= high) or value <= 0:
        allowed = f"{low:g} to {high:g}" if low > 0 else f"above 0, at most {high:g}"
        raise ConfigError(
            f"{source}: {name} must be a finite number > 0, got {shown(text)}; the range "
            f"allowed: {allowed}"
        )
    return value


def shown(value: Any) -> str:
    """A value as a message quotes it: at most 40 characters of it."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


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
        named = ", ".join(stopped_early[:3]) + (", ..." if len(stopped_early) > 3 else "")
        notes.append(
            f"left out {len(stopped_early)} run(s) under {folder} stopped before their schedule "
            f"ended (pruned, early stopping, forecast or diverged): {named}"
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
    data = read_json(path, MAX_JSON_BYTES, f"a run's {SUMMARY}")
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
        params=_number(data.get("parameters"), "parameters", f"run {run}", "params"),
        tokens=_number(data.get("tokens"), "tokens", f"run {run}"),
        loss=_number(data.get("final_val_loss"), "final_val_loss", f"run {run}", "loss"),
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


# --- bounded reading ------------------------------------------------------------------------------


def regular_size(path: Path, what: str) -> int:
    """The size in bytes of `path`, a regular file (followed through links): anything else (a
    FIFO, a device, a socket, a folder) is refused in one line, without opening it."""
    try:
        mode = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    if not stat.S_ISREG(mode.st_mode):
        kind = _KINDS.get(stat.S_IFMT(mode.st_mode), "not a regular file")
        raise ConfigError(f"{path} is {kind}, not a file: give {what}")
    return mode.st_size


_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


def read_text(path: Path, limit: int, what: str) -> str:
    """The UTF-8 text of `path`, a regular file of at most `limit` bytes (a byte-order mark is
    dropped: a spreadsheet's "CSV UTF-8" opens with one); one line otherwise."""
    size = regular_size(path, what)
    if size > limit:
        raise ConfigError(
            f"{path} is {size / 2**20:.1f} MiB; the most read as {what} is {limit / 2**20:g} MiB"
        )
    try:
        # O_NONBLOCK: were it swapped for a FIFO since the check, the open does not wait
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{path} is not a regular file: give {what}")
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror}") from None
    if len(data) > limit:
        raise ConfigError(f"{path} grew past {limit / 2**20:g} MiB while read: give {what}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; give {what}") from None


def read_json(path: Path, limit: int, what: str) -> Any:
    """The JSON value of `path` (read as read_text reads), nested at most MAX_JSON_DEPTH deep:
    deeper is refused in one line before it is parsed (Python's parser would recurse)."""
    text = read_text(path, limit, what)
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise ConfigError(
            f"{path}: JSON nested {depth:,} deep; the most read is {MAX_JSON_DEPTH}: give {what}"
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise ConfigError(f"{path} is not JSON: give {what}") from None


def json_depth(text: str) -> int:
    """How deep the brackets of a JSON text nest, strings left out (a bracket in a string is
    text); a bound, not a parse: malformed JSON is the parser's to refuse."""
    import numpy as np

    brackets = "".join(_BRACKETS.findall(_STRINGS.sub("", text))).encode("ascii")
    if not brackets:
        return 0
    steps = np.frombuffer(brackets, dtype=np.uint8)
    opened = (steps == ord("[")) | (steps == ord("{"))
    return int(np.cumsum(np.where(opened, 1, -1)).max())


_BRACKETS = re.compile(r"[\[\]{}]")
