"""Text for tests that train the demo GPT: the demo's byte windows (inputs and next-byte
targets) over bytes made here from a seed, the same in every process, rather than read from
the standard library's files. Imported by runs through PYTHONPATH=tests."""

from __future__ import annotations

import random

import torch

from thrifty.demo.data import ByteWindows


def text(max_bytes: int, seed: int) -> torch.Tensor:
    """`max_bytes` bytes, the same for the same seed in every process, as uint8."""
    data = bytearray(random.Random(seed).randbytes(max_bytes))
    return torch.frombuffer(data, dtype=torch.uint8)


def train_data(block_size: int = 16, max_bytes: int = 40_000) -> ByteWindows:
    return ByteWindows(text(max_bytes, seed=1), block_size)


def val_data(block_size: int = 16, max_bytes: int = 4_000) -> ByteWindows:
    return ByteWindows(text(max_bytes, seed=2), block_size)
