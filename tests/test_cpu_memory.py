"""The CPU peak the checkpointing-room tests rest on (`cpu_memory.PeakMemory`) agrees with what
the C library's allocator says is in use, with and without activation checkpointing."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import cpu_memory
from thrifty.demo import build_model
from thrifty.levers.activation_checkpointing import (
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
        )
    ]


def _libc_in_use() -> Callable[[], int] | None:
    """glibc's bytes in use (small blocks plus mmapped ones), or None off glibc."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2

    def in_use() -> int:
        info = libc.mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return in_use


IN_USE = _libc_in_use()


class MallocPeak(TorchDispatchMode):
    """The allocator's bytes in use, above where they stood on entry, read around every
    operator this thread runs: the most at any one time."""

    def __enter__(self) -> MallocPeak:
        assert IN_USE is not None
        self.base, self.peak = IN_USE(), 0
        return super().__enter__()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        assert IN_USE is not None
        self.peak = max(self.peak, IN_USE() - self.base)
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, IN_USE() - self.base)
        return out


class _Block(nn.Module):
    """A ResNet basic block: many parameters for the activations it saves."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class _ResNet(nn.Module):
    def __init__(self, channels: int = 256, depth: int = 6) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(_Block(channels) for _ in range(depth))
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x.mean((2, 3))), y)


def _resnet() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = _ResNet()
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    return model, lambda: model(x, y)


def _gpt() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = build_model(n_layer=4, n_head=2, n_embd=128, block_size=256, vocab_size=256)
    x = torch.randint(0, 256, (8, 257), generator=torch.Generator().manual_seed(0))
    return model, lambda: model(input_ids=x[:, :-1], targets=x[:, 1:])


@pytest.mark.skipif(IN_USE is None, reason="needs glibc's mallinfo2 to compare against")
@pytest.mark.parametrize("build", [_resnet, _gpt], ids=["resnet", "gpt"])
@pytest.mark.parametrize("policy", ["off", "every_other", "all"])
def test_the_cpu_peak_agrees_with_the_allocators_bytes_in_use(build, policy):
    # Activation checkpointing detaches the parameters: the meter counted those storages,
    # made before it started, as new ones, a second copy of the checkpointed blocks' weights
    # (ResNet-like blocks: 63.8 MiB where the allocator's bytes in use peaked at 36.8).
    torch.manual_seed(0)
    model, loss = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if policy != "off":
        apply_activation_checkpointing(model, policy)

    def step() -> None:
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # whatever a first step allocates once
    gc.collect()
    with cpu_memory.PeakMemory() as storages:
        step()
    gc.collect()
    with MallocPeak() as malloc:
        step()
    if policy != "off":
        remove_activation_checkpointing(model)
    assert storages.peak == pytest.approx(malloc.peak, rel=0.05), (storages.peak, malloc.peak)
