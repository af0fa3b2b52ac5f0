"""The batch geometry: how one optimizer step's samples are laid out in micro-batches,
accumulation steps and ranks. It is resolved once, from `[batch]` and the world size (and, with
batch.micro = "auto", the micro-batch measured at start), and handed whole to what lays the
batches out: the data, the optimizer's lr scaling, the schedule, the checkpoint's layout and
the run's summary. An out-of-memory error halves the micro-batch the steps use
(`thrifty.levers.micro_batch.Halving`); the geometry keeps the one set up."""

from __future__ import annotations

from dataclasses import dataclass

from thrifty.config import BatchConfig


def starting_micro(batch: BatchConfig) -> int:
    """batch.micro before any measurement: the number given, or with "auto" one sample (the
    FLOP count's and the data checks' smallest micro-batch)."""
    return 1 if batch.micro == "auto" else batch.micro


@dataclass(frozen=True, slots=True)
class BatchGeometry:
    """`micro` samples per forward and backward on each rank, `accumulation` micro-batches per
    optimizer step on each of `world_size` ranks: `effective` samples per optimizer step."""

    micro: int
    accumulation: int
    effective: int
    world_size: int = 1
    auto: bool = False  # batch.micro = "auto": `micro` is measured (1 until then)

    @classmethod
    def of(cls, batch: BatchConfig, world_size: int, measured: int | None = None) -> BatchGeometry:
        """The geometry `batch` asks for on `world_size` ranks, with the micro-batch `measured`
        for batch.micro = "auto" (None: not yet measured, one sample). Refuses, in one line, a
        batch.effective the ranks cannot share evenly (with "auto": before it is measured,
        rather than naming a micro-batch of 1)."""
        batch.check_world_size(world_size)
        micro = starting_micro(batch) if measured is None else measured
        return cls(
            micro=micro,
            accumulation=batch.accumulation_steps(world_size, micro),
            effective=batch.effective or micro * world_size,
            world_size=world_size,
            auto=batch.micro == "auto",
        )
