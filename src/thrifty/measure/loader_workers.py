"""What a training step would take with more loader workers: the model the diagnosis weighs a
`data.num_workers` recommendation on.

Per micro-batch, in the steady state:

- `compute`: the step's seconds outside its data wait;
- `produce`: the seconds one process takes to produce a batch;
- `handoff`: the seconds the training loop spends taking a batch from a worker process
  (the queue, unpickling, mapping its tensors' shared memory), which it does not pay when it
  fetches the batch itself (num_workers = 0).

With n workers the loop takes a batch every max(compute + handoff, produce ÷ n) seconds, and
never faster than the loader alone was measured to deliver one with n workers. So a fast
loader (in-memory data: a fraction of a millisecond a batch) gains nothing from workers — the
handoff costs more than the wait it removes — while a slow one gains until the workers keep
up with compute.

Units: seconds per micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from thrifty.measure.evidence import Evidence
from thrifty.measure.evidence import ms as _ms

# What taking a batch from a worker costs the training loop where the run measured nothing
# better: about a millisecond for small tensor batches (an in-memory TensorDataset measured
# 1–2 ms per batch with one worker against 0.06–0.3 ms in the training process).
WORKER_HANDOFF_SECONDS = 2e-3


@dataclass(frozen=True, slots=True)
class WorkerModel:
    """The steady state of a loader: seconds per micro-batch (see the module docstring).
    `produce` is None where nothing says how long a batch takes; `how` and `handoff_how` say
    where the figures came from, in words."""

    compute: float
    produce: float | None
    handoff: float
    fetch: Mapping[int, float]  # measured loader-only seconds per batch, by worker count
    how: str
    handoff_how: str

    def batch_seconds(self, workers: int) -> float:
        """Modelled seconds per micro-batch with `workers` (≥ 1) loader workers."""
        produce = self.produce if self.produce is not None else 0.0
        seconds = max(self.compute + self.handoff, produce / workers)
        measured = self.fetch.get(workers)
        return max(seconds, measured) if measured is not None else seconds

    def needed(self) -> int:
        """The fewest workers that produce a batch while the loop computes and takes one."""
        if self.produce is None:
            return 1
        return max(1, math.ceil(self.produce / (self.compute + self.handoff)))

    def keep_up(self, above: int) -> list[int]:
        """Measured worker counts above `above` whose loader alone keeps up with the loop."""
        pace = self.compute + self.handoff
        return sorted(n for n, s in self.fetch.items() if n > above and s <= pace)


def model_workers(e: Evidence, wait_seconds: float) -> WorkerModel:
    """The loader model for `e`, given its data wait per step (`wait_seconds`: the run's, less
    any part that is waiting for another rank)."""
    accumulation = e.accumulation_steps
    wait = wait_seconds / accumulation
    compute = max((e.step_seconds - wait_seconds) / accumulation, 1e-9)
    fetch = dict(e.fetch_seconds_per_batch or {})
    current = e.num_workers
    in_process, in_process_how = _in_process_seconds(current, wait, fetch)
    handoff, handoff_how = _handoff_seconds(in_process, fetch)
    if current:  # the loop already takes each batch from a worker: its wait holds the handoff
        handoff = min(handoff, wait)
    if in_process is not None:  # a worker pays its side of the handoff too
        produce: float | None = in_process + handoff
        how = in_process_how
    elif fetch:
        n = min(k for k in fetch if k > 0)
        produce, how = n * fetch[n], f"measured fetch {_ms(fetch[n])}/batch with {n} workers"
    elif current:
        # n workers deliver a batch every (compute + wait) seconds: each takes n times that.
        produce = current * (compute + wait)
        how = f"fetch ~{_ms(produce)}/batch per worker, estimated from the wait"
    else:
        produce, how = None, ""
    return WorkerModel(compute, produce, handoff, fetch, how, handoff_how)


def _in_process_seconds(
    current: int | None, wait: float, fetch: Mapping[int, float]
) -> tuple[float | None, str]:
    """Seconds the training process takes to fetch a batch itself, and how that was found."""
    if current == 0:  # the run's own figure, over all its steps: the wait is the fetch
        return wait, f"measured fetch {_ms(wait)}/batch in the training process"
    if 0 in fetch:
        return fetch[0], f"measured fetch {_ms(fetch[0])}/batch in one process"
    return None, ""


def _handoff_seconds(in_process: float | None, fetch: Mapping[int, float]) -> tuple[float, str]:
    """Seconds per batch that taking it from a worker adds, and how that was found. Measured
    where the loader was timed with workers: n workers × their seconds per batch is what one
    worker spends on a batch, and what exceeds the in-process fetch is the handoff."""
    workers = {n: s for n, s in fetch.items() if n > 0}
    if in_process is None or not workers:
        return (
            WORKER_HANDOFF_SECONDS,
            f"~{_ms(WORKER_HANDOFF_SECONDS)}/batch to take a batch from a worker",
        )
    n = min(workers, key=lambda k: k * workers[k])
    handoff = max(0.0, n * workers[n] - in_process)
    return handoff, (
        f"{_ms(handoff)}/batch to take a batch from a worker (measured {_ms(workers[n])}/batch "
        f"with {n} worker{'s' if n != 1 else ''})"
    )
