"""Throughput and MFU measured from one host sync to the next, so work a device finishes after
the host has moved on is counted; and a device other than cuda:0 is the one measured.

A GPU is stood in for by `FakeDevice`: launching work costs the host a millisecond and queues
the work; the device runs it afterwards, and a sync waits until the queue is drained. Its
events complete when the work queued before them has run, as CUDA events do.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from helpers import Costed, VirtualClock, time_trainer_with, wire_monitor
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.measure.monitor import RunMonitor
from thrifty.measure.peak import Peak
from thrifty.measure.progress import ProgressBar
from thrifty.measure.timing import CudaTimer, NullTimer, make_timer, measure_flops
from thrifty.run import trainer as trainer_module
from thrifty.rundir.files import MetricsLog, read_metrics

LAUNCH = 0.001  # host seconds to queue one phase's kernels
WORK = {"data_wait": 0.002, "forward": 0.030, "backward": 0.060, "optimizer": 0.010}
STEP = sum(WORK.values())  # device seconds per step: 0.102
TOKENS = 512


class FakeDevice:
    """Work runs after the host has queued it; the host's clock only catches up at a sync."""

    def __init__(self) -> None:
        self.host = 0.0  # the host's clock, seconds
        self.done = 0.0  # when the work queued so far will have run
        self.syncs = 0

    def launch(self, seconds: float) -> None:
        self.done = max(self.done, self.host) + seconds
        self.host += LAUNCH

    def event(self) -> float:
        """When an event recorded now completes: once the work queued before it has run."""
        return max(self.done, self.host)

    def synced_clock(self) -> float:
        """The host's clock read right after a sync: the monitor reads its clock only there."""
        self.host = max(self.host, self.done)
        return self.host


class FakeEventTimer(NullTimer):
    """CudaTimer's contract on the fake device: events at the phase boundaries, read later."""

    device_timed = True

    def __init__(self, device: FakeDevice) -> None:
        super().__init__(None, device.synced_clock)
        self.fake = device
        self.marks: list[tuple[str, float]] = []

    def sync(self) -> None:
        self.fake.syncs += 1

    def start(self) -> None:
        self.marks = [("start", self.fake.event())]

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self.fake.event()))

    def finish(self) -> list[tuple[str, float]]:
        return self.marks

    def resolve(self, raw: list[tuple[str, float]]) -> dict[str, float]:
        phases = dict.fromkeys(WORK, 0.0)
        for (_, before), (phase, after) in zip(raw, raw[1:], strict=False):
            phases[phase] += after - before
        return phases


def make_monitor(tmp_path, timer: NullTimer, exclude_steps: int = 0) -> RunMonitor:
    return RunMonitor(
        MetricsLog(tmp_path / "metrics.jsonl"),
        ProgressBar(None, "off"),
        timer,
        exclude_steps=exclude_steps,
        flops_per_step=1e9,
        peak=Peak(1e12, "given: 1 TFLOP/s", measured=False),
    )


def train_step(device: FakeDevice, timer: NullTimer, monitor: RunMonitor, step: int, extra=0.0):
    """One step as the Trainer drives it: marks at the phase boundaries, the record added with
    the step's host time (launches only: the host never waited for the device)."""
    host_start = device.host
    timer.start()
    for phase, seconds in WORK.items():
        device.launch(seconds + (extra if phase == "forward" else 0.0))
        timer.mark(phase)
    record = {
        "step": step,
        "loss": torch.tensor(1.0),
        "grad_norm": None,
        "step_seconds": device.host - host_start,
        "samples_in_step": 4,
        "tokens_in_step": TOKENS,
    }
    monitor.add(record, timer.finish())


def run(tmp_path, steps: int = 8, log_every: int = 4, **kwargs: Any) -> tuple[RunMonitor, float]:
    """Train `steps` fake steps, flushing every `log_every`; returns the monitor and the true
    elapsed seconds from start to the last flush."""
    device = FakeDevice()
    timer = FakeEventTimer(device)
    monitor = make_monitor(tmp_path, timer, kwargs.pop("exclude_steps", 0))
    monitor.start()
    began = device.host
    for step in range(1, steps + 1):
        train_step(device, timer, monitor, step, kwargs.get("first_extra", 0.0) * (step == 1))
        if step == kwargs.get("evaluate_after"):
            monitor.pause()
            device.launch(0.5)  # an evaluation: half a second of device work
            monitor.resume()
        if step % log_every == 0:
            monitor.flush(device.host, 4 * step, TOKENS * step)
    monitor.close()
    return monitor, device.host - began


def test_tokens_per_second_is_tokens_over_the_true_elapsed_time(tmp_path):
    monitor, elapsed = run(tmp_path)
    assert elapsed == pytest.approx(8 * STEP)  # the device's work, not the host's launches
    assert monitor.meter.tokens_per_second == pytest.approx(8 * TOKENS / elapsed)
    # timed on the host, the same steps took 4 launches each: a rate 25x too high
    assert monitor.meter.tokens_per_second < 8 * TOKENS / (8 * 4 * LAUNCH) / 20


def test_mfu_and_step_seconds_come_from_the_interval_between_syncs(tmp_path):
    monitor, elapsed = run(tmp_path)
    records = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert sum(r["step_seconds"] for r in records) == pytest.approx(elapsed)
    for r in records:
        assert r["step_seconds"] == pytest.approx(STEP)
        assert sum(r["breakdown"].values()) == pytest.approx(r["step_seconds"])
        assert r["breakdown"]["backward"] == pytest.approx(WORK["backward"])
    interval_mfu = [r["mfu"] for r in records if "mfu" in r]
    assert interval_mfu == pytest.approx([1e9 / STEP / 1e12] * 2)
    assert monitor.mfu == pytest.approx(1e9 / STEP / 1e12)


def test_the_warm_up_step_is_left_out_with_its_share_of_the_interval(tmp_path):
    monitor, elapsed = run(tmp_path, exclude_steps=1, first_extra=0.5)  # a slow first step
    assert elapsed == pytest.approx(8 * STEP + 0.5)
    assert monitor.meter.tokens_per_second == pytest.approx(7 * TOKENS / (7 * STEP))
    assert monitor.meter.step_seconds == pytest.approx(STEP)


def test_time_the_caller_pauses_for_is_not_training(tmp_path):
    monitor, elapsed = run(tmp_path, evaluate_after=2)
    assert elapsed > 8 * STEP + 0.5  # the evaluation took real time...
    assert monitor.meter.tokens_per_second == pytest.approx(
        8 * TOKENS / (8 * STEP)
    )  # ...not training


def test_adding_a_step_neither_syncs_nor_reads_the_clock(tmp_path):
    device = FakeDevice()
    timer = FakeEventTimer(device)
    reads = []
    timer.clock = lambda: reads.append(1) or device.synced_clock()
    monitor = make_monitor(tmp_path, timer)
    monitor.start()
    syncs, clock_reads, host = device.syncs, len(reads), device.host
    for step in range(1, 5):
        train_step(device, timer, monitor, step)
    assert (device.syncs, len(reads)) == (syncs, clock_reads)
    assert device.host == pytest.approx(host + 4 * 4 * LAUNCH)  # the host never waited
    monitor.flush(device.host, 16, 4 * TOKENS)
    assert len(reads) == clock_reads + 1  # one read, right after the flush's own sync
    monitor.close()


def test_without_start_the_steps_own_seconds_are_used(tmp_path):
    device = FakeDevice()
    timer = FakeEventTimer(device)
    monitor = make_monitor(tmp_path, timer)
    for step in range(1, 9):
        train_step(device, timer, monitor, step)
        if step % 4 == 0:
            monitor.flush(device.host, 4 * step, TOKENS * step)
    monitor.close()
    assert monitor.meter.tokens_per_second == pytest.approx(8 * TOKENS / (8 * STEP))


# --- the Trainer, wired to the monitor ------------------------------------------------------


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x, y):
        return ((self.lin(x) - y) ** 2).mean()


def test_a_wired_trainer_counts_the_loop_between_steps_but_not_evaluations(tmp_path, monkeypatch):
    """Steps cost 3 ms of marked phases and the loop 1 ms after each (outside any phase, as
    logging and bookkeeping are); evaluations take clock time too. The rate counts the
    steps and the loop between them, sync to sync, and leaves the evaluations out."""
    clock = VirtualClock()
    time_trainer_with(monkeypatch, clock)
    monitors = wire_monitor(monkeypatch)

    @contextlib.contextmanager
    def loop_overhead(*args):
        yield lambda: clock.advance(1e-3)  # called once after each step

    monkeypatch.setattr(trainer_module, "maybe_trace", loop_overhead)
    data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    config = TrainConfig.from_dict(
        {
            "run": {
                "max_steps": 8,
                "device": "cpu",
                "out": str(tmp_path / "run"),
                "progress": "off",
                "log_every": 4,
            },
            "batch": {"micro": 4},
            "data": {"num_workers": 0},
            "eval": {"every": 2, "batches": 3},
            "schedule": {"decay": "constant"},
            "checkpoint": {"every": "off"},
            "optimizer": {"name": "sgd", "lr": 1e-3},
        }
    )
    model = Costed(Regressor(), clock, forward=1e-3, backward=2e-3)
    result = Trainer(model, data, config, val_data=data).fit()
    assert monitors and clock.now > 8 * 4e-3 + 5 * 3 * 1e-3  # evaluations took clock time
    # interval 1: steps 1-4 and the loop after 1-3 (15 ms), step 1 (3.75 ms) the warm-up;
    # interval 2: the loop after 4, steps 5-8 and the loop after 5-7 (16 ms)
    assert result.samples_per_second == pytest.approx(7 * 4 / (15e-3 - 3.75e-3 + 16e-3))
    steps = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step_seconds"] for r in steps] == pytest.approx([3.75e-3] * 4 + [4e-3] * 4)
    assert all(r["breakdown"]["other"] > 0 for r in steps)  # the loop's time, not a phase's


# --- a device other than cuda:0 ---------------------------------------------------------------


class FakeEvent:
    def __init__(self, enable_timing: bool = False) -> None:
        self.stream = None

    def record(self, stream: Any = None) -> None:
        self.stream = stream

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, other: FakeEvent) -> float:
        return 2.0  # milliseconds


@pytest.fixture
def fake_cuda(monkeypatch):
    calls: dict[str, list[Any]] = {"stream": [], "synchronize": []}
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda device=None: calls["stream"].append(device) or device
    )
    monkeypatch.setattr(
        torch.cuda, "synchronize", lambda device=None: calls["synchronize"].append(device)
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    return calls


def test_cuda_events_are_recorded_on_the_training_devices_stream(fake_cuda):
    cuda1 = torch.device("cuda", 1)
    timer = make_timer(True, cuda1)
    assert isinstance(timer, CudaTimer)
    timer.start()
    timer.mark("forward")
    timer.mark("backward")
    marks, _ = timer.finish()
    assert fake_cuda["stream"] == [cuda1]  # looked up once per step
    assert all(event.stream == cuda1 for _, event in marks)
    assert timer.resolve(timer.finish())["backward"] == pytest.approx(0.002)
    timer.sync()
    make_timer(False, cuda1).sync()  # the breakdown off: intervals still sync the right device
    assert fake_cuda["synchronize"] == [cuda1, cuda1]


def test_flop_counting_forks_the_rng_of_the_models_device(monkeypatch, fake_cuda):
    forked: list[list[int]] = []
    real_fork = torch.random.fork_rng

    def fork_rng(devices=None, **kwargs):
        forked.append(list(devices))
        return real_fork(devices=[], **kwargs)

    monkeypatch.setattr(torch.random, "fork_rng", fork_rng)
    model = torch.nn.Linear(4, 1)

    def call(m, b):
        return m(b).sum()

    batch = torch.randn(2, 4)
    measure_flops(model, batch, call)  # a CPU model: no CUDA RNG to fork
    measure_flops(model, batch, call, device=torch.device("cuda", 1))
    measure_flops(model, batch, call, device=torch.device("cuda"))  # the current one
    assert forked == [[], [1], [3]]


def test_the_progress_bar_counts_every_step_before_the_first_flush(tmp_path):
    """The bar's count moved only at a flush: a run logging every 50 steps showed 0/N for its
    first 50. It moves at each step now, its loss and rate still at each flush."""
    device = FakeDevice()
    timer = FakeEventTimer(device)
    monitor = make_monitor(tmp_path, timer)
    bar = ProgressBar(100, "on")
    monitor.progress = bar
    monitor.start()
    try:
        for step in (1, 2, 3):
            train_step(device, timer, monitor, step)
        (task,) = bar._progress.tasks
        assert task.completed == 3 and task.fields["loss"] == "-"  # nothing read yet
        monitor.flush(device.host, 12, TOKENS * 3)
        assert task.fields["loss"] == "1.0000"
    finally:
        monitor.close()
