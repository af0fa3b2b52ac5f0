"""The run directory: resolved config, per-step metrics (JSON lines) and the summary."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from thrifty.console import json_ready
from thrifty.errors import ThriftyError
from thrifty.redact import redact_value

RUN_FILES = ("metrics.jsonl", "summary.json")  # a directory holding either holds a run
DAMAGED_SUFFIX = ".damaged"
# What a run writes and starting it over removes (config.toml is written again at the start;
# checkpoints are run.opening's).
RUN_OUTPUTS = (*RUN_FILES, "diagnosis.json", "report.html", "metrics.jsonl" + DAMAGED_SUFFIX)


def default_run_dir(name: str) -> Path:
    """runs/<name>: the same on every restart, so a preempted run finds its checkpoints."""
    return Path("runs") / name


def prepare_run_dir(
    path: str | os.PathLike[str], overwrite: bool = False, resuming: bool = False
) -> Path:
    """Create the run directory; refuse one that already holds a run unless `overwrite`
    (which removes what the run wrote: RUN_OUTPUTS) or `resuming` (which keeps it).

    The caller has checked that those files are thrifty's (thrifty.rundir.ownership)."""
    path = Path(path)
    existing = [] if resuming else [f for f in RUN_FILES if (path / f).exists()]
    if existing and not overwrite:
        raise ThriftyError(
            f"run directory {path} already holds a run ({existing[0]}): choose another --out "
            "or set run.overwrite = true"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ThriftyError(f"cannot create run directory {path}: {exc.strerror}") from exc
    if overwrite and not resuming:
        for name in RUN_OUTPUTS:
            (path / name).unlink(missing_ok=True)
    return path


def write_json(path: str | os.PathLike[str], data: Mapping[str, Any]) -> None:
    """Write JSON atomically (temporary file, then rename), secrets redacted."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(json_ready(redact_value(data)), indent=2) + "\n")
    os.replace(tmp, path)


_FIGURES = (int, float, bool, type(None))


def _safe(record: Mapping[str, Any]) -> Mapping[str, Any]:
    """`record` redacted; a step's record (figures only, under the loop's own keys) as it is,
    since a number holds no secret: the redaction of every step would cost more than its
    measurement."""
    for value in record.values():
        if not isinstance(value, _FIGURES) and not (
            isinstance(value, dict) and all(isinstance(v, _FIGURES) for v in value.values())
        ):
            return redact_value(record)
    return record


class RecordSink(Protocol):
    """Where metrics.jsonl's records also go (TensorBoard, MLflow: thrifty.measure.loggers). Fed
    at the metrics flush and at events, never per step; never raises."""

    def write(self, records: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...

    def finish(self, files: Sequence[Path], finished: bool) -> None:
        """After `close`: the run's output `files`; `finished`: it ended for good."""


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl, secrets redacted, and hands each
    write to `sinks` too."""

    def __init__(self, path: str | os.PathLike[str], sinks: Sequence[RecordSink] = ()) -> None:
        self.path = Path(path)
        self.sinks = tuple(sinks)
        self._file = open(self.path, "a", buffering=1 << 16)  # noqa: SIM115 (closed in close())

    def write(self, records: Iterable[Mapping[str, Any]]) -> None:
        records = list(records)
        self._file.writelines(json.dumps(json_ready(_safe(r))) + "\n" for r in records)
        self._file.flush()
        for sink in self.sinks:
            sink.write(records)

    def close(self) -> None:
        self._file.close()
        for sink in self.sinks:
            sink.close()


@dataclass(frozen=True)
class MetricsCut:
    """What a resume found in metrics.jsonl: its whole records (before the cut, for the work
    lost), and how many damaged lines it set aside in `aside`."""

    records: list[dict[str, Any]]
    damaged: int = 0
    aside: Path | None = None


def damaged_path(path: str | os.PathLike[str]) -> Path:
    """Where the damaged lines of metrics.jsonl are set aside: metrics.jsonl.damaged."""
    path = Path(path)
    return path.with_name(path.name + DAMAGED_SUFFIX)


def _record(line: str | bytes) -> dict[str, Any] | None:
    """The record a line holds; None for damage: cut short, bad bytes, not a JSON object, or
    a step that is not a whole number."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if not isinstance(record, dict) or type(record.get("step", 0)) is not int:
        return None
    return record


def step_records(lines: Iterable[str | bytes]) -> Iterable[dict[str, Any]]:
    """The step records among metrics.jsonl's `lines`: JSON objects whose step is a whole
    number. A damaged line (cut short by a kill, or being written now) is passed over."""
    for line in lines:
        record = _record(line)
        if record is not None and "step" in record:
            yield record


def _split(data: bytes) -> tuple[list[tuple[bytes, dict[str, Any]]], list[bytes]]:
    """The whole records (each with its line as written) and the damaged lines of `data`."""
    good, bad = [], []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        record = _record(line)
        if record is None:
            bad.append(line)
        else:
            good.append((line, record))
    return good, bad


def truncate_metrics(path: str | os.PathLike[str], step: int) -> MetricsCut:
    """Drop records after `step` (a resumed run writes those steps again), and set damaged
    lines aside in metrics.jsonl.damaged (appended as they were), so that a line cut short by
    a kill, bad bytes or a line that is not a record never stops a resume. Every whole record
    up to `step` is kept, as it was written."""
    path = Path(path)
    try:
        good, bad = _split(path.read_bytes())
    except FileNotFoundError:
        return MetricsCut([])
    except OSError as exc:
        raise ThriftyError(f"cannot read {path}: {exc.strerror}") from exc
    aside = damaged_path(path) if bad else None
    keep = b"".join(line + b"\n" for line, record in good if record.get("step", 0) <= step)
    tmp = path.with_name(path.name + ".tmp")
    try:
        if aside is not None:
            with open(aside, "ab") as f:
                f.writelines(line + b"\n" for line in bad)
        tmp.write_bytes(keep)
        os.replace(tmp, path)
    except OSError as exc:
        raise ThriftyError(
            f"cannot rewrite {path} to resume: {exc.strerror}; free space on its disk and "
            "run the same command again"
        ) from exc
    return MetricsCut([record for _, record in good], len(bad), aside)


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """metrics.jsonl's records, in order; damaged lines (cut short, bad bytes, not a JSON
    object) are left out."""
    good, _ = _split(Path(path).read_bytes())
    return [record for _, record in good]
