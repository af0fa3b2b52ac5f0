"""The training batches: the train loader (its worker count measured or given), the sampler
that resumes mid-epoch, and accumulation windows of micro-batches from the saved position;
and the loader of an evaluation."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset

from thrifty.config import TrainConfig
from thrifty.errors import ConfigError
from thrifty.levers.data_loading import (
    EpochSampler,
    LoaderSettings,
    SeededSamples,
    WorkerChoice,
    build_loader,
    choose_num_workers,
    resolve_pin_memory,
    training_rng_kept,
)
from thrifty.run.preemption import parse_signals
from thrifty.run.state import TrainState

log = logging.getLogger("thrifty")


class TrainBatches:
    """This rank's training data as accumulation windows, epoch after epoch."""

    def __init__(
        self,
        data: Dataset,
        config: TrainConfig,
        device: torch.device,
        collate_fn: Callable[[list[Any]], Any] | None,
        *,
        micro: int,
        accumulation: int,
        rank: int,
        world_size: int,
    ) -> None:
        self.config = config
        self.device = device
        self.collate_fn = collate_fn
        self.micro = micro
        self.accumulation = accumulation
        self.world_size = world_size
        d = config.data
        n = len(cast(Sized, data))  # map-style: checked by thrifty.inputs.check_dataset
        self.worker_choice: WorkerChoice | None = None
        workers = d.num_workers
        if workers == "auto":
            self.worker_choice = choose_num_workers(data, self.settings(micro, 0), collate_fn)
            workers = self.worker_choice.num_workers
            log.info("data: %s", self.worker_choice.describe())
        self.sampler = EpochSampler(
            n, shuffle=d.shuffle, seed=config.run.seed, rank=rank, world_size=world_size
        )
        self.loader: DataLoader = build_loader(
            data,
            self.sampler,
            self.settings(micro, int(workers)),
            collate_fn,
            seed=config.run.seed,
            stop_signals=parse_signals(config.spot.signals),  # workers leave them to us
        )
        effective = micro * accumulation * world_size
        self.steps_per_epoch = n // effective
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"batch.effective = {effective} is invalid: the training set has "
                f"only {n} samples; use a smaller batch"
            )

    @property
    def num_workers(self) -> int:
        return self.loader.num_workers

    def settings(self, batch_size: int, num_workers: int) -> LoaderSettings:
        d = self.config.data
        pin = resolve_pin_memory(d.pin_memory, self.device.type, num_workers)
        return LoaderSettings(batch_size, num_workers, pin, d.prefetch_factor, d.persistent_workers)

    def windows(self, progress: TrainState) -> Iterator[list[Any]]:
        """Accumulation windows of micro-batches from `progress`'s position, which they move
        to the next epoch as each one ends (the step's own count is the caller's)."""
        max_epochs = self.config.run.max_epochs
        while max_epochs is None or progress.epoch < max_epochs:
            self.sampler.set_epoch(progress.epoch, progress.batch_in_epoch * self.micro)
            batches = iter(self.loader)
            for _ in range(self.steps_per_epoch - progress.batch_in_epoch // self.accumulation):
                with self._fetching():
                    window = [next(batches) for _ in range(self.accumulation)]
                yield window
            progress.epoch += 1
            progress.batch_in_epoch = 0

    def _fetching(self) -> contextlib.AbstractContextManager[Any]:
        """Around a window's fetch: with 0 workers and seeded batches, the training's random
        streams are kept once for the whole window rather than once a micro-batch."""
        if self.loader.num_workers == 0 and isinstance(self.loader.dataset, SeededSamples):
            return training_rng_kept()
        return contextlib.nullcontext()

    def eval_loader(self, data: Dataset, rank: int) -> DataLoader:
        """The validation set in order, this rank's share, no workers."""
        micro = self.config.eval.micro or self.micro
        sampler = EpochSampler(
            len(cast(Sized, data)), shuffle=False, rank=rank, world_size=self.world_size
        )
        return build_loader(data, sampler, self.settings(micro, 0), self.collate_fn)

    def close(self) -> None:
        """Stop the workers: they ignore SIGTERM (the main process handles it), so they are
        stopped here rather than left to the interpreter's exit."""
        close = getattr(self.loader, "close", None)
        if close is not None:
            close()
