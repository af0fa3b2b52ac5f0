"""A model for the straggler tests' child processes: its forward sleeps longer on one rank."""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from dist_task import Net, Table


class SleepyNet(Net):
    """`Net` whose forward also sleeps `ms` milliseconds, `slow_ms` on rank `slow_rank`: a
    node slower at its own work than the others, as a throttled GPU would be."""

    def __init__(self, ms: float, slow_rank: int, slow_ms: float) -> None:
        super().__init__()
        slow = int(os.environ.get("RANK", "0")) == slow_rank
        self.seconds = (slow_ms if slow else ms) / 1e3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return super().forward(x)


def model(ms: float = 5.0, slow_rank: int = -1, slow_ms: float = 0.0) -> nn.Module:
    return SleepyNet(ms, slow_rank, slow_ms)


def slow_data(slow_rank: int = -1, ms: float = 0.0) -> Table:
    """The tabular data, each item costing `ms` on rank `slow_rank` only: a node whose loader
    (a slow disk, a busy host) keeps the others waiting."""
    slow = int(os.environ.get("RANK", "0")) == slow_rank
    return Table(768, seed=1, ms=ms if slow else 0.0)
