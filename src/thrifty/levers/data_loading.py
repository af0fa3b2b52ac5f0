"""Data loading: a resumable, per-epoch seeded sampler; a DataLoader with the settings that keep
an accelerator fed; and `num_workers = auto`, chosen by measuring batch fetch time.

Two things make a run with loader workers stop and resume as exactly as one without:

- Stop signals. Schedulers (Slurm, systemd, Kubernetes) send SIGTERM to the whole process group,
  workers included. A worker killed by it makes PyTorch raise a RuntimeError in the main process
  (from its SIGCHLD handler, at any point of the step) before the emergency checkpoint is saved.
  So workers ignore the signals the main process handles: they start with them blocked and
  ignore them before unblocking, so none is lost in between. A worker that dies of one anyway
  (a start method other than fork) is logged, not raised, since the main process got the same
  signal and saves; and a loader that fails mid-window ends the windows (`TrainBatches`), so the
  training loop saves its last complete step.
- Random augmentation. Which worker fetches which batch depends on where the iterator started,
  and each worker's random state on its id. So every batch is fetched with torch's, Python's and
  NumPy's generators seeded from (seed, epoch, position in the epoch): a batch draws the same
  numbers with 0 or 8 workers, resumed or not.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from thrifty.errors import ConfigError

log = logging.getLogger("thrifty.levers.data_loading")


# The signals a scheduler stops a job with; the main process turns them into a checkpoint.
STOP_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1") if hasattr(signal, name)
)


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


# --- stop signals and loader workers ------------------------------------------------------------


def check_stop_signals(signals: Sequence[int]) -> tuple[int, ...]:
    """`signals` as a tuple, or a ConfigError naming one a worker cannot ignore."""
    catchable = signal.valid_signals() - {signal.SIGKILL, getattr(signal, "SIGSTOP", -1)}
    for signum in signals:
        if signum not in catchable:
            raise ConfigError(
                f"stop signal {_signal_name(signum)} cannot be ignored by data-loader workers: "
                "give signal numbers such as signal.SIGTERM (SIGKILL and SIGSTOP cannot be caught)"
            )
    return tuple(signals)


def _signal_name(signum: Any) -> str:
    """`SIGTERM (15)` for a signal number, else the value as given (it may be anything)."""
    try:
        return f"{signal.Signals(signum).name} ({int(signum)})"
    except (TypeError, ValueError):
        return repr(signum)


class IgnoreStopSignals:
    """A `worker_init_fn`: the worker ignores `signals`, then runs `then(worker_id)` if given.

    The loader blocks the signals while it starts workers (a fork keeps the mask), so one that
    arrives before this runs waits, and is discarded once ignored. A class, not a closure, so it
    pickles for the spawn and forkserver start methods.
    """

    def __init__(
        self, signals: Sequence[int] = STOP_SIGNALS, then: Callable[[int], None] | None = None
    ) -> None:
        self.signals = tuple(signals)
        self.then = then

    def __call__(self, worker_id: int) -> None:
        for signum in self.signals:
            signal.signal(signum, signal.SIG_IGN)
        if self.signals and hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)
        if self.then is not None:
            self.then(worker_id)


@contextlib.contextmanager
def _blocked(signals: tuple[int, ...]) -> Iterator[None]:
    """Block `signals` in this thread: workers forked meanwhile start with them blocked. One
    sent to the process meanwhile goes to another thread, or waits here until unblocked."""
    if not signals or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


_tolerated: set[int] = set()  # stop signals a worker may die of without failing the run


def _killed_by_stop_signal(exc: RuntimeError) -> bool:
    # PyTorch's message: "DataLoader worker (pid N) is killed by signal: <strsignal>."
    text = str(exc)
    return any(f"killed by signal: {signal.strsignal(s)}." in text for s in _tolerated)


def _tolerate_stopped_workers(signals: tuple[int, ...]) -> None:
    """Wrap PyTorch's SIGCHLD handler (installed when the first workers start) so a worker
    killed by a stop signal is logged instead of raising into the step: the main process got
    the same signal and is on its way to the emergency checkpoint."""
    _tolerated.update(signals)
    if threading.current_thread() is not threading.main_thread():
        return  # PyTorch installs no handler off the main thread either
    current = signal.getsignal(signal.SIGCHLD)
    if not callable(current) or getattr(current, "thrifty_tolerant", False):
        return

    def on_child(signum: int, frame: Any) -> None:
        try:
            current(signum, frame)
        except RuntimeError as exc:
            if not _killed_by_stop_signal(exc):
                raise
            log.warning("%s The run goes on to save its checkpoint.", str(exc).strip())

    # Marked so a second call sees its own wrapper and does not wrap it again (a function
    # attribute, which mypy does not know).
    on_child.thrifty_tolerant = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, on_child)


# Iterators whose workers ignore the stop signals. multiprocessing's exit hook stops daemon
# children with SIGTERM and then waits for them: a worker that ignores SIGTERM would make the
# interpreter wait forever, so these are shut down (or killed) first.
# The worker processes are held strongly: an iterator collected while a worker would not stop
# (torch's shutdown then sends the SIGTERM it ignores) must not leave it behind.
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_WORKERS: list[Any] = []
_EXIT_HOOK: list[bool] = []


def _kill(workers: list[Any]) -> None:
    for worker in workers:
        with contextlib.suppress(Exception):
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5)


def close_workers(iterators: Any = None) -> None:
    """Shut down the workers of live loader iterators (all of them by default): the graceful
    way first, then SIGKILL for a worker still alive (it ignores SIGTERM by design). With no
    argument (at the interpreter's exit), every worker ever started is checked."""
    for batches in list(_LIVE if iterators is None else iterators):
        workers = list(getattr(batches, "_workers", []))
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):
                shutdown()
        _kill(workers)
        _LIVE.discard(batches)
    if iterators is None:
        _kill(_WORKERS)


def _track(batches: Any) -> None:
    """Remember an iterator's workers: killed if still alive once it is collected (after
    torch's own shutdown) or at the interpreter's exit."""
    workers = list(getattr(batches, "_workers", []))
    _WORKERS[:] = [w for w in _WORKERS if w.is_alive()] + workers
    _LIVE.add(batches)
    weakref.finalize(batches, _kill, workers)
    if not _EXIT_HOOK:  # registered after multiprocessing's: runs before it
        atexit.register(close_workers)
        _EXIT_HOOK.append(True)


class _Loader(DataLoader):
    """A DataLoader that starts its workers with `stop_signals` blocked and tolerates a worker
    that dies of one (see the module docstring)."""

    stop_signals: tuple[int, ...] = ()

    def __iter__(self) -> Any:
        if self.num_workers == 0:
            return super().__iter__()
        with _blocked(self.stop_signals):
            batches = super().__iter__()  # starts the workers (once, when persistent)
        _tolerate_stopped_workers(self.stop_signals)
        if self.stop_signals and batches not in _LIVE:
            _track(batches)
            self.__dict__.setdefault("_own", weakref.WeakSet()).add(batches)
        return batches

    def close(self) -> None:
        """Stop this loader's workers now (the persistent ones too)."""
        close_workers(list(self.__dict__.get("_own", ())))
        self._iterator = None


# --- the loader ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderSettings:
    """The DataLoader arguments that matter for throughput."""

    batch_size: int
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int = 2
    persistent_workers: bool = True


def resolve_pin_memory(setting: bool | str, device_type: str, num_workers: int) -> bool:
    """`data.pin_memory` as a bool. "auto" pins only on CUDA and only with workers: the loader's
    pin thread then pins off the training loop's path, while with 0 workers the loop itself would
    pin each batch, often slower than the plain copy it speeds up. True or false stays as given."""
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ConfigError(f'data.pin_memory must be true, false or "auto", got {setting!r}')
    return device_type == "cuda" and num_workers > 0


def build_loader(
    dataset: Dataset,
    sampler: Sampler[int],
    settings: LoaderSettings,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    seed: int = 0,
    *,
    worker_init_fn: Callable[[int], None] | None = None,
    stop_signals: Sequence[int] = STOP_SIGNALS,
) -> DataLoader:
    """A DataLoader that drops the last partial batch (every step has the same shape).

    It gets its own generator so creating an iterator never draws from the global RNG (which
    would shift dropout masks and break exact resume). With an `EpochSampler`, each batch's
    random draws are seeded from (sampler seed, epoch, position): see `SeededSamples`. Workers
    ignore `stop_signals` (the main process handles them), then run `worker_init_fn`.
    """
    signals = check_stop_signals(stop_signals)
    workers = settings.num_workers
    order: Sampler[Any] = sampler
    if isinstance(sampler, EpochSampler) and not draws_no_random_numbers(dataset):
        dataset = SeededSamples(dataset, sampler.seed)
        order = _Keys(sampler)
    loader = _Loader(
        dataset,
        batch_size=settings.batch_size,
        sampler=order,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=settings.pin_memory,
        drop_last=True,
        persistent_workers=settings.persistent_workers and workers > 0,
        prefetch_factor=settings.prefetch_factor if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=IgnoreStopSignals(signals, worker_init_fn),
    )
    loader.stop_signals = signals
    return loader


# --- num_workers = auto -------------------------------------------------------------------------


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_world_size() -> int:
    """The processes of this job on this node: torchrun's LOCAL_WORLD_SIZE, 1 without it."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "1")
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(
            f"LOCAL_WORLD_SIZE must be a positive integer (the processes on this node), "
            f"got {text!r}: unset it or launch with torchrun, which sets it"
        )
    return int(text)


def cpus_per_rank() -> int:
    """This process's share of the CPUs for loader workers. The ranks on a node usually may
    all use all of its CPUs, so each measuring up to all of them would start ranks × CPUs
    workers: the CPUs are divided among the node's ranks (at least 1 each)."""
    return max(1, available_cpus() // local_world_size())


def worker_candidates(cpus: int | None = None, limit: int = 8) -> list[int]:
    """0, 1, 2, 4, ... up to `cpus` (by default `cpus_per_rank()`), and at most `limit`."""
    cpus = min(cpus or cpus_per_rank(), limit)
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
    length = len(cast(Sized, dataset))  # map-style: torch's Dataset type omits __len__
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


# (dataset, settings, collate_fn) -> seconds per batch
FetchTimer = Callable[[Dataset, LoaderSettings, Callable[[list[Any]], Any] | None], float]


def choose_num_workers(
    dataset: Dataset,
    settings: LoaderSettings,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    candidates: Sequence[int] | None = None,
    tolerance: float = 0.10,
    measure: FetchTimer = measure_fetch_time,
) -> WorkerChoice:
    """Measure each candidate worker count and choose the fewest workers within `tolerance`
    of the fastest: more workers cost memory and CPU the training step may need. `measure`
    returns seconds per batch for one setting (`measure_fetch_time` unless given)."""
    measured: dict[int, float] = {}
    for n in candidates if candidates is not None else worker_candidates():
        trial = LoaderSettings(settings.batch_size, n, False, settings.prefetch_factor, False)
        measured[n] = measure(dataset, trial, collate_fn)
    best = min(measured.values())
    chosen = min(n for n, s in measured.items() if s <= best * (1 + tolerance))
    return WorkerChoice(chosen, measured)
