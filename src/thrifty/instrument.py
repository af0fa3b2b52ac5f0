"""Instrumentation of the training loop: where each step's time goes, MFU, system load and
dollars — and, at the end, the evidence the diagnosis reads.

The train step calls `timer.mark(phase)` at each phase boundary. On CPU a mark is one clock
read. On CUDA it records an event on the stream (no host sync); the events are resolved when
the metrics are flushed, which already syncs once per logging interval.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from thrifty.measure.evidence import PHASES

log = logging.getLogger("thrifty")


class NullTimer:
    """Instrumentation off: marks cost one method call."""

    def start(self) -> None:
        return None

    def mark(self, phase: str) -> None:
        return None

    def add(self, phase: str, seconds: float) -> None:
        return None

    def finish(self) -> Any:
        return None

    def resolve(self, raw: Any) -> dict[str, float] | None:
        return None


class CpuTimer(NullTimer):
    """Wall-clock seconds per phase (CPU work is synchronous: the clock is the truth)."""

    def __init__(self) -> None:
        self._phases = dict.fromkeys(PHASES, 0.0)
        self._last = 0.0

    def start(self) -> None:
        self._phases = dict.fromkeys(PHASES, 0.0)
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self._phases[phase] += now - self._last
        self._last = now

    def add(self, phase: str, seconds: float) -> None:
        self._phases[phase] += seconds

    def finish(self) -> dict[str, float]:
        return self._phases

    def resolve(self, raw: dict[str, float]) -> dict[str, float]:
        return raw


class CudaTimer(NullTimer):
    """GPU-timeline seconds per phase from CUDA events: a gap before `data_wait`'s event is
    the GPU idling while the host fetched the batch."""

    def __init__(self) -> None:
        self._marks: list[tuple[str, torch.cuda.Event]] = []
        self._extra = dict.fromkeys(PHASES, 0.0)

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        self._marks = [("start", self._event())]
        self._extra = dict.fromkeys(PHASES, 0.0)

    def mark(self, phase: str) -> None:
        self._marks.append((phase, self._event()))

    def add(self, phase: str, seconds: float) -> None:
        self._extra[phase] += seconds  # host-side time measured by the caller (a save's stall)

    def finish(self) -> tuple[list[tuple[str, torch.cuda.Event]], dict[str, float]]:
        return self._marks, self._extra

    def resolve(self, raw: tuple[list[tuple[str, Any]], dict[str, float]]) -> dict[str, float]:
        marks, extra = raw
        phases = dict(extra)
        marks[-1][1].synchronize()
        for (_, before), (phase, after) in zip(marks, marks[1:], strict=False):
            phases[phase] += before.elapsed_time(after) / 1e3
        return phases


def make_timer(enabled: bool, device: torch.device) -> NullTimer:
    if not enabled:
        return NullTimer()
    return CudaTimer() if device.type == "cuda" else CpuTimer()


def measure_flops(
    model: torch.nn.Module, batch: Any, call: Callable[[torch.nn.Module, Any], torch.Tensor]
) -> Any:
    """FLOPs and aten ops of one micro-batch forward+backward, without disturbing training:
    evaluation mode (no dropout draw, no BatchNorm update), the RNG forked, gradients cleared."""
    from thrifty.measure.flops import count_flops

    was_training = model.training
    model.eval()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=devices):
            count = count_flops(lambda: call(model, batch).backward())
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    return count


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
