"""Where the training batches come from, in the four shapes thrifty accepts, and how each one
resumes after a kill.

- A map-style Dataset: thrifty's order (a permutation of (seed, epoch), each rank its share).
  The position, (epoch, micro-batches consumed), is the whole resume state: exact.
- A map-style Dataset with your `sampler` or `batch_sampler`: thrifty's loader over your order,
  rank r of W taking every W-th index (or batch) unless the sampler shards itself (it has
  `num_replicas`, as DistributedSampler). A checkpoint holds the sampler's state as its epoch
  began (its `state_dict`, or its torch generator's state) and the resume skips what was
  consumed, reading indices only: exact wherever the order follows from that state and the
  epoch. The state is taken as the epoch begins because a loader reads its sampler ahead.
- An IterableDataset (a stream): sample i of the stream goes to shard i mod (ranks x workers),
  so no sample is seen twice in a pass; a Hugging Face `datasets` stream is split by its own
  `split_dataset_by_node`, which hands whole files to ranks and workers. It resumes exactly
  from the loader's state (torchdata's StatefulDataLoader, which knows what each worker had
  yielded) when the stream has `state_dict`, or from the stream's own state with no workers.
  Otherwise a resumed run restarts the stream, and the run says so as it starts.
- A DataLoader: used as is. Resumed from its `state_dict` when it has one (StatefulDataLoader);
  otherwise its epoch restarts, said once as the run starts.

Where samples draw random numbers in a StatefulDataLoader's workers, each worker's generators
are kept with its state (`thrifty.data.worker_rng`).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

from thrifty.data.kinds import (
    is_hf_stream,
    is_stream,
    length,
    stateful,
    stateful_loader_class,
)
from thrifty.data.loading import IgnoreStopSignals, LoaderSettings, check_stop_signals
from thrifty.data.restore import resume_from
from thrifty.data.worker_rng import keep_worker_rng, random_line
from thrifty.errors import ConfigError, ThriftyError

log = logging.getLogger("thrifty")

Collate = Callable[[list[Any]], Any] | None


class Source:
    """One shape of training data: its loader, how a pass begins (and resumes), its state."""

    loader: Any
    batches_per_pass: int | None = None  # this rank's micro-batches in a pass; None: unknown
    exact: bool = True  # a resumed run sees exactly the batches it would have seen
    random_note: str | None = None  # why its workers' random draws will not resume, if so
    changing_state: bool = False  # the state moves with every batch (read after each window)

    def begin(self, epoch: int, consumed: int) -> Iterator[Any]:
        """Micro-batches of pass `epoch`, `consumed` of them already trained on."""
        raise NotImplementedError

    def state_dict(self) -> Any:
        """What a checkpoint holds beyond the position (None: nothing)."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """The checkpoint's state, applied when the next pass begins."""


def _set_epoch(obj: Any, epoch: int) -> None:
    set_epoch = getattr(obj, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)


class MapSource(Source):
    """A map-style dataset in thrifty's order: the position is the whole resume state."""

    def __init__(self, loader: DataLoader, sampler: Any, micro: int) -> None:
        self.loader, self.sampler, self.micro = loader, sampler, micro
        self.batches_per_pass = len(sampler) // micro

    def begin(self, epoch: int, consumed: int) -> Iterator[Any]:
        self.sampler.set_epoch(epoch, consumed * self.micro)
        return iter(self.loader)


# --- your sampler or batch sampler --------------------------------------------------------------


class _RankView(Sampler[Any]):
    """This rank's share of `order` (every W-th item, equal shares where the length is known),
    from item `skip` on. A sampler that shards itself is taken whole."""

    def __init__(self, order: Any, rank: int, world: int) -> None:
        self.order = order
        self.whole = world == 1 or getattr(order, "num_replicas", None) == world
        self.rank, self.world = rank, world
        self.skip = 0

    def share(self) -> int | None:
        """Items a pass holds for this rank; None when the sampler has no length."""
        n = length(self.order)
        return None if n is None else (n if self.whole else n // self.world)

    def __iter__(self) -> Iterator[Any]:
        items: Iterator[Any] = iter(self.order)
        if not self.whole:
            share = self.share()
            stop = None if share is None else share * self.world
            items = islice(items, self.rank, stop, self.world)
        return islice(items, self.skip, None)

    def __len__(self) -> int:
        share = self.share()
        if share is None:
            raise TypeError("the sampler has no length")
        return max(share - self.skip, 0)


def _order_state(order: Any) -> Any:
    """The sampler's state: its own, or its torch generator's (RandomSampler, Weighted...)."""
    if stateful(order):
        return {"sampler": order.state_dict()}
    generator = getattr(order, "generator", None)
    if isinstance(generator, torch.Generator):
        return {"generator": generator.get_state()}
    return None


def _restore_order(order: Any, state: Any) -> None:
    if state is None:
        return
    if "sampler" in state:
        order.load_state_dict(state["sampler"])
    else:
        order.generator.set_state(state["generator"])


class OrderSource(Source):
    """A map-style dataset in your order: `sampler` (indices) or `batch_sampler` (batches)."""

    def __init__(
        self,
        data: Dataset,
        order: Any,
        *,
        batched: bool,
        micro: int,
        rank: int,
        world: int,
        build: Callable[..., DataLoader],
    ) -> None:
        self.order, self.batched, self.micro = order, batched, micro
        self.view = _RankView(order, rank, world)
        self.loader = (
            build(data, batch_sampler=self.view)
            if batched
            else build(data, sampler=self.view, batch_size=micro, drop_last=True)
        )
        share = self.view.share()
        self.batches_per_pass = None if share is None else share if batched else share // micro
        self.exact = _order_state(order) is not None or not _draws_randomly(order)
        self._state: Any = None
        self._restored: Any = None

    def begin(self, epoch: int, consumed: int) -> Iterator[Any]:
        _set_epoch(self.order, epoch)
        if self._restored is not None:
            _restore_order(self.order, self._restored)
            self._restored = None
        self._state = _order_state(self.order)  # before the loader reads ahead
        self.view.skip = consumed if self.batched else consumed * self.micro
        return iter(self.loader)

    def state_dict(self) -> Any:
        return self._state

    def load_state_dict(self, state: Any) -> None:
        self._restored = state


def _draws_randomly(order: Any) -> bool:
    """Whether the order may differ between two runs at the same epoch: not a fixed sequence,
    nor a DistributedSampler (its order follows from its seed and epoch)."""
    from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

    if isinstance(order, BatchSampler):
        order = order.sampler
    fixed = (SequentialSampler, DistributedSampler, range, list, tuple)
    return not isinstance(order, fixed)


# --- a stream ------------------------------------------------------------------------------------


class _Shard(IterableDataset):
    """Sample i of `stream` for shard i mod (ranks x workers). Its state is the stream's
    (taken right after one of this shard's samples) and whether one was taken: a restored
    shard's next sample is then `ranks x workers` on, not its first."""

    def __init__(self, stream: Any, rank: int, world: int) -> None:
        self.stream, self.rank, self.world = stream, rank, world
        self._taken = False  # this pass has handed out one of the shard's samples
        self._resume_taken = False  # ... as had the pass a restored state came from

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        total = self.world * workers
        first = total - 1 if self._resume_taken else self.rank * workers + worker
        self._taken, self._resume_taken = self._resume_taken, False
        for sample in islice(iter(self.stream), first, None, total):
            self._taken = True
            yield sample

    def set_epoch(self, epoch: int) -> None:
        _set_epoch(self.stream, epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict(), "taken": self._taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state["stream"])
        self._resume_taken = state["taken"]


def _split(data: Any, rank: int, world: int) -> Any:
    """This rank's part of the stream, still to be split among the loader's workers."""
    if is_hf_stream(data):
        if world == 1:
            return data  # it splits its files among the workers itself
        from datasets.distributed import split_dataset_by_node

        return split_dataset_by_node(data, rank=rank, world_size=world)
    return _Shard(data, rank, world)


class StreamSource(Source):
    """An IterableDataset, split across ranks and workers; passes end when it does."""

    changing_state = True

    def __init__(
        self,
        data: Any,
        *,
        micro: int,
        rank: int,
        world: int,
        workers: int,
        build: Callable[..., DataLoader],
    ) -> None:
        self.stream = _split(data, rank, world)
        self.what = f"train_data ({type(data).__name__})"
        n = length(data)
        self.batches_per_pass = None if n is None else n // world // micro
        stateful_stream = stateful(data)
        loader_class = stateful_loader_class() if stateful_stream else None
        # Workers start afresh each pass: a persistent worker's copy of the stream would
        # keep the last pass's position.
        self.loader = build(
            self.stream,
            batch_size=micro,
            drop_last=True,
            loader_class=loader_class,
            persistent_workers=False,
        )
        self.own_state = loader_class is None and stateful_stream and workers == 0
        self.exact = loader_class is not None or self.own_state
        if loader_class is not None and workers > 0:
            self.random_note = keep_worker_rng(self.loader)
        self.why_not = (
            "it has no state_dict/load_state_dict (a Hugging Face IterableDataset has them)"
            if not stateful_stream
            else "its state lives in the loader's workers: pip install 'thrifty[data]' "
            "(torchdata's StatefulDataLoader), or set data.num_workers = 0"
        )
        self._restored: Any = None

    def begin(self, epoch: int, consumed: int) -> Iterator[Any]:
        _set_epoch(self.stream, epoch)
        restored, self._restored = self._restored, None
        if restored is None:
            return iter(self.loader)
        target = self.stream if self.own_state else self.loader
        return resume_from(self.loader, target, restored, self.what)

    def state_dict(self) -> Any:
        if not self.exact:
            return None
        state = self.stream.state_dict() if self.own_state else self.loader.state_dict()
        return _loader_state(self.loader, state)

    def load_state_dict(self, state: Any) -> None:
        self._restored = _same_workers(state, self.loader, "data.num_workers = {n}")


# --- your DataLoader -----------------------------------------------------------------------------


class LoaderSource(Source):
    """Your DataLoader, used as is."""

    changing_state = True

    def __init__(self, loader: DataLoader, micro: int) -> None:
        self.loader = loader
        n = length(loader)
        self.batches_per_pass = n
        self.exact = stateful(loader)
        if self.exact and loader.num_workers > 0:
            self.random_note = keep_worker_rng(loader)
        self._restored: Any = None

    def begin(self, epoch: int, consumed: int) -> Iterator[Any]:
        loader = self.loader
        for part in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
            _set_epoch(part, epoch)  # a DistributedSampler reshuffles by epoch
        _set_epoch(loader.dataset, epoch)
        restored, self._restored = self._restored, None
        if restored is None:
            return iter(loader)
        what = f"train_data ({type(loader).__name__} over {type(loader.dataset).__name__})"
        return resume_from(loader, loader, restored, what)

    def state_dict(self) -> Any:
        if not self.exact:
            return None
        return _loader_state(self.loader, self.loader.state_dict())

    def load_state_dict(self, state: Any) -> None:
        if state is not None and self.exact:
            self._restored = _same_workers(state, self.loader, "num_workers={n} in your DataLoader")


def _loader_state(loader: Any, state: Any) -> dict[str, Any]:
    """What a checkpoint holds of a loader: its state, its worker count, and its generator (it
    draws the next pass's order and worker seeds; a loader's state_dict leaves it out)."""
    generator = getattr(loader, "generator", None)
    saved = {"num_workers": loader.num_workers, "state": state}
    if isinstance(generator, torch.Generator):
        saved["generator"] = generator.get_state()
    return saved


def _same_workers(saved: dict[str, Any], loader: Any, fix: str) -> Any:
    """The saved loader state, refused in one line when another worker count wrote it: each
    worker held part of the position, and a stream split another way cannot continue it."""
    n = saved["num_workers"]
    if n != loader.num_workers:
        raise ConfigError(
            f"the checkpoint's data position was saved by a loader with {n} worker(s) and this "
            f"one has {loader.num_workers}: each worker holds part of the stream's position; "
            f"resume with {fix.format(n=n)}"
        )
    return saved


# --- the checks, and samples to count FLOPs and size micro-batches with ------------------------


def check_loader(loader: DataLoader, micro: int) -> None:
    """A DataLoader given must batch `batch.micro` samples."""
    size = loader.batch_size
    if size is None:
        size = getattr(loader.batch_sampler, "batch_size", None)
    if size is not None and size != micro:
        raise ConfigError(
            f"train_data is a DataLoader with batch_size {size} and batch.micro = {micro}: set "
            f"batch.micro = {size}, or build the DataLoader with batch_size={micro}"
        )


def first_samples(data: Any, n: int) -> list[Any]:
    """The first `n` samples, read from a fresh iterator where the data is a stream or a
    DataLoader's stream (the training's own iterator is not touched)."""
    if isinstance(data, DataLoader):
        data = data.dataset
    if is_stream(data):
        samples = list(islice(iter(data), n))
        if len(samples) < n:
            raise ThriftyError(
                f"train_data yielded {len(samples)} samples, fewer than one micro-batch ({n}): "
                "check the stream's source, or set batch.micro lower"
            )
        return samples
    return [data[i] for i in range(n)]


def loader_builder(
    settings: LoaderSettings, collate_fn: Collate, seed: int, stop_signals: Any
) -> Callable[..., DataLoader]:
    """A function building a DataLoader with the run's settings (workers, pinning, prefetch,
    a seeded generator, workers that leave the stop signals to the main process)."""
    from thrifty.data.loading import _Loader

    signals = check_stop_signals(stop_signals)
    workers = settings.num_workers

    def build(
        data: Any,
        *,
        loader_class: type | None = None,
        persistent_workers: bool = settings.persistent_workers,
        **order: Any,
    ) -> DataLoader:
        with warnings.catch_warnings():  # torchdata calls a torch function torch deprecated
            warnings.filterwarnings("ignore", message=".*set_vital.*")
            return _build(data, loader_class, persistent_workers, order)

    def _build(
        data: Any, loader_class: type | None, persistent_workers: bool, order: dict[str, Any]
    ) -> DataLoader:
        loader = (loader_class or _Loader)(
            data,
            num_workers=workers,
            collate_fn=collate_fn,
            pin_memory=settings.pin_memory,
            persistent_workers=persistent_workers and workers > 0,
            prefetch_factor=settings.prefetch_factor if workers > 0 else None,
            generator=torch.Generator().manual_seed(seed),
            worker_init_fn=IgnoreStopSignals(signals, None),
            **order,
        )
        if isinstance(loader, _Loader):
            loader.stop_signals = signals
        return loader

    return build


def describe(source: Source) -> str | None:
    """The line said as a run starts when a resume would not be exact, or None."""
    if source.exact:
        return (
            None if source.random_note is None else random_line(source.loader, source.random_note)
        )
    if isinstance(source, StreamSource):
        return (
            f"train_data is a stream whose position cannot be saved ({source.why_not}): a "
            "resumed run restarts the stream from its start"
        )
    if isinstance(source, LoaderSource):
        return (
            "train_data is a DataLoader without state_dict: a resumed run restarts its epoch "
            "from the start; torchdata's StatefulDataLoader resumes where it was"
        )
    return (
        "the sampler has no state_dict and no torch generator, so its state cannot be saved: a "
        "resume skips the samples consumed, which is exact only if its order follows from its "
        "epoch (set_epoch)"
    )
