"""A task whose first attempt is preempted: rank 1 gets SIGTERM while it loads a batch.

The attempt is torch's elastic restart count (TORCHELASTIC_RESTART_COUNT), so under
`--max-restarts 1` the restarted worker group trains on undisturbed.
"""

from __future__ import annotations

import os
import signal

from dist_task import Table


class PreemptedOnce(Table):
    """The tabular data; in attempt 0, rank 1 signals itself at its `at`-th item."""

    def __init__(self, rows: int, seed: int, at: int) -> None:
        super().__init__(rows, seed)
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        self.countdown = at if first_attempt and os.environ.get("RANK") == "1" else -1

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        if self.countdown == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        self.countdown -= 1
        return super().__getitem__(i)


def train_data(rows: int = 768, at: int = 100) -> Table:
    return PreemptedOnce(rows, seed=1, at=at)


def val_data(rows: int = 768, at: int = 100) -> Table:
    return Table(rows // 3, seed=2)
