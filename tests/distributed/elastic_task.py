"""Training data that records which samples the training loader fetched, for the tests that
prove a resume at another world size skips and repeats none (imported through PYTHONPATH)."""

from __future__ import annotations

import os
from pathlib import Path

from dist_task import Table


class Recorded(Table):
    """`dist_task.Table` whose batched fetches (the training loader's, not the samples read to
    count FLOPs) append their indices to `record/rank<R>-<pid>.txt`, one line a batch."""

    def __init__(self, rows: int, record: str) -> None:
        super().__init__(rows, seed=1)
        self.record = Path(record)

    def __getitems__(self, indices: list[int]) -> list:
        self.record.mkdir(parents=True, exist_ok=True)
        name = f"rank{os.environ.get('RANK', '0')}-{os.getpid()}.txt"
        with open(self.record / name, "a") as f:
            f.write(" ".join(map(str, indices)) + "\n")
        return [self[i] for i in indices]


def train_data(rows: int, record: str) -> Recorded:
    return Recorded(rows, record)


def val_data(rows: int, record: str) -> Table:
    return Table(rows // 4, seed=2)
