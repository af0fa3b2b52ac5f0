"""The micro-batch as a lever: the largest that fits on the device, measured (`batch.micro =
"auto"`), and a window split in halves when a step runs out of memory.

The effective batch never changes: the accumulation makes up for the micro-batch, so the
optimization is exactly the one configured. A size "fits" when a real forward, backward and
optimizer step at that size raise no out-of-memory error (CUDA's torch.OutOfMemoryError, or
the CPU allocator's RuntimeError: `is_out_of_memory`) and, on a GPU, peak below `1 - margin`
of the device's memory (the margin absorbs longer sequences and fragmentation).
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

log = logging.getLogger("thrifty")


@dataclass
class Trial:
    micro: int
    fits: bool
    peak_bytes: float | None = None  # the device's peak allocation (CUDA), else None


@dataclass
class MicroSearch:
    """What `find_micro` tried and chose; goes to the log and summary.json."""

    chosen: int
    margin: float
    tried: list[Trial] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "margin": self.margin,
            "tried": [asdict(t) for t in self.tried],
        }

    def describe(self) -> str:
        sizes = ", ".join(f"{t.micro} {'fits' if t.fits else 'does not fit'}" for t in self.tried)
        return f"micro-batch auto: {self.chosen} ({sizes}; {self.margin:.0%} of memory kept free)"


def candidates(per_rank: int) -> list[int]:
    """Sizes to try, ascending: 1, then doubling, each dividing the per-process batch (so the
    accumulation is a whole number), and the per-process batch itself."""
    sizes = [1]
    while sizes[-1] < per_rank:
        larger = [d for d in range(2 * sizes[-1], per_rank + 1) if per_rank % d == 0]
        sizes.append(larger[0] if larger else per_rank)
    return sizes


def find_micro(
    try_step: Callable[[int], None],
    per_rank: int,
    device: torch.device,
    margin: float,
    agree: Callable[[bool], bool] = lambda fits: fits,
    most: int | None = None,
) -> MicroSearch:
    """The largest candidate size whose step `try_step(micro)` fits, every rank agreeing
    (`agree(fits)` is True only when it fits on every rank), and at most `most` samples (all
    there are to try). Raises OutOfMemoryError when not even one sample fits."""
    search = MicroSearch(chosen=0, margin=margin)
    limit = _memory_limit(device, margin)
    error: str | None = None
    # Sizes dividing the per-process batch (the accumulation stays whole), even when fewer
    # samples than it are there to try: the largest of those is then the cap.
    for micro in [m for m in candidates(per_rank) if most is None or m <= most]:
        fits, peak, error = _fits(try_step, micro, device, limit)
        fits = agree(fits)
        search.tried.append(Trial(micro, fits, peak))
        if not fits:
            break
        search.chosen = micro
    if search.chosen == 0:
        raise torch.OutOfMemoryError(
            error
            or "a micro-batch of 1 does not fit" + _peak_words(search.tried[-1].peak_bytes, limit)
        )
    return search


# How the CPU allocator says an allocation failed: a plain RuntimeError (CUDA's allocator raises
# torch.OutOfMemoryError), "DefaultCPUAllocator: can't allocate memory: you tried to allocate N
# bytes" ("not enough memory" on Windows).
_CPU_OUT_OF_MEMORY = re.compile(r"DefaultCPUAllocator: (can't allocate memory|not enough memory)")
# The check's own words before the allocator's, which say nothing to a user.
_ENFORCE_PREFIX = re.compile(r"^\[enforce fail at [^\]]*\][^.]*\.\s*")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation that failed: a device's torch.OutOfMemoryError, or the
    CPU allocator's RuntimeError. Any other error is a bug to show, not a size to halve."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and bool(_CPU_OUT_OF_MEMORY.search(str(error)))


def _memory_limit(device: torch.device, margin: float) -> float | None:
    if device.type != "cuda":
        return None  # a CPU run fits until an allocation fails
    return (1 - margin) * torch.cuda.get_device_properties(device).total_memory


def _fits(
    try_step: Callable[[int], None], micro: int, device: torch.device, limit: float | None
) -> tuple[bool, float | None, str | None]:
    """Whether a step of `micro` samples fits, the peak it reached (CUDA) and the allocator's
    words when it ran out of memory."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    error = None
    try:
        try_step(micro)
    except RuntimeError as exc:
        if not is_out_of_memory(exc):
            raise
        error = str(exc)
    peak = float(torch.cuda.max_memory_allocated(device)) if cuda else None
    free_memory(device)
    fits = error is None and not (limit is not None and peak is not None and peak > limit)
    return fits, peak, error


def free_memory(device: torch.device) -> None:
    """Give the cached blocks a failed allocation left back, so the next attempt starts clean."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _peak_words(peak: float | None, limit: float | None) -> str:
    if peak is None:
        return ""
    room = f" of {limit / 2**30:.1f} GiB usable" if limit else ""
    return f" (peak {peak / 2**30:.1f} GiB{room})"


class Snapshot(AbstractContextManager["Snapshot"]):
    """Weights, optimizer state and random streams as they are on entry, restored on exit:
    the size search's steps leave no trace in the training."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model = model
        self.optimizer = optimizer

    def __enter__(self) -> Snapshot:
        self._tensors = [t.detach().to("cpu", copy=True) for t in self._state()]
        self._optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        self._rng = torch.random.fork_rng(devices=_devices(self.model))
        self._rng.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for tensor, saved in zip(self._state(), self._tensors, strict=True):
                tensor.copy_(saved)
        self.optimizer.state.clear()  # the moments the trial steps made
        self.optimizer.load_state_dict(self._optimizer_state)
        self._rng.__exit__(None, None, None)

    def _state(self) -> Iterator[torch.Tensor]:
        yield from self.model.parameters()
        yield from self.model.buffers()


def _devices(model: nn.Module) -> list[int]:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


def split_window(window: list[Any]) -> list[Any]:
    """Each micro-batch of `window` cut in two halves along the sample dimension: the same
    samples, in the same order, in twice as many micro-batches. Raises ValueError when a
    micro-batch holds a single sample."""
    halves: list[Any] = []
    for batch in window:
        size = _samples(batch)
        if size < 2:
            raise ValueError("a micro-batch of one sample cannot be split")
        cut = size // 2
        halves += [_part(batch, 0, cut), _part(batch, cut, size)]
    return halves


def first_sample(batch: Any) -> Any:
    """A micro-batch of `batch`'s first sample alone."""
    return _part(batch, 0, 1)


def _samples(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, Mapping):
        sizes = [_samples(v) for v in values if isinstance(v, (torch.Tensor, Mapping, list, tuple))]
        return max(sizes, default=1)
    return 1


def _part(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.dim() else batch
    if isinstance(batch, Mapping):
        return {k: _part(v, start, stop) for k, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_part(v, start, stop) for v in batch)
    if isinstance(batch, list):
        if batch and not isinstance(batch[0], (torch.Tensor, Mapping, list, tuple)):
            return batch[start:stop]  # a list of per-sample values (strings, ids)
        return [_part(v, start, stop) for v in batch]
    return batch


def out_of_memory_message(detail: str, device: torch.device) -> str:
    """The one line a run that cannot fit even one sample ends with: what happened, the peak,
    and what would help."""
    first = _ENFORCE_PREFIX.sub("", detail.strip().splitlines()[0]) if detail.strip() else ""
    first = first or "no detail"
    peak = ""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        used = torch.cuda.max_memory_allocated(device)
        peak = f"; peak {used / 2**30:.1f} GiB of {total / 2**30:.1f} GiB"
    return (
        f"out of memory at a micro-batch of 1 sample ({first}{peak}): the "
        "model does not fit on this device; turn on activation checkpointing "
        "(activation_checkpointing.policy = every_other or all), shard it over more GPUs "
        "(distributed.strategy = fsdp), use bf16, or train a smaller model"
    )


def scaled_count(per_sample: Any, micro: int) -> Any:
    """A FLOP count measured on one sample, for `micro` samples: the FLOPs and the activations
    grow with the batch, the operators dispatched do not."""
    from dataclasses import replace

    return replace(
        per_sample,
        flops=per_sample.flops * micro,
        activation_bytes=per_sample.activation_bytes * micro,
        block_bytes={name: held * micro for name, held in per_sample.block_bytes.items()},
        input_bytes={name: size * micro for name, size in per_sample.input_bytes.items()},
        head_bytes=per_sample.head_bytes * micro,
    )


def extended_count(low: Any, high: Any, samples: int, micro: int) -> Any:
    """The FLOP counts of `samples` and `samples + 1` samples (`low`, `high`), extended to
    `micro` samples along the line through both: every figure, the FLOPs, operators and each
    block's activations, exact also for what does not grow with the batch (a scalar loss, a
    product of weights). Counts of at least two samples: one takes other paths in some
    models (a squeezed batch dimension)."""
    from dataclasses import replace

    def line(at_low: float, at_high: float) -> float:
        return at_low + (micro - samples) * (at_high - at_low)

    def each(at_low: dict[str, int], at_high: dict[str, int]) -> dict[str, int]:
        names = sorted(at_low.keys() | at_high.keys())
        return {n: round(line(at_low.get(n, 0), at_high.get(n, 0))) for n in names}

    return replace(
        low,
        flops=line(low.flops, high.flops),
        ops=round(line(low.ops, high.ops)),
        activation_bytes=round(line(low.activation_bytes, high.activation_bytes)),
        block_bytes=each(low.block_bytes, high.block_bytes),
        input_bytes=each(low.input_bytes, high.input_bytes),
        head_bytes=round(line(low.head_bytes, high.head_bytes)),
    )


def cut_batch(batch: Any, samples: int, n: int) -> Any:
    """The first `n` samples of a collated micro-batch of `samples`, cut from it (each keeps
    the padded shape it has there), or None when a tensor of `batch` does not hold one row per
    sample (a cut along its first dimension would mangle it)."""
    if any(t.dim() and t.shape[0] != samples for t in _tensors(batch)):
        return None
    return _part(batch, 0, n)


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from _tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from _tensors(value)


def measure_micro(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data: Any,
    collate: Callable[[list[Any]], Any],
    call: Callable[[Any], torch.Tensor],
    *,
    device: torch.device,
    per_rank: int,
    margin: float,
    agree: Callable[[bool], bool],
    stream: bool = False,
) -> MicroSearch:
    """`batch.micro = "auto"`: the largest micro-batch whose real step (`call(batch)` gives
    the loss, then backward and the optimizer's step) fits on every rank. The trial steps
    leave no trace on `model`, `optimizer` or the random streams. `stream`: `data` is read by
    iterating, not indexing. A model that does not fit one sample raises ThriftyError saying
    what would help."""
    from thrifty.errors import ThriftyError
    from thrifty.levers.accumulation import to_device

    samples = _trial_samples(data, per_rank, stream)

    def step(micro: int) -> None:
        loss = call(to_device(collate(samples[:micro]), device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        with Snapshot(model, optimizer):
            search = find_micro(step, per_rank, device, margin, agree, most=len(samples))
    except torch.OutOfMemoryError as exc:
        raise ThriftyError(out_of_memory_message(str(exc), device)) from None
    log.info(search.describe())
    return search


def _trial_samples(data: Any, per_rank: int, stream: bool) -> Any:
    """What the trial steps are made of: the first samples of a stream, read once from a fresh
    iterator (the training's own is not touched), or the dataset itself, indexed lazily."""
    from itertools import islice

    from thrifty.errors import ThriftyError

    if not stream:
        return _Indexed(data, min(per_rank, len(data)))
    samples = list(islice(iter(data), per_rank))
    if not samples:
        raise ThriftyError("train_data yielded no sample: check the stream's source")
    return samples


class _Indexed:
    """The first `n` samples of a map-style dataset, read only when sliced."""

    def __init__(self, data: Any, n: int) -> None:
        self.data, self.n = data, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, part: slice) -> list[Any]:
        return [self.data[i] for i in range(*part.indices(self.n))]


class Halving:
    """The micro-batch after out-of-memory errors: each one halves it, for the window that
    hit it (replayed from its start) and every window after, the accumulation doubling."""

    def __init__(self, micro: int, device: torch.device) -> None:
        self.micro = micro  # as configured or measured
        self.device = device
        self.times = 0

    @property
    def now(self) -> int:
        return self.micro >> self.times

    def apply(self, window: list[Any]) -> list[Any]:
        """`window` cut as the earlier errors cut every window."""
        for _ in range(self.times):
            window = split_window(window)
        return window

    def halve(self, window: list[Any], error: str, optimizer: torch.optim.Optimizer) -> list[Any]:
        """After an out-of-memory error: drop the attempt's gradients and cached blocks and cut
        the window's micro-batches in two. At one sample the run ends (ThriftyError), saying
        what would help."""
        from thrifty.errors import ThriftyError

        optimizer.zero_grad(set_to_none=True)
        free_memory(self.device)
        try:
            halves = split_window(window)
        except ValueError:
            raise ThriftyError(out_of_memory_message(error, self.device)) from None
        self.times += 1
        log.warning(
            "out of memory at a micro-batch of %d: replaying the step as %d micro-batches of "
            "%d (the effective batch and the update are unchanged)",
            2 * self.now,
            len(halves),
            self.now,
        )
        return halves
