"""How long a collective waits for a rank that does not come, and what the ranks that waited
say when one never does.

Start-up (joining, loading a checkpoint, compiling, the first save) can keep a rank away for
minutes, so collectives first wait `distributed.timeout`. Once `distributed.steady_after` steps
of this attempt are done a step takes seconds, and they wait `distributed.step_timeout`: a rank
whose machine died ends the job in minutes instead of idling every other GPU for the long
timeout. Only where the other ranks wait for rank 0 alone (writing a checkpoint, uploading at
the end of the run) do they wait long again; rank 0 then waits for them with the short
timeout, as they are there already. Switching sets the process groups' timeout on this rank
(torch's `_set_pg_timeout`; where a torch lacks it the start-up timeout stays), no collective;
every rank switches at the same step, as they all count the same steps. On CUDA the gloo
control group's agreement at every step boundary times out like the rest (NCCL's watchdog
ends the process itself at the same timeout).

The ranks left cannot save an emergency checkpoint (a save needs every rank): each says which
rank stopped answering and exits with EXIT_PREEMPTED (75) where a checkpoint exists, so that
running the job again resumes from it, and with 1 where none does.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thrifty.config import DistributedConfig
from thrifty.errors import ThriftyError
from thrifty.records.stop_signals import EXIT_PREEMPTED

if TYPE_CHECKING:
    from thrifty.strategies.process_group import Distributed

log = logging.getLogger("thrifty")

# What gloo says when the other end of a collective went away (a closed connection) or never
# came (its timeout); NCCL's errors are DistErrors.
_LOST_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
    "Broken pipe",
)
# Seconds the ranks left wait for one another to say they are alive, to name the lost rank,
# beyond distributed.step_timeout (the last of them arrives when it ends); and the more seconds
# rank 0 stays: under a launcher without its own store, rank 0 hosts the one the others read.
_PROBE_SECONDS = 10.0
_HOST_LINGERS = 2.0


@dataclass
class CollectiveTimeouts:
    """The wait in force on this rank's process groups: `distributed.timeout` at start-up,
    `distributed.step_timeout` once the steps are steady. With no `groups` (one
    process, or a process group the caller made and keeps) it changes nothing."""

    config: DistributedConfig = field(default_factory=DistributedConfig)
    groups: list[Any] = field(default_factory=list)
    short: bool = False  # the step timeout is in force
    _steady_at: int | None = None

    def begin(self, step: int) -> None:
        """The loop starts after `step` optimizer steps: the short wait from `step +
        distributed.steady_after` on."""
        self._steady_at = step + self.config.steady_after

    def step_done(self, step: int) -> None:
        """After optimizer step `step`, with every rank's word on it agreed: two comparisons
        on most steps."""
        if not self.short and self._steady_at is not None and step >= self._steady_at:
            self._set(short=True)

    def wait_for_main(self, rank: int, barrier: Callable[[], None]) -> None:
        """After work rank 0 does alone (writing a checkpoint), the ranks meet at `barrier`:
        the others with the long wait, as rank 0 may write for minutes; rank 0 with the short
        one, as the others are waiting already. Before the steps are steady nothing is met:
        the next collective has the long wait anyway."""
        if not self.short:
            return
        if rank != 0:
            self._set(short=False)
        barrier()
        if rank != 0:
            self._set(short=True)

    def end(self, rank: int) -> None:
        """The run's end: rank 0 waits for uploads and writes the run's outputs while the
        others wait for it, with the long wait from here on."""
        self._steady_at = None
        if self.short and rank != 0:
            self._set(short=False)

    def describe(self) -> str:
        """The setting in force, as the config names it: "distributed.step_timeout = 2m"."""
        key = "step_timeout" if self.short else "timeout"
        return f"distributed.{key} = {getattr(self.config, key)}"

    def _set(self, *, short: bool) -> None:
        from torch.distributed import distributed_c10d

        setter = getattr(distributed_c10d, "_set_pg_timeout", None)
        if not self.groups or setter is None:
            return
        c = self.config
        seconds = c.step_timeout_seconds if short else c.timeout_seconds
        for group in self.groups:
            setter(datetime.timedelta(seconds=seconds), group)
        self.short = short


class RankLostError(ThriftyError):
    """Another rank stopped answering: exit code 75 where a checkpoint exists to resume from
    (the job can run again), 1 where none does."""

    def __init__(self, message: str, *, resumable: bool) -> None:
        super().__init__(message)
        self.exit_code = EXIT_PREEMPTED if resumable else 1


def lost_contact(exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed because another rank went away."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _LOST_MARKERS)


def lost_rank_error(
    exc: BaseException, d: Distributed, newest_step: int | None
) -> RankLostError | None:
    """The one-line error for a collective that failed because a rank went away (None for
    any other error). `newest_step`: the step of the newest checkpoint this run has."""
    if not d.enabled or not lost_contact(exc):
        return None
    # A rank that saw the lost one's connection close comes here at once; one blocked in the
    # collective only when the step timeout ends: asked for less, it would be named lost too.
    missing = missing_ranks(d, d.timeouts.config.step_timeout_seconds + _PROBE_SECONDS)
    if not missing:
        who = "another rank"
    else:
        who = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
    said = f"{who} stopped answering within {d.timeouts.describe()} (its process or machine is gone"
    if newest_step is None:
        return RankLostError(
            f"{said}) before this run saved a checkpoint: running the job again starts it over",
            resumable=False,
        )
    return RankLostError(
        f"{said}; the ranks left cannot save without it): run the job again to resume from "
        f"the checkpoint of step {newest_step} (exit code {EXIT_PREEMPTED})",
        resumable=True,
    )


def missing_ranks(d: Distributed, wait: float) -> list[int]:
    """The ranks that do not say they are alive within `wait` seconds, asked through the
    job's rendezvous store (no collective: one is what failed). Two ranks: the other one.
    Empty when the store cannot be reached (it lived on the lost rank's machine)."""
    if d.world_size == 2:
        return [1 - d.rank]
    from torch.distributed import distributed_c10d

    keys = [f"thrifty/alive/{rank}" for rank in range(d.world_size)]
    try:
        store = distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=wait))
        store.set(keys[d.rank], "1")
        deadline = time.monotonic() + wait + (_HOST_LINGERS if d.is_main else 0.0)
        alive = [store.check([key]) for key in keys]
        while not all(alive) and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [store.check([key]) for key in keys]
    except Exception as exc:  # the store's host is gone too: the rank cannot be named
        log.debug("the rendezvous store did not answer: %s", exc)
        return []
    return [rank for rank, here in enumerate(alive) if not here]
