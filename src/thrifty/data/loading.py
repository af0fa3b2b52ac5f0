"""Data loading: a DataLoader with the settings that keep an accelerator fed, over the order and
seeding of `thrifty.data.sampling`; and `num_workers = auto`, chosen by measuring batch fetch
time.

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
  and each worker's random state on its id. So every batch is fetched with its generators seeded
  from (seed, epoch, position in the epoch): see `thrifty.data.sampling`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from thrifty.data.sampling import (
    EpochBatches,
    EpochSampler,
    SeededSamples,
    draws_no_random_numbers,
    training_rng_kept,
)
from thrifty.errors import ConfigError
from thrifty.strategies.device import available_cpus, local_world_size

log = logging.getLogger("thrifty.data.loading")


# The signals a scheduler stops a job with; the main process turns them into a checkpoint.
STOP_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1") if hasattr(signal, name)
)


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
    would shift dropout masks and break exact resume). With an `EpochSampler`, batches are
    sliced from its order (`EpochBatches`), and each batch's random draws are seeded from
    (sampler seed, epoch, position): see `SeededSamples`. Workers ignore `stop_signals` (the
    main process handles them), then run `worker_init_fn`.
    """
    signals = check_stop_signals(stop_signals)
    workers = settings.num_workers
    order: dict[str, Any] = {
        "batch_size": settings.batch_size,
        "sampler": sampler,
        "drop_last": True,
    }
    if isinstance(sampler, EpochSampler):
        order = {"batch_sampler": EpochBatches(sampler, settings.batch_size)}
        if not draws_no_random_numbers(dataset):
            dataset = SeededSamples(dataset, sampler.seed)
    loader = _Loader(
        dataset,
        **order,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=settings.pin_memory,
        persistent_workers=settings.persistent_workers and workers > 0,
        prefetch_factor=settings.prefetch_factor if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=IgnoreStopSignals(signals, worker_init_fn),
    )
    if "batch_sampler" in order:
        # EpochBatches drops the last partial batch; DataLoader takes no drop_last beside a
        # batch_sampler (and reads it only for iterable datasets): said for those who ask.
        object.__setattr__(loader, "drop_last", True)
    loader.stop_signals = signals
    return loader


# --- num_workers = auto -------------------------------------------------------------------------


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
        # Now, not in the iterator's __del__: a worker a stop signal to the group ended would
        # make torch's shutdown raise there, and print a traceback the run cannot catch.
        close_workers([it])
        del it


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
    # A trial with 0 workers fetches here, unseeded, as many batches as time allows: the
    # training's random streams must not depend on how fast that went.
    with training_rng_kept():
        for n in candidates if candidates is not None else worker_candidates():
            trial = LoaderSettings(settings.batch_size, n, False, settings.prefetch_factor, False)
            measured[n] = measure(dataset, trial, collate_fn)
    best = min(measured.values())
    chosen = min(n for n, s in measured.items() if s <= best * (1 + tolerance))
    return WorkerChoice(chosen, measured)
