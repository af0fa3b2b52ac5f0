"""Which sample, in which order, drawing which random numbers: the per-epoch order of a
map-style dataset, computed on the fly from (seed, epoch) so no rank ever holds the epoch's
shuffle (a list of 240 M indices is about 9 GB), and the per-batch seeding that makes a batch
draw the same random numbers with 0 or 8 workers, resumed or not.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
from collections.abc import Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

# --- which sample, and the random numbers it draws ----------------------------------------------


# A sample to fetch: (dataset index, epoch, position in the epoch's order over all ranks). The
# position does not depend on the rank count. A plain tuple: it is pickled to a worker for every
# sample, and a NamedTuple pickles twenty times slower.
SampleKey = tuple[int, int, int]


_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    # splitmix64's finaliser: each input bit flips about half of the output bits.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The 64-bit seed of the sample at `position` (counted over all ranks) of epoch `epoch`."""
    return _mix(_mix(_mix(seed & _MASK64) ^ epoch) ^ position)


def seed_generators(seed: int) -> None:
    """Seed torch's CPU generator, `random` and (when imported) NumPy's global generator."""
    torch.default_generator.manual_seed(seed)  # torch.manual_seed would reseed CUDA too, slowly
    random.seed(seed)
    np = sys.modules.get("numpy")  # a dataset that uses NumPy has imported it
    if np is not None:
        np.random.seed(seed >> 32)  # the legacy generator takes 32 bits


_KEPT: list[bool] = []  # open `training_rng_kept` scopes of the main process


@contextlib.contextmanager
def training_rng_kept() -> Iterator[None]:
    """In the main process (0 workers), leave the training's random streams (dropout) as if
    no sample had been fetched; a worker's generators are its own. Fetches inside an open
    scope save and restore nothing themselves: the training loop opens one per accumulation
    window, so the states (NumPy's costs about 0.1 ms to save and restore) are copied once a
    step, not once a micro-batch."""
    if get_worker_info() is not None or _KEPT:
        yield
        return
    np = sys.modules.get("numpy")
    saved = (torch.default_generator.get_state(), random.getstate())
    saved_np = np.random.get_state() if np is not None else None
    _KEPT.append(True)
    try:
        yield
    finally:
        _KEPT.pop()
        torch.default_generator.set_state(saved[0])
        random.setstate(saved[1])
        if np is not None and saved_np is not None:
            np.random.set_state(saved_np)


def draws_no_random_numbers(dataset: Dataset) -> bool:
    """Whether fetching from `dataset` is known to draw no random numbers (a TensorDataset, or
    a Subset of one): its batches need no seeding and the training's streams no guard."""
    from torch.utils.data import Subset, TensorDataset

    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return type(dataset) is TensorDataset


class SeededSamples(Dataset):
    """`dataset`, fetched by `SampleKey` a batch at a time: each batch is fetched with the
    generators seeded by `sample_seed(seed, epoch, position)` of its first sample, so it draws
    the same numbers whichever worker fetches it and wherever its epoch resumed (a resumed epoch
    starts on a batch boundary). Once per batch, not per sample: reseeding costs about 15 µs.
    Plain indices pass through unseeded.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(cast(Sized, self.dataset))  # map-style: torch's Dataset type omits __len__

    def __getitem__(self, key: SampleKey | int) -> Any:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[SampleKey | int]) -> list[Any]:
        first = keys[0]
        indices = [k[0] if isinstance(k, tuple) else k for k in keys]
        with training_rng_kept():
            if isinstance(first, tuple):
                _, epoch, position = first
                seed_generators(sample_seed(self.seed, epoch, position))
            batched = getattr(self.dataset, "__getitems__", None)  # batched reads stay batched
            if batched is not None:
                return list(batched(indices))
            return [self.dataset[i] for i in indices]


# --- the epoch order ----------------------------------------------------------------------------

# The algorithm of the epoch order, recorded in checkpoints: a run resumed under another order
# would see other samples. Change the name whenever `epoch_order` changes its output.
SHUFFLE = "feistel-1"

_ROUNDS = 6  # Luby-Rackoff: 4 already make a pseudo-random permutation; 6 spread small n evenly
_BLOCK = 16384  # positions computed per batch of tensor operations (128 KB tensors)
_MASK32 = 0xFFFFFFFF


def _round_keys(seed: int, epoch: int) -> list[int]:
    """The Feistel round keys of epoch `epoch`, 32 bits each. Apart from every `sample_seed`:
    where that mixes in a position, this mixes in bit 63, which no position has."""
    base = _mix(_mix(_mix(seed & _MASK64) ^ epoch) ^ (1 << 63))
    return [_mix(base ^ r) & _MASK32 for r in range(_ROUNDS)]


def _feistel(x: torch.Tensor, a: int, b: int, keys: list[int]) -> torch.Tensor:
    """A bijection of [0, a × b) (a, b <= 2**31): Feistel rounds on x = left × b + right with
    modular addition, left in [0, a) and right in [0, b), the two ranges swapping each round.
    Every product stays below 2**63: int64 never overflows."""
    left, right = x // b, x % b
    for key in keys:
        h = ((right ^ key) * 0x21F0AAAD) & _MASK32  # a 32-bit hash of right (lowbias32's shape)
        h = ((h ^ (h >> 16)) * 0x735A2D97) & _MASK32
        s = left + ((h * a) >> 32)  # plus the hash scaled to [0, a)
        left, right = right, torch.where(s >= a, s - a, s)
        a, b = b, a
    return left * b + right


def epoch_order(positions: torch.Tensor, length: int, seed: int, epoch: int) -> torch.Tensor:
    """The dataset indices at `positions` (int64, each in [0, length)) of epoch `epoch`'s
    shuffled order of `length` samples (at most 2**62).

    The order is a keyed bijection computed on the fly, so a rank holds no permutation (a list
    of 240 M indices is about 9 GB) and starts anywhere in it for free. It is a Feistel network
    on [0, a × b), a = ceil(sqrt(length)), b = ceil(length / a), re-applied to a value until it
    falls below `length` (cycle-walking). The even-bit power of two a balanced network needs
    can hold up to 4 × `length` values, and so up to 4 passes a position on average; this
    domain holds fewer than `length` + a, so all but about 1 in sqrt(`length`) take one pass.
    """
    n = max(length, 1)
    a = math.isqrt(n - 1) + 1
    b = -(-n // a)
    keys = _round_keys(seed, epoch)
    out = _feistel(positions, a, b, keys)
    outside = out >= length
    while bool(outside.any()):
        out[outside] = _feistel(out[outside], a, b, keys)
        outside = out >= length
    return out


class EpochSampler(Sampler[int]):
    """Indices of one epoch: an order seeded by (seed, epoch) (`epoch_order`), this rank's
    share of it, starting `start` samples in, so a resumed run skips straight to where it was
    instead of replaying the epoch. Rank r gets positions r, r + W, r + 2W, ... of the order
    over its first (length // W) × W positions: equal shares, so no rank waits on another."""

    def __init__(
        self,
        length: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.length = length
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Iterate epoch `epoch` from this rank's sample `start` on."""
        self.epoch = epoch
        self.start = start

    def _blocks(self, epoch: int, start: int) -> Iterator[tuple[list[int], list[int]]]:
        """(indices, positions) of this rank's samples from `start` on, a block at a time."""
        per_rank = self.length // self.world_size
        for first in range(start, per_rank, _BLOCK):
            k = torch.arange(first, min(first + _BLOCK, per_rank), dtype=torch.int64)
            positions = self.rank + k * self.world_size
            indices = positions
            if self.shuffle:
                indices = epoch_order(positions, self.length, self.seed, epoch)
            yield indices.tolist(), positions.tolist()

    def __iter__(self) -> Iterator[int]:
        # The epoch and start are read now, as the iterator is made, not at its first sample.
        return (i for indices, _ in self._blocks(self.epoch, self.start) for i in indices)

    def keys(self) -> Iterator[SampleKey]:
        """The same samples as iterating, each with its epoch and position (what seeds it)."""
        epoch = self.epoch
        return (
            (i, epoch, p)
            for indices, positions in self._blocks(epoch, self.start)
            for i, p in zip(indices, positions, strict=True)
        )

    def __len__(self) -> int:
        return self.length // self.world_size - self.start


class _Keys(Sampler[SampleKey]):
    """An EpochSampler's keys, for a loader over `SeededSamples`."""

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[SampleKey]:
        return self.sampler.keys()

    def __len__(self) -> int:
        return len(self.sampler)
