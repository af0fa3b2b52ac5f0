"""Data loading: a resumable, per-epoch seeded sampler; a DataLoader with the settings that keep
an accelerator fed; and `num_workers = auto`, chosen by measuring batch fetch time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class EpochSampler(Sampler[int]):
    """Indices of one epoch: a permutation seeded by (seed, epoch), this rank's share of it,
    starting `start` samples in, so a resumed run skips straight to where it was instead of
    replaying the epoch."""

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

    def _indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.length, generator=g).tolist()
        else:
            order = list(range(self.length))
        per_rank = self.length // self.world_size  # equal shares: no rank waits on another
        return order[self.rank : per_rank * self.world_size : self.world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices()[self.start :])

    def __len__(self) -> int:
        return self.length // self.world_size - self.start


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader arguments that matter for throughput."""

    batch_size: int
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int = 2
    persistent_workers: bool = True


def build_loader(
    dataset: Dataset,
    sampler: Sampler[int],
    settings: LoaderSettings,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    seed: int = 0,
) -> DataLoader:
    """A DataLoader that drops the last partial batch (every step has the same shape).

    It gets its own generator so creating an iterator never draws from the global RNG (which
    would shift dropout masks and break exact resume).
    """
    workers = settings.num_workers
    return DataLoader(
        dataset,
        batch_size=settings.batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=settings.pin_memory,
        drop_last=True,
        persistent_workers=settings.persistent_workers and workers > 0,
        prefetch_factor=settings.prefetch_factor if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
    )


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_candidates(cpus: int | None = None, limit: int = 8) -> list[int]:
    """0, 1, 2, 4, ... up to the CPUs this process may use (and at most `limit`)."""
    cpus = min(cpus or available_cpus(), limit)
    candidates = [0]
    n = 1
    while n <= cpus:
        candidates.append(n)
        n *= 2
    if candidates[-1] != cpus:
        candidates.append(cpus)
    return candidates


@dataclass(frozen=True)
class WorkerChoice:
    """The measured fetch time per batch for each worker count, and the count chosen."""

    num_workers: int
    seconds_per_batch: dict[int, float]

    def describe(self) -> str:
        measured = ", ".join(f"{n}: {s * 1e3:.1f} ms" for n, s in self.seconds_per_batch.items())
        return f"num_workers = {self.num_workers} (measured fetch time per batch — {measured})"


def measure_fetch_time(
    dataset: Dataset,
    settings: LoaderSettings,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    batches: int = 6,
    max_seconds: float = 2.0,
) -> float:
    """Seconds per batch once the loader runs steadily (worker start-up excluded)."""
    length = len(dataset)  # type: ignore[arg-type]
    need = (batches + settings.num_workers * settings.prefetch_factor + 2) * settings.batch_size
    indices = [i % length for i in range(need)]
    loader = DataLoader(
        dataset,
        batch_size=settings.batch_size,
        sampler=indices,
        num_workers=settings.num_workers,
        collate_fn=collate_fn,
        prefetch_factor=settings.prefetch_factor if settings.num_workers else None,
        generator=torch.Generator().manual_seed(0),
    )
    it = iter(loader)
    try:
        # Warm-up: one batch per worker, so start-up is not counted as fetch time.
        for _ in range(max(1, settings.num_workers)):
            next(it)
        start = time.perf_counter()
        done = 0
        for _ in range(batches):
            next(it)
            done += 1
            if time.perf_counter() - start > max_seconds:
                break
        return (time.perf_counter() - start) / done
    finally:
        del it  # shuts the workers down


def choose_num_workers(
    dataset: Dataset,
    settings: LoaderSettings,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    candidates: Sequence[int] | None = None,
    tolerance: float = 0.10,
) -> WorkerChoice:
    """Measure each candidate worker count and choose the fewest workers within `tolerance`
    of the fastest: more workers cost memory and CPU the training step may need."""
    measured: dict[int, float] = {}
    for n in candidates if candidates is not None else worker_candidates():
        trial = LoaderSettings(settings.batch_size, n, False, settings.prefetch_factor, False)
        measured[n] = measure_fetch_time(dataset, trial, collate_fn)
    best = min(measured.values())
    chosen = min(n for n, s in measured.items() if s <= best * (1 + tolerance))
    return WorkerChoice(chosen, measured)
