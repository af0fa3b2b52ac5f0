"""Resuming a full-model (single or DDP) checkpoint at another world size.

The global batch (`batch.effective`) is what the optimization depends on, so it is kept and
the accumulation absorbs the change: 2 processes × 2 micro-batches of 16 become 1 × 4. The
model, optimizer, schedule and counters are restored exactly, and the data order continues
from the same global sample position: thrifty's epoch order hands rank r of W positions r,
r + W, r + 2W, ..., so after S steps of E samples every rank, at any W, has consumed exactly
the first S × E positions of the epoch's order (`RunCheckpointer` converts the position by
windows). What cannot follow a new split is each rank's random streams (dropout) and those of
the loader's workers: they start afresh, and the one line `warn_world_change` logs says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from thrifty.config import BatchConfig
from thrifty.errors import ConfigError

log = logging.getLogger("thrifty")


def warn_world_change(saved_world: int, world: int, strategy: str) -> None:
    """The one line a resume at another world size logs: what continues exactly, what not."""
    log.warning(
        "resuming a checkpoint of %d process(es) on %d (%s): the model, optimizer, schedule, "
        "counters and data order continue exactly, the global batch is kept and the "
        "accumulation absorbs the change; not bit-exact: each rank's random streams (dropout) "
        "and the loader workers' streams start afresh",
        saved_world,
        world,
        strategy,
    )


def check_effective_kept(
    state: Mapping[str, Any], effective: int, world: int, batch: BatchConfig
) -> None:
    """Refuse, in one line, a checkpoint `state` written at another world size whose global
    batch followed the process count (`batch.effective` unset: micro × world) and so changed
    with it; `effective` is this run's."""
    saved_world, saved_effective = int(state.get("world_size", 1)), state["effective_batch"]
    if saved_world == world or saved_effective == effective or batch.effective is not None:
        return
    raise ConfigError(
        f"the checkpoint was written by {saved_world} process(es) with an effective batch of "
        f"{saved_effective}, and with batch.effective unset this run of {world} has "
        f"{effective} (batch.micro × world size): set batch.effective = {saved_effective} to "
        "resume at another world size with the same optimization"
    )
