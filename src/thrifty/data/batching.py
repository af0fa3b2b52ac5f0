"""The training batches: the source (thrifty's order over a map-style dataset, your sampler, a
stream, or your DataLoader), its worker count measured or given, and accumulation windows of
micro-batches from the saved position; and the loader of an evaluation."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from thrifty.config import DataConfig, RunConfig
from thrifty.data.geometry import BatchGeometry
from thrifty.data.loading import (
    LoaderSettings,
    WorkerChoice,
    build_loader,
    choose_num_workers,
    close_workers,
    resolve_pin_memory,
)
from thrifty.data.sampling import EpochSampler, SeededSamples, training_rng_kept
from thrifty.data.sources import (
    LoaderSource,
    MapSource,
    OrderSource,
    Source,
    StreamSource,
    check_loader,
    describe,
    first_samples,
    is_stream,
    loader_builder,
)
from thrifty.errors import ConfigError, ThriftyError
from thrifty.levers.accumulation import count_tokens
from thrifty.records.state import TrainState
from thrifty.strategies.process_group import Distributed

log = logging.getLogger("thrifty")


def check_token_budget(
    data: Any, collate_fn: Callable[[list[Any]], Any] | None, max_tokens: int | None
) -> None:
    """Refuse run.max_tokens where the batches hold no token ids (`count_tokens` finds none in
    a batch of the first sample): the budget would never be reached. A sample that cannot be
    read or collated is left to the training, which names it."""
    if max_tokens is None:
        return
    collate = collate_fn or (data.collate_fn if isinstance(data, DataLoader) else default_collate)
    try:
        batch = collate(first_samples(data, 1))
    except Exception:
        return
    if count_tokens(batch) == 0:
        raise ConfigError(
            f"run.max_tokens = {max_tokens} counts tokens, but the batches hold no token ids "
            f"(an input_ids or loss_mask, or a 2-D int64 tensor; a batch holds {_kinds(batch)}): "
            "use run.max_steps, run.max_time or run.max_epochs"
        )


def _kinds(batch: Any) -> str:
    """A batch's tensors by dtype and shape: `float32 (1, 12), int64 (1,)`."""
    if isinstance(batch, torch.Tensor):
        return f"{str(batch.dtype).removeprefix('torch.')} {tuple(batch.shape)}"
    if isinstance(batch, Mapping):
        return ", ".join(f"{k}: {_kinds(v)}" for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        return ", ".join(_kinds(v) for v in batch)
    return type(batch).__name__


class TrainBatches:
    """This rank's training data as accumulation windows, pass after pass, in any of the
    shapes `thrifty.data.sources` describes; its state goes into every checkpoint."""

    def __init__(
        self,
        data: Any,
        geometry: BatchGeometry,
        device: torch.device,
        collate_fn: Callable[[list[Any]], Any] | None,
        *,
        loading: DataConfig,
        run: RunConfig,
        stop_signals: tuple[signal.Signals, ...],
        rank: int,
        sampler: Any = None,
        batch_sampler: Any = None,
    ) -> None:
        """`geometry` lays the windows out (micro-batches of `geometry.micro`, `accumulation` a
        window, this rank's share of `world_size`); `loading` builds the loader, `run` gives
        its seed and run.max_epochs; `stop_signals` are left by the workers to the main
        process. Ten parameters: the user's `sampler` or `batch_sampler` come as given."""
        self.loading, self.seed, self.max_epochs = loading, run.seed, run.max_epochs
        self.stop_signals = stop_signals
        self.device = device
        self.collate_fn = collate_fn
        self.micro = geometry.micro
        self.accumulation = geometry.accumulation
        self.world_size = geometry.world_size
        self.worker_choice: WorkerChoice | None = None
        self.error: str | None = None  # what the data raised, ending the run
        self.source = self._source(data, rank, sampler, batch_sampler)
        self._state: Any = None  # the source's state after the last window handed out
        line = describe(self.source)
        if line is not None:
            log.warning("data: %s", line)
        per_pass = self.source.batches_per_pass
        self.steps_per_epoch = None if per_pass is None else per_pass // self.accumulation
        if self.steps_per_epoch == 0:
            effective = geometry.effective
            raise ConfigError(
                f"batch.effective = {effective} is invalid: the training set has only "
                f"{per_pass} batches of {self.micro} on this rank; use a smaller batch"
                if not isinstance(self.source, MapSource)
                else f"batch.effective = {effective} is invalid: the training set has only "
                f"{len(cast(Sized, data))} samples; use a smaller batch"
            )
        if self.steps_per_epoch is None and self.max_epochs is not None:
            raise ConfigError(
                f"run.max_epochs = {self.max_epochs} needs the data's length and "
                "train_data has none (a stream without __len__): set run.max_steps, "
                "run.max_tokens or run.max_time instead"
            )

    def _source(self, data: Any, rank: int, sampler: Any, batch_sampler: Any) -> Source:
        if isinstance(data, DataLoader):
            check_loader(data, self.micro)
            return LoaderSource(data, self.micro)
        d, world, seed = self.loading, self.world_size, self.seed
        stream = is_stream(data)
        workers = d.num_workers
        if workers == "auto" and stream:
            workers = 0
            log.info("data: num_workers = 0 for a stream (auto measures map-style datasets)")
        elif workers == "auto":
            self.worker_choice = choose_num_workers(
                data, self.settings(self.micro, 0), self.collate_fn
            )
            workers = self.worker_choice.num_workers
            log.info("data: %s", self.worker_choice.describe())
        settings = self.settings(self.micro, int(workers))
        signals = self.stop_signals  # workers leave them to us
        if stream:
            build = loader_builder(settings, self.collate_fn, seed, signals)
            return StreamSource(
                data, micro=self.micro, rank=rank, world=world, workers=int(workers), build=build
            )
        if sampler is not None or batch_sampler is not None:
            build = loader_builder(settings, self.collate_fn, seed, signals)
            order = batch_sampler if batch_sampler is not None else sampler
            return OrderSource(
                data,
                order,
                batched=batch_sampler is not None,
                micro=self.micro,
                rank=rank,
                world=world,
                build=build,
            )
        n = len(cast(Sized, data))  # map-style: checked by thrifty.run.inputs.check_dataset
        epochs = EpochSampler(n, shuffle=d.shuffle, seed=seed, rank=rank, world_size=world)
        loader = build_loader(
            data, epochs, settings, self.collate_fn, seed=seed, stop_signals=signals
        )
        return MapSource(loader, epochs, self.micro)

    @property
    def thrifty_shuffles(self) -> bool:
        """The order is thrifty's shuffle (`data_loading.SHUFFLE`)."""
        return isinstance(self.source, MapSource) and self.loading.shuffle

    @property
    def loader(self) -> Any:
        return self.source.loader

    @property
    def num_workers(self) -> int:
        return int(self.source.loader.num_workers)

    def settings(self, batch_size: int, num_workers: int) -> LoaderSettings:
        d = self.loading
        pin = resolve_pin_memory(d.pin_memory, self.device.type, num_workers)
        return LoaderSettings(batch_size, num_workers, pin, d.prefetch_factor, d.persistent_workers)

    def windows(self, progress: TrainState, dist: Distributed | None = None) -> Iterator[list[Any]]:
        """Accumulation windows of micro-batches from `progress`'s position, which they move
        to the next pass as each one ends (the step's own count is the caller's). With several
        processes, the ranks agree before each window: a pass ends for all when it ends for
        one, and an error on one stops them all (`error`), so none waits in a collective."""
        max_epochs = self.max_epochs
        while max_epochs is None or progress.epoch < max_epochs:
            source = self.source
            if progress.batch_in_epoch and source.changing_state and not source.exact:
                progress.batch_in_epoch = 0  # said as the run started: the pass restarts
            batches = self.source.begin(progress.epoch, progress.batch_in_epoch)
            known = self.steps_per_epoch
            left = None if known is None else known - progress.batch_in_epoch // self.accumulation
            handed = 0
            while left is None or handed < left:
                window = self._fetch(batches)
                if self._ended(window is None, dist) or window is None:
                    break
                if self.source.changing_state:
                    self._state = self.source.state_dict()
                handed += 1
                yield window
            if self.error is not None:
                return
            if handed == 0 and progress.batch_in_epoch == 0:
                raise ThriftyError(
                    f"train_data yielded no full window ({self.accumulation} micro-batches of "
                    f"{self.micro}) in a pass: check the data source, or use a smaller batch"
                )
            progress.epoch += 1
            progress.batch_in_epoch = 0

    def _fetch(self, batches: Iterator[Any]) -> list[Any] | None:
        """The next window; None at the end of the pass, or when the data raised (`error`)."""
        try:
            with self._fetching():
                return [next(batches) for _ in range(self.accumulation)]
        except StopIteration:
            return None
        except Exception as exc:
            self.error = self._describe(exc)
            try:
                log.error("the training data raised %s", self.error)
            except RuntimeError:  # torch's SIGCHLD handler raised the worker's loss mid-line
                log.error("the training data raised %s", self.error)
            return None

    def _describe(self, exc: Exception) -> str:
        """The error in one line. A worker that dies while the main process reads its batch
        (the kernel's out-of-memory killer, a SIGKILL) surfaces as a reset connection or an
        end of file on its queue, not as the loader's own message: that is named a loss."""
        text = str(exc).strip().splitlines()
        error = f"{type(exc).__name__}: {text[0] if text else 'no message'}"
        if self.source.loader.num_workers > 0 and isinstance(exc, (ConnectionError, EOFError)):
            return (
                f"a DataLoader worker was lost while its batch was read ({error}): a worker "
                "process died, often killed for memory; give data.num_workers fewer workers or "
                "the machine more memory"
            )
        return error

    def _ended(self, ended: bool, dist: Distributed | None) -> bool:
        if dist is None or not dist.enabled:
            return ended
        ends, errors = dist.sum_ints([int(ended), int(self.error is not None)])
        if errors and self.error is None:
            self.error = "an error on another rank (its log names it)"
        return ends > 0

    def _fetching(self) -> contextlib.AbstractContextManager[Any]:
        """Around a window's fetch: with 0 workers and seeded batches, the training's random
        streams are kept once for the whole window rather than once a micro-batch, and only
        those of the generators the dataset draws from (none: nothing is kept)."""
        loader = self.source.loader
        dataset = loader.dataset
        if loader.num_workers == 0 and isinstance(dataset, SeededSamples):
            drawn = dataset.draws_from()  # probed once, before the first window
            if drawn:
                return training_rng_kept(drawn)
        return contextlib.nullcontext()

    def state_dict(self) -> Any:
        """Where the data is beyond the position (epoch, micro-batches): None for thrifty's
        own order."""
        return self._state if self.source.changing_state else self.source.state_dict()

    def load_state_dict(self, state: Any) -> None:
        if state is not None:
            self.source.load_state_dict(state)
            self._state = state

    def eval_loader(self, data: Dataset, rank: int, micro: int) -> DataLoader:
        """The validation set in order, this rank's share in batches of `micro`, no workers."""
        sampler = EpochSampler(
            len(cast(Sized, data)), shuffle=False, rank=rank, world_size=self.world_size
        )
        return build_loader(data, sampler, self.settings(micro, 0), self.collate_fn)

    def close(self) -> None:
        """Stop the workers: they ignore SIGTERM (the main process handles it), so they are
        stopped here rather than left to the interpreter's exit."""
        loader = self.source.loader
        close = getattr(loader, "close", None)
        if close is not None:
            close()
            return
        # A loader thrifty did not build (a StatefulDataLoader, your DataLoader) keeps its live
        # iterator, and with it the workers, for as long as anything holds the loader.
        live = getattr(loader, "_iterator", None)
        if live is not None:
            close_workers([live])
            loader._iterator = None
