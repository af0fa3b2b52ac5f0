"""Factories for the sweep's trust tests' trials (imported through PYTHONPATH=tests).

- `nan_loss`: a loss that is NaN from the first step, so the run diverges (exit 1, its
  summary's stop reason `diverged`); `busy_model` makes the run's last log line the warning a
  busy machine gives, as a run on a shared machine ends (printed when the run lets go of the
  model, after the run's own last words).
- `model(inputs=...)`: the tabular model with an input width the data may not have: a space
  value that makes the shapes invalid fails every trial alike.
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch import nn

from dist_task import Net, cross_entropy

BUSY = (
    "thrifty: warning: the machine was busy: other processes held 60% of the CPU while this "
    "run trained; its step times are not this config's"
)


def nan_loss(output: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return cross_entropy(output, batch) * float("nan")


def _say_busy() -> None:
    print(BUSY, file=sys.stderr, flush=True)


def busy_model(width: int = 32) -> nn.Module:
    model = Net(width)
    weakref.finalize(model, _say_busy)  # when the run lets go of it: its log's last line
    return model


class Wide(nn.Module):
    """A head over `inputs` features: the data has 12, any other width fails at the first step."""

    def __init__(self, inputs: int) -> None:
        super().__init__()
        self.body = nn.Linear(inputs, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def model(inputs: int = 12, note: str = "") -> nn.Module:
    """`note`: a text parameter the model ignores (a sweep's parameter shown as written)."""
    return Wide(inputs)
