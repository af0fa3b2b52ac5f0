"""A model whose trial ends its own process, for the warm trial engine's tests (imported through
PYTHONPATH=tests).

`model(fault=...)` is the tabular model of `dist_task`; at its `at`-th forward pass it:
- "segfault": reads address 0 through ctypes (SIGSEGV in native code);
- "abort": calls os.abort() (SIGABRT);
- "hang": sleeps for an hour (a trial that makes no progress);
- "kill": SIGKILLs its own process (the out-of-memory killer's way);
- "oom": allocates 4 TiB, which the allocator refuses (an out-of-memory error the run raises),
  at that pass and every later one, so that the run's smaller micro-batches cannot recover.

`ticketed_model()` takes its fault from a ticket: the first file (by name) in the folder that
FAULT_TICKETS names, which it deletes, its content the fault ("none" when no ticket is left).
So a sweep's trials meet the faults in order, each once, and every later trial runs clean.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn

from dist_task import Net


class Faulty(nn.Module):
    def __init__(self, fault: str, at: int, width: int) -> None:
        super().__init__()
        self.net = Net(width)
        self.fault, self.at, self.calls = fault, at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:  # training passes only: an evaluation comes first
            self.calls += 1
            if self.calls == self.at or (self.fault == "oom" and self.calls > self.at):
                strike(self.fault)  # out of memory at every pass: the split cannot save it
        return self.net(x)


def strike(fault: str) -> None:
    if fault == "segfault":
        ctypes.string_at(0)
    elif fault == "abort":
        os.abort()
    elif fault == "hang":
        time.sleep(3600)
    elif fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault == "oom":
        torch.empty(1 << 42, dtype=torch.uint8).fill_(1)


def model(fault: str = "none", at: int = 3, width: int = 32) -> nn.Module:
    return Faulty(fault, at, width)


def ticketed_model(at: int = 3, width: int = 32) -> nn.Module:
    folder = os.environ.get("FAULT_TICKETS")
    fault = "none"
    if folder:
        tickets = sorted(Path(folder).iterdir())
        if tickets:
            fault = tickets[0].read_text().strip()
            tickets[0].unlink()
    return Faulty(fault, at, width)
