"""Copy a nested training state to host memory so training can go on while it is written.

This is the only part of an asynchronous save the training loop waits for. The copy must be
independent: the optimizer updates parameters in place right after `save()` returns.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from typing import Any

import torch

_PLAIN = (int, float, bool, str, bytes, type(None), torch.dtype, torch.Size)

Path = tuple[Any, ...]


class HostBuffers:
    """Host tensors reused from one save to the next.

    Allocating (and, for CUDA, pinning) hundreds of megabytes is slower than copying into memory
    that is already mapped, so the copy of step N+1 lands in the buffers of step N. Safe because
    at most one save is in flight: the previous write has finished before the next copy starts.
    """

    def __init__(self) -> None:
        self._by_path: dict[Path, torch.Tensor] = {}
        self._next: dict[Path, torch.Tensor] = {}

    def get(self, path: Path, src: torch.Tensor, pinned: bool) -> torch.Tensor:
        buf = self._by_path.get(path)
        if (
            buf is None
            or buf.shape != src.shape
            or buf.dtype != src.dtype
            or buf.is_pinned() != pinned
        ):
            buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=pinned)
        self._next[path] = buf
        return buf

    def finish(self) -> None:
        """Forget buffers for tensors that were not in this state."""
        self._by_path, self._next = self._next, {}


def _where(path: Path) -> str:
    return "state" + "".join(f"[{p!r}]" for p in path)


def copy_to_host(state: Any, buffers: HostBuffers | None = None) -> Any:
    """Return a copy of `state` whose tensors are independent, contiguous CPU tensors.

    `state` nests dicts, lists and tuples of tensors and plain values (int, float, bool, str,
    bytes, None). Anything else raises TypeError naming where it sits, because loading refuses
    to unpickle arbitrary objects. The same tensor object appearing twice is copied once.
    """
    buffers = buffers if buffers is not None else HostBuffers()
    memo: dict[int, torch.Tensor] = {}
    devices: set[torch.device] = set()
    out = _copy(state, (), buffers, memo, devices)
    for device in devices:
        # Copies to pinned memory were queued non-blocking; wait for them before returning.
        torch.cuda.synchronize(device)
    buffers.finish()
    return out


def _copy(
    obj: Any,
    path: Path,
    buffers: HostBuffers,
    memo: dict[int, torch.Tensor],
    devices: set[torch.device],
) -> Any:
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = _copy_tensor(obj, path, buffers, devices)
        return memo[id(obj)]
    if isinstance(obj, _PLAIN):
        return obj
    if type(obj) in (dict, OrderedDict):
        out = type(obj)()
        for key, value in obj.items():
            if not isinstance(key, _PLAIN):
                raise TypeError(f"{_where(path)} has a key of type {type(key).__name__}")
            out[key] = _copy(value, (*path, key), buffers, memo, devices)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(
            _copy(value, (*path, i), buffers, memo, devices) for i, value in enumerate(obj)
        )
    raise TypeError(
        f"{_where(path)} is a {type(obj).__module__}.{type(obj).__qualname__}: a checkpoint "
        "holds only tensors, dicts, lists, tuples and plain values (convert numpy arrays with "
        "torch.from_numpy, objects with their state_dict())"
    )


def _copy_tensor(
    t: torch.Tensor, path: Path, buffers: HostBuffers, devices: set[torch.device]
) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided or t.is_quantized:
        return t.to("cpu", copy=True)
    if t.device.type == "cuda":
        dst = buffers.get(path, t, pinned=True)
        dst.copy_(t, non_blocking=True)
        devices.add(t.device)
        return dst
    if t.device.type != "cpu":
        return t.to("cpu", copy=True)
    dst = buffers.get(path, t, pinned=False)
    if t.numel() == 0:
        return dst
    if t.is_contiguous() and not (t.is_conj() or t.is_neg()):
        # One memcpy (GIL released): on a 2-vCPU machine ATen's multi-threaded copy_ of a
        # 264 MB state took 250 ms against 60 ms for memcpy, and this copy is the stall.
        ctypes.memmove(dst.data_ptr(), t.data_ptr(), t.numel() * t.element_size())
    else:
        dst.copy_(t)
    return dst


def nbytes(state: Any) -> int:
    """Bytes of tensor data in a nested state (what a save of it writes, give or take the
    pickle's few kilobytes); a tensor appearing twice counts once."""
    seen: set[int] = set()
    total = 0
    todo = [state]
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen.add(id(obj))
                total += obj.numel() * obj.element_size()
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            todo.extend(obj)
    return total
