"""What resuming throws away: the work earlier attempts paid for that the checkpoint resumed
from does not hold (training past it, redone since) and their wall time outside the training
clock, read from a run directory's metrics.jsonl and summary.json before a resume truncates or
replaces them. The cost meter bills it (`CostMeter.add_wasted`).

Units: seconds, optimizer steps."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class LostWork:
    """What earlier attempts paid that a checkpoint's training clock does not hold: work
    thrown away (`seconds` of training, `steps` optimizer steps redone) and their wall time
    outside the training clock (`overhead_seconds`: set-up, what followed the last step);
    `resumed_seconds` is the training clock the checkpoint resumed from holds."""

    seconds: float = 0.0
    steps: int = 0
    overhead_seconds: float = 0.0
    resumed_seconds: float = field(default=0.0, compare=False)  # where, not what was paid

    def __add__(self, other: LostWork) -> LostWork:
        return LostWork(
            self.seconds + other.seconds,
            self.steps + other.steps,
            self.overhead_seconds + other.overhead_seconds,
            other.resumed_seconds or self.resumed_seconds,
        )

    def to_record(self) -> dict[str, Any]:
        """The run's totals so far, for the "resumed" event in metrics.jsonl (which is where
        the next resume finds them); nothing while nothing was lost."""
        record: dict[str, Any] = {}
        if self.seconds or self.steps:
            record |= {"wasted_seconds": self.seconds, "redone_steps": self.steps}
        if self.overhead_seconds:
            record["overhead_seconds"] = self.overhead_seconds
        return record


def lost_work(
    records: Iterable[Mapping[str, Any]],
    step: int,
    seconds: float | None = None,
    finished: Mapping[str, Any] | None = None,
) -> LostWork:
    """What resuming at `step` throws away, from metrics records, totals of earlier resumes
    included.

    `records`: metrics.jsonl before it is truncated to `step`; `seconds`: the training seconds
    the checkpoint holds (`TrainState.seconds`), to read the loss off cost snapshots too. The
    records past `step` give this resume's loss: the sum of their `step_seconds`, or the last
    cost snapshot's `elapsed_seconds` minus `seconds` when that is more (it also counts
    evaluation and saves); both miss the seconds after the last record, so take the larger.
    The last "resumed" event's totals carry what earlier resumes threw away. The earlier
    attempts' wall time outside the training clock is the largest `overhead_seconds` a record
    carries (each is the run's total so far), or the cost a finished attempt's summary.json
    holds (`finished`: `finished_cost`), which counts its time after its last record too.
    """
    before = LostWork()
    step_seconds, last_step, elapsed, overhead = 0.0, step, None, 0.0
    for record in records:
        if record.get("event") == "resumed" and "wasted_seconds" in record:
            before = LostWork(record["wasted_seconds"], record.get("redone_steps", 0))
        overhead = max(overhead, _overhead(record))
        at = record.get("step", 0)
        if not isinstance(at, int) or at <= step:
            continue
        if isinstance(record.get("step_seconds"), int | float):
            step_seconds += record["step_seconds"]
            last_step = max(last_step, at)
        cost = record.get("cost")
        if isinstance(cost, Mapping) and isinstance(cost.get("elapsed_seconds"), int | float):
            elapsed = max(elapsed or 0.0, cost["elapsed_seconds"])
    lost = step_seconds
    if elapsed is not None and seconds is not None:
        lost = max(lost, elapsed - seconds)
    overhead = max(overhead, _overhead({"cost": finished}))
    return before + LostWork(lost, last_step - step, overhead, float(seconds or 0.0))


def _overhead(record: Mapping[str, Any]) -> float:
    """The run's wall time outside the training clock as `record` carries it (0: none)."""
    cost = record.get("cost")
    found = cost.get("overhead_seconds") if isinstance(cost, Mapping) else None
    if found is None and record.get("event") == "resumed":
        found = record.get("overhead_seconds")
    if isinstance(found, bool) or not isinstance(found, int | float) or not math.isfinite(found):
        return 0.0
    return max(0.0, float(found))


def finished_cost(run_dir: str | os.PathLike[str]) -> Mapping[str, Any] | None:
    """The cost a finished attempt's summary.json in `run_dir` holds (None: none, or not a
    regular file, or damaged): read before a run extended again replaces it."""
    import stat

    path = os.path.join(run_dir, "summary.json")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a FIFO or a device is never opened
        with open(path, encoding="utf-8") as f:
            cost = json.load(f).get("cost")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    return cost if isinstance(cost, Mapping) else None


def lost_work_before_resume(
    metrics_path: str | os.PathLike[str], step: int, seconds: float | None = None
) -> LostWork:
    """`lost_work` of a run directory's metrics.jsonl; call it before truncating the file.
    No file (a new machine without the old run directory): nothing is known to be lost."""
    try:
        with open(metrics_path, encoding="utf-8", errors="replace") as f:  # bad bytes: damage
            lines = f.read().splitlines()
    except FileNotFoundError:
        return LostWork()
    return lost_work(_parsed(lines), step, seconds)


def _parsed(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short when the process was killed
            continue
        if isinstance(record, dict):
            yield record
