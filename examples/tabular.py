"""A plain MLP on a tabular dataset, for `thrifty train examples/mlp.toml`.

The table is synthetic so the example runs anywhere: 12 numeric features, 3 classes, the label a
fixed nonlinear function of the features plus noise.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


def make_table(rows: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 12, generator=g)
    score = torch.stack([x[:, :4].sum(1), (x[:, 4:8] ** 2).sum(1) - 4, x[:, 8] * x[:, 9]], dim=1)
    y = (score + 0.3 * torch.randn(rows, 3, generator=g)).argmax(1)
    return TensorDataset(x, y)


def train_table(rows: int = 8192) -> TensorDataset:
    return make_table(rows, seed=1)


def val_table(rows: int = 1024) -> TensorDataset:
    return make_table(rows, seed=2)


def mlp(width: int = 128, depth: int = 3) -> nn.Module:
    layers: list[nn.Module] = []
    size = 12
    for _ in range(depth):
        layers += [nn.Linear(size, width), nn.ReLU()]
        size = width
    return nn.Sequential(*layers, nn.Linear(size, 3))


def cross_entropy(output: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(output, batch[1])


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
