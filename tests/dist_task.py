"""Factories for the distributed tests' child processes (imported through PYTHONPATH=tests)."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import Dataset


class Table(Dataset):
    """The tabular example's data; each item can cost `ms` of wall time (a slow loader)."""

    def __init__(self, rows: int, seed: int, ms: float = 0.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(rows, 12, generator=g)
        score = torch.stack(
            [self.x[:, :4].sum(1), (self.x[:, 4:8] ** 2).sum(1) - 4, self.x[:, 8] * self.x[:, 9]],
            dim=1,
        )
        self.y = (score + 0.3 * torch.randn(rows, 3, generator=g)).argmax(1)
        self.ms = ms

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ms:
            time.sleep(self.ms / 1e3)
        return self.x[i], self.y[i]


def train_data(rows: int = 768, ms: float = 0.0) -> Table:
    return Table(rows, seed=1, ms=ms)


class Stalling(Table):
    """A loader that stalls on the rows from `start` to `stop`: `ms` of wall time each."""

    def __init__(self, rows: int, ms: float, start: int, stop: int) -> None:
        super().__init__(rows, seed=1)
        self.stall = (ms, range(start, stop))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ms, rows = self.stall
        if i in rows:
            time.sleep(ms / 1e3)
        return self.x[i], self.y[i]


def stalling_data(rows: int = 256, ms: float = 5.0, start: int = 64, stop: int = 128) -> Table:
    return Stalling(rows, ms, start, stop)


def val_data(rows: int = 768, ms: float = 0.0) -> Table:
    return Table(rows // 3, seed=2)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


class Net(nn.Module):
    """An input layer, repeated blocks (what FSDP and activation checkpointing wrap), a head."""

    def __init__(self, width: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(12, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def model(width: int = 32) -> nn.Module:
    return Net(width)


def sgd(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)


def cross_entropy(output: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(output, batch[1])
