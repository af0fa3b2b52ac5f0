"""A CPU step's peak memory, as CUDA's `max_memory_allocated` counts a GPU step's: the bytes of
the tensor storages alive at once, each storage counted from the operator that made it until
it is freed (a weak reference on it says when). Only this thread's operators are seen (the
forward, the backward autograd runs on it, the optimizer's step), so nothing another thread
of the process allocates meanwhile (a checkpoint writer, a sampler) moves the figure.

An operator's output that shares a storage with one of its inputs made none: a view, an
in-place result, or `detach` (activation checkpointing detaches the parameters, whose storages
were made before the meter started, and counting them there added a second copy of every
checkpointed block's weights to the peak)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class PeakMemory(TorchDispatchMode):
    """Within: `peak`, the most bytes of storages made within alive at one time."""

    def __enter__(self) -> PeakMemory:
        self.live: dict[int, int] = {}  # storage's data_ptr -> its bytes
        self.now = self.peak = 0
        return super().__enter__()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        given = {
            leaf.untyped_storage().data_ptr()
            for leaf in tree_leaves((args, kwargs))
            if isinstance(leaf, torch.Tensor)
        }
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.untyped_storage().data_ptr() not in given:
                self._track(leaf.untyped_storage())
        self.peak = max(self.peak, self.now)
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self.live:  # a view, or an op that wrote into its input
            return
        self.live[key] = size
        self.now += size
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)
