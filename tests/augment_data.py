"""Images with torchvision-style random augmentation, for the loader-worker random-state tests
(imported by loader workers)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler

BLOCK = 32


class Cropped(Dataset):
    """Byte "images" of 40 pixels, each fetch a random 33-pixel crop (its offset drawn from
    torch's generator), flipped half the time (torch) and one pixel replaced (Python's
    `random`): as a torchvision RandomCrop + RandomHorizontalFlip pipeline draws them."""

    def __init__(self, n: int = 48, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 256, (n, BLOCK + 8), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        top = int(torch.randint(0, 8, ()))
        x = self.x[i, top : top + BLOCK + 1].clone()
        if float(torch.rand(())) < 0.5:
            x = x.flip(0)
        x[random.randrange(len(x))] = random.randrange(256)
        return {"input_ids": x[:-1], "targets": x[1:]}


class Plain(Cropped):
    """The same pixels, uncropped: fetching draws no random numbers."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.x[i, : BLOCK + 1]
        return {"input_ids": x[:-1], "targets": x[1:]}


class NoisyStream(IterableDataset):
    """A stream with state (samples 0, 1, 2, ... of `Cropped`'s pixels), each sample cropped
    and flipped as `Cropped` does: the draws happen in the loader's workers."""

    def __init__(self, n: int = 48) -> None:
        self.pixels = Cropped(n)
        self.position = self._start = 0

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        start, self._start = self._start, 0
        for i in range(start, len(self.pixels)):
            self.position = i + 1
            yield self.pixels[i]

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = self.position = state["position"]


class SkipBatches(BatchSampler):
    """Batches in order, the first `skip` of them left out (indices only: nothing fetched)."""

    skip = 0

    def __iter__(self) -> Iterator[list[int]]:
        return islice(super().__iter__(), self.skip, None)


class Counting(DataLoader):
    """A DataLoader with a state of its own (not torchdata's): the batches it yielded, which
    a restored one skips by index. It restores the order, not what its workers drew."""

    def __init__(self, data: Dataset, workers: int) -> None:
        order = SkipBatches(SequentialSampler(data), 4, drop_last=True)
        generator = torch.Generator().manual_seed(1)
        super().__init__(data, batch_sampler=order, num_workers=workers, generator=generator)
        self.yielded = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        order: SkipBatches = self.batch_sampler  # type: ignore[assignment]
        self.yielded = order.skip
        batches = super().__iter__()  # reads the order (twice, with workers)
        order.skip = 0
        for batch in batches:
            self.yielded += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.batch_sampler.skip = state["yielded"]  # type: ignore[union-attr]
