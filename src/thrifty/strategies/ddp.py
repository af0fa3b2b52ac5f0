"""DDP: a full replica per rank; gradients are all-reduced during backward, once per window."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

from torch import nn

from thrifty.levers.precision import Precision
from thrifty.strategies.base import Strategy


class DDP(Strategy):
    name = "ddp"

    def wrap(self, model: nn.Module, precision: Precision) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        self._ddp = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        return self._ddp

    def grad_sync(self, last: bool) -> AbstractContextManager[Any]:
        # The window's earlier micro-batches accumulate locally; the last one's backward
        # all-reduces the sum, overlapped with the rest of backward.
        return contextlib.nullcontext() if last else self._ddp.no_sync()
