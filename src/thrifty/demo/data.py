"""The demo's text: the Python standard library's own source files, on every machine, no download.

Files are split into train and validation by a hash of their relative path, so the split is the
same on every run and no file contributes to both.
"""

from __future__ import annotations

import os
import sysconfig
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import Dataset

# Not the demo's text: installed packages and the standard library's own tests.
_SKIPPED = ("site-packages", "dist-packages", "test", "idlelib/idle_test")


def stdlib_files() -> Iterator[Path]:
    """The standard library's .py files (site-packages and tests excluded), in sorted order.

    Walked lazily, a folder's entries in name order (the order of sorting the whole list by
    path parts), so a split that has its bytes stops reading the tree there: the demo's few
    hundred kilobytes take a few folders, not a walk of the whole library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    yield from _walk(root, root)


def _walk(root: Path, folder: Path) -> Iterator[Path]:
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        path = Path(entry.path)
        if entry.is_dir(follow_symlinks=False):
            if path.relative_to(root).as_posix() not in _SKIPPED:
                yield from _walk(root, path)
        elif entry.name.endswith(".py"):
            yield path


def load_split(split: str, max_bytes: int, val_fraction: float = 0.1) -> torch.Tensor:
    """Up to `max_bytes` bytes of the train or validation files, concatenated, as uint8."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in stdlib_files():
        bucket = zlib.crc32(path.relative_to(root).as_posix().encode()) % 1000
        if (bucket < val_fraction * 1000) != (split == "val"):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if not chunks:
        raise RuntimeError(f"no standard-library source files found under {root}")
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8)


class ByteWindows(Dataset):
    """Non-overlapping windows of `block_size + 1` bytes: inputs and next-byte targets."""

    def __init__(self, data: torch.Tensor, block_size: int) -> None:
        self.data = data
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = index * self.block_size
        window = self.data[start : start + self.block_size + 1].long()
        return {"input_ids": window[:-1], "targets": window[1:]}
