"""DDP: a full replica per rank; gradients are all-reduced during backward, once per window."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from thrifty.levers.precision import Precision
from thrifty.strategies.base import Strategy


class DDP(Strategy):
    name = "ddp"

    def wrap(self, model: nn.Module, precision: Precision) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        # Buffers are not broadcast at every forward: a forward then holds no collective, so a
        # rank that ran out of memory can leave the window's other micro-batches out. Rank 0's
        # buffers are the ones saved, and every rank evaluates with them (`before_eval`).
        self._ddp = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            **_no_buffer_sync_in_forward(DistributedDataParallel),
        )
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._grads_before: list[tuple[torch.Tensor | None, int]] = []
        self._sync_failed = False
        return self._ddp

    def grad_sync(self, last: bool) -> AbstractContextManager[Any]:
        # The window's earlier micro-batches accumulate locally; the last one's backward
        # all-reduces the sum, overlapped with the rest of backward.
        return self._synchronizing() if last else self._ddp.no_sync()

    @contextlib.contextmanager
    def _synchronizing(self) -> Iterator[None]:
        # What `join_sync` needs if this micro-batch fails part-way: which gradients its
        # backward reached, and whether DDP's forward armed the all-reduce (DDP sets this flag
        # as it does).
        self._grads_before = [_grad_mark(p) for p in self._params]
        self._ddp.require_forward_param_sync = False
        self._sync_failed = True
        yield
        self._sync_failed = False

    def join_sync(self, one_sample: Callable[[], object]) -> None:
        """This rank ran out of memory in the window: take part in the gradient all-reduce the
        other ranks are in, so that none waits in it. The gradients are then dropped (the
        window is replayed), so what this rank contributes does not matter, only that the
        same buckets are reduced in the same order."""
        armed = self._sync_failed and self._ddp.require_forward_param_sync
        self._sync_failed = False
        if not armed:
            # DDP's forward never completed: a one-sample forward and backward arm and run
            # the same all-reduces, at the memory of one sample.
            one_sample()
            return
        # The synchronizing backward began, then failed: DDP waits for the gradients it did
        # not reach. A zero gradient for each of them completes the buckets; DDP reduces them
        # and finishes the backward as it would have.
        left = [
            p
            for p, before in zip(self._params, self._grads_before, strict=True)
            if not _reached(p, before)
        ]
        if left:
            torch.stack([p.reshape(-1)[0].float() for p in left]).sum().mul(0).backward()

    def before_eval(self) -> None:
        with torch.no_grad():
            for buffer in self._ddp.module.buffers():
                dist.broadcast(buffer, src=0)


def _no_buffer_sync_in_forward(ddp: Any) -> dict[str, Any]:
    """The argument that keeps buffers out of DDP's forward: `forward_sync_buffers` where this
    torch has it (its older name, `broadcast_buffers`, is deprecated there), else the older."""
    if "forward_sync_buffers" in inspect.signature(ddp).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def _grad_mark(p: nn.Parameter) -> tuple[torch.Tensor | None, int]:
    """Which gradient tensor `p` holds and its version: accumulating into it changes one."""
    return (p.grad, -1 if p.grad is None else p.grad._version)


def _reached(p: nn.Parameter, before: tuple[torch.Tensor | None, int]) -> bool:
    """Whether a backward accumulated into `p` since `before` was marked."""
    grad, version = before
    return p.grad is not grad or (grad is not None and grad._version != version)
