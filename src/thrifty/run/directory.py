"""The run directory: resolved config, per-step metrics (JSON lines) and the summary."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from thrifty.errors import ThriftyError
from thrifty.redact import redact_value

RUN_FILES = ("metrics.jsonl", "summary.json")


def default_run_dir(name: str) -> Path:
    """runs/<name>: the same on every restart, so a preempted run finds its checkpoints."""
    return Path("runs") / name


def prepare_run_dir(
    path: str | os.PathLike[str], overwrite: bool = False, resuming: bool = False
) -> Path:
    """Create the run directory; refuse one that already holds a run unless `overwrite`
    (which clears its metrics and summary) or `resuming` (which keeps them)."""
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
    for name in existing:
        (path / name).unlink()
    return path


def json_ready(value: Any) -> Any:
    """A copy of `value` that JSON can hold: it has no NaN or infinity, so those become null;
    mappings get string keys and tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


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
    """Where metrics.jsonl's records also go (TensorBoard, MLflow: thrifty.run.loggers). Fed
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


def truncate_metrics(path: str | os.PathLike[str], step: int) -> None:
    """Drop records after `step`: a resumed run writes those steps again."""
    path = Path(path)
    if not path.exists():
        return
    keep = [
        line
        for line in path.read_text().splitlines(keepends=True)
        if line.strip() and json.loads(line).get("step", 0) <= step
    ]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(keep))
    os.replace(tmp, path)


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
