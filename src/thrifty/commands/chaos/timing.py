"""What the kills cost in time: the effective training time of the killed run.

The useful time is what its steps took, counting each step once: the final metrics.jsonl keeps
only the run of each step that survived (a resumed attempt replaces the records of the steps it
runs again). The wall time is every attempt's, from its start to its end, so each relaunch's
start-up, resume and redone steps are in it. Their ratio is the share of the time that trained;
the same ratio for the reference run is what the job reaches without kills.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def useful_step_seconds(records: Sequence[dict[str, Any]]) -> float:
    """Seconds the steps in these metrics records took (`step_seconds` of each step record)."""
    return sum(
        float(r["step_seconds"])
        for r in records
        if "loss" in r and isinstance(r.get("step_seconds"), (int, float))
    )


def effective_time(
    records: Sequence[dict[str, Any]],
    attempt_seconds: Sequence[float],
    reference_records: Sequence[dict[str, Any]],
    reference_seconds: float,
) -> dict[str, Any]:
    """The report's `effective_time`: useful step seconds over wall seconds (all attempts, so
    relaunches included), the reference run's same ratio, and the seconds each kill cost."""
    useful = useful_step_seconds(records)
    wall = sum(attempt_seconds)
    kills = len(attempt_seconds) - 1
    reference_useful = useful_step_seconds(reference_records)
    return {
        "useful_step_seconds": round(useful, 3),
        "wall_seconds": round(wall, 3),
        "attempt_seconds": [round(s, 3) for s in attempt_seconds],
        "fraction": round(useful / wall, 4) if wall > 0 else None,
        "reference_fraction": (
            round(reference_useful / reference_seconds, 4) if reference_seconds > 0 else None
        ),
        # Steps redone, start-up and resume: the wall time the kills added, per kill.
        "seconds_per_kill": round((wall - reference_seconds) / kills, 3) if kills > 0 else None,
    }
