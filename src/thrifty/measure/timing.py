"""Instrumentation of the training loop: where each step's time goes, MFU, system load and
dollars — and, at the end, the evidence the diagnosis reads.

The train step calls `timer.mark(phase)` at each phase boundary. On CPU a mark is one clock
read (two marks a step also read the process's CPU time). On CUDA it records an event on the device's current stream
(no host sync); the events are resolved when the metrics are flushed, which already syncs once
per logging interval. Each timer also owns the wall clock the monitor measures intervals with
and the device synchronization it uses outside the hot path (`sync()`).

Given `waited` (the running total of seconds this rank has spent blocked in host-side
agreements with the other ranks), a timer also measures each step's *fetch*: host seconds from
the step's start to its batches in hand, less the agreement waits in between. The data-wait
phase holds the agreement that ends every window's fetch, where a fast rank waits for a slow
one's loader; the fetch leaves that out, so it is this rank's own (see
`thrifty.measure.stragglers`). Two clock reads and two `waited()` calls a step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from thrifty.measure.evidence import PHASES

log = logging.getLogger("thrifty")

Clock = Callable[[], float]  # seconds, monotonic
# Between the data_wait and optimizer marks: what CpuTimer measures the CPU time of.
HELD_PHASES = ("host_to_device", "forward", "backward", "optimizer")


class FetchClock:
    """Host seconds from a step's start to its batches in hand, less the seconds spent blocked
    in host-side agreements meanwhile. `waited`: their running total, in seconds."""

    def __init__(self, clock: Clock, waited: Clock) -> None:
        self.clock = clock
        self.waited = waited
        self._from = (0.0, 0.0)

    def start(self) -> None:
        self._from = (self.clock(), self.waited())

    def stop(self) -> float:
        wall, waited = self.clock() - self._from[0], self.waited() - self._from[1]
        return max(0.0, wall - waited)


class NullTimer:
    """Instrumentation off: marks cost one method call.

    `device`: the device trained on; `sync()` waits for its queued work (a CUDA device), so
    intervals the monitor measures stay true even with the breakdown off.
    """

    device_timed = False  # True: phase seconds come from the device's own timeline

    def __init__(
        self, device: torch.device | None = None, clock: Clock = time.perf_counter
    ) -> None:
        self.device = device
        self.clock = clock

    def sync(self) -> None:
        """Block until the device has finished its queued work (never called per step)."""
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        return None

    def mark(self, phase: str) -> None:
        return None

    def add(self, phase: str, seconds: float) -> None:
        return None

    def finish(self) -> Any:
        return None

    def resolve(self, raw: Any) -> dict[str, float] | None:
        """Seconds per phase of one step, from what `finish()` returned; None when off."""
        return None

    def busy(self, raw: Any) -> dict[str, float] | None:
        """Seconds per phase this process held the CPU, or None where that is not measured."""
        return None

    def fetch(self, raw: Any) -> float | None:
        """Host seconds the step spent fetching its data, agreement waits left out; None where
        that is not measured (no `waited` given, or the breakdown off)."""
        return None


class CpuTimer(NullTimer):
    """Wall-clock seconds per phase (CPU work is synchronous: the clock is the truth), and the
    process's CPU time over the step's compute, from the `data_wait` mark to the `optimizer`
    mark (two reads a step: a CPU-time read costs a system call).

    CPU seconds ÷ threads, as a share of that span's wall time, is how much of it the process
    held the cores; the compute phases' wall times scaled by it are how long they would have
    taken had no other process held them. The diagnosis judges compute on those, so a busy
    machine does not turn a compute-bound run into a "memory-bound" one.
    """

    def __init__(
        self,
        clock: Clock = time.perf_counter,
        cpu_clock: Clock = time.process_time,
        threads: int | None = None,
        waited: Clock | None = None,
    ) -> None:
        super().__init__(torch.device("cpu"), clock)
        self.cpu_clock = cpu_clock
        self.threads = threads or torch.get_num_threads()
        self._fetch_clock = FetchClock(clock, waited) if waited is not None else None
        self._phases = dict.fromkeys(PHASES, 0.0)
        self._last = 0.0
        self._cpu_from: float | None = None
        self._cpu_span: float | None = None
        self._fetch: float | None = None

    def sync(self) -> None:
        return None

    def start(self) -> None:
        self._phases = dict.fromkeys(PHASES, 0.0)
        self._cpu_from = self._cpu_span = self._fetch = None
        self._last = self.clock()
        if self._fetch_clock is not None:
            self._fetch_clock.start()

    def mark(self, phase: str) -> None:
        now = self.clock()
        self._phases[phase] += now - self._last
        self._last = now
        if phase == "data_wait":
            self._cpu_from = self.cpu_clock()
            if self._fetch_clock is not None:
                self._fetch = self._fetch_clock.stop()
        elif phase == "optimizer" and self._cpu_from is not None:
            self._cpu_span = self.cpu_clock() - self._cpu_from

    def add(self, phase: str, seconds: float) -> None:
        self._phases[phase] += seconds

    def finish(self) -> tuple[dict[str, float], float | None, float | None]:
        return self._phases, self._cpu_span, self._fetch

    def resolve(self, raw: tuple[dict[str, float], float | None, float | None]) -> dict[str, float]:
        return dict(raw[0])

    def fetch(self, raw: tuple[dict[str, float], float | None, float | None]) -> float | None:
        return raw[2]

    def busy(
        self, raw: tuple[dict[str, float], float | None, float | None]
    ) -> dict[str, float] | None:
        wall, cpu, _ = raw
        span = sum(wall[p] for p in HELD_PHASES)
        if cpu is None or span <= 0:
            return None
        held = min(1.0, cpu / self.threads / span)
        return {p: wall[p] * held for p in HELD_PHASES}


class CudaTimer(NullTimer):
    """GPU-timeline seconds per phase from CUDA events on `device`'s current stream: a gap
    before `data_wait`'s event is the GPU idling while the host fetched the batch."""

    device_timed = True

    def __init__(
        self, device: torch.device, clock: Clock = time.perf_counter, waited: Clock | None = None
    ) -> None:
        super().__init__(device, clock)
        self._fetch_clock = FetchClock(clock, waited) if waited is not None else None
        self._stream: Any = None
        self._marks: list[tuple[str, Any]] = []
        self._extra = dict.fromkeys(PHASES, 0.0)

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        return event

    def start(self) -> None:
        # Looked up once a step, not per mark: the stream the step's kernels are queued on.
        self._stream = torch.cuda.current_stream(self.device)
        self._marks = [("start", self._event())]
        self._extra = dict.fromkeys(PHASES, 0.0)
        if self._fetch_clock is not None:
            self._fetch_clock.start()

    def mark(self, phase: str) -> None:
        self._marks.append((phase, self._event()))
        if phase == "data_wait" and self._fetch_clock is not None:
            # Host time, beside the phases: the loader runs on the host.
            self._extra["fetch"] = self._fetch_clock.stop()

    def add(self, phase: str, seconds: float) -> None:
        self._extra[phase] += seconds  # host-side time measured by the caller (a save's stall)

    def finish(self) -> tuple[list[tuple[str, Any]], dict[str, float]]:
        """The step's events, and host-side seconds: per phase, and the fetch when measured."""
        return self._marks, self._extra

    def resolve(self, raw: tuple[list[tuple[str, Any]], dict[str, float]]) -> dict[str, float]:
        marks, extra = raw
        phases = {p: extra[p] for p in PHASES}
        marks[-1][1].synchronize()  # already complete after the flush's sync: no wait
        for (_, before), (phase, after) in zip(marks, marks[1:], strict=False):
            phases[phase] += before.elapsed_time(after) / 1e3
        return phases

    def fetch(self, raw: tuple[list[tuple[str, Any]], dict[str, float]]) -> float | None:
        return raw[1].get("fetch")


def make_timer(
    enabled: bool,
    device: torch.device,
    clock: Clock = time.perf_counter,
    waited: Clock | None = None,
) -> NullTimer:
    """The timer for `device`: CUDA events on a GPU, clocks on a CPU, marks that cost nothing
    when `enabled` is False. `clock` (seconds) is the wall clock intervals are measured with;
    `waited` (seconds blocked in host-side agreements so far) turns on the fetch figure."""
    if not enabled:
        return NullTimer(device, clock)
    if device.type == "cuda":
        return CudaTimer(device, clock, waited)
    return CpuTimer(clock, waited=waited)


def measure_flops(
    model: torch.nn.Module,
    batch: Any,
    call: Callable[[torch.nn.Module, Any], torch.Tensor],
    device: torch.device | None = None,
    blocks: Sequence[str] = (),
) -> Any:
    """FLOPs and aten ops of one micro-batch forward+backward, without disturbing training:
    evaluation mode (no dropout draw, no BatchNorm update), the RNG forked, gradients cleared.
    `blocks`: names of the model's modules whose activation bytes are counted each.

    `device`: where the model runs (default: where its first parameter is); its RNG is the one
    forked, so a run on `cuda:1` keeps `cuda:1`'s random stream where it was.
    """
    from thrifty.measure.flops import count_flops

    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=_cuda_indices(device or _model_device(model))):
            modules = dict(model.named_modules())
            named = {name: modules[name] for name in blocks}
            count = count_flops(lambda: call(model, batch).backward(), named)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return count


def _model_device(model: torch.nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _cuda_indices(device: torch.device) -> list[int]:
    """The CUDA device whose RNG `fork_rng` must save: none for a CPU device."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


@contextlib.contextmanager
def maybe_trace(directory: str | None, active_steps: int) -> Iterator[Callable[[], None]]:
    """A torch.profiler trace of `active_steps` steps (after 1 wait and 1 warm-up step) into
    `directory`, viewable in TensorBoard or Perfetto; yields the per-step callback."""
    if directory is None:
        yield lambda: None
        return
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    prof = profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=active_steps, repeat=1),
        on_trace_ready=tensorboard_trace_handler(directory),
        record_shapes=True,
        with_flops=True,
    )
    with prof:
        yield prof.step
    log.info(
        "trace: %d steps written to %s (tensorboard --logdir %s, or open the .json in "
        "https://ui.perfetto.dev)",
        active_steps,
        directory,
        directory,
    )
