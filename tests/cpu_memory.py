"""A CPU step's peak memory, as CUDA's `max_memory_allocated` measures a GPU step's: glibc's
count of the bytes malloc has handed out and not taken back, read after every aten operator
(forward, backward and the optimizer's step)."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return libc
    except (OSError, AttributeError):  # not glibc, or a glibc older than 2.33
        return None


_LIBC = _libc()
AVAILABLE = _LIBC is not None


def in_use() -> int:
    """Bytes allocated and not freed: malloc's arenas and its mmapped blocks, every thread's."""
    info = _LIBC.mallinfo2()
    return int(info.uordblks + info.hblkhd)


class PeakMemory(TorchDispatchMode):
    """Within: `peak`, the most bytes in use above what was in use on entry."""

    def __enter__(self) -> PeakMemory:
        self.base, self.peak = in_use(), 0
        return super().__enter__()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, in_use() - self.base)
        return out
