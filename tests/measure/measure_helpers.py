"""Workloads with known bottlenecks, and a small profiler that turns a few real training steps
into the `Evidence` the diagnosis reads.

The steps run for real, but their time is counted on a simulated CPU rather than read from a
clock: each aten op costs a fixed dispatch time plus its FLOPs at a fixed rate, and a slow
dataset adds the time its items take. The op and FLOP counts are the workload's own, so what
the diagnosis sees follows from the workload — and is the same on any machine, however busy.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from thrifty.measure.diagnosis import Evidence
from thrifty.measure.flops import count_flops
from thrifty.strategies.device import available_cpus


class SimulatedCpu:
    """A CPU whose time is counted: `op_seconds` per aten op (dispatch and call overhead, a few
    µs as on a real one) plus FLOPs at `flops_per_second`, its peak."""

    def __init__(self, op_seconds: float = 4e-6, flops_per_second: float = 50e9) -> None:
        self.op_seconds = op_seconds
        self.flops_per_second = flops_per_second
        self.now = 0.0  # seconds

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` for real and advance the clock by what it cost; returns its result."""
        out: list[Any] = []
        count = count_flops(lambda: out.append(fn()))
        self.now += count.ops * self.op_seconds + count.flops / self.flops_per_second
        return out[0]


class SlowItems(Dataset):
    """Each item takes `ms` milliseconds of `cpu`'s time (think reading and decoding a file)."""

    def __init__(self, cpu: SimulatedCpu, n: int = 256, width: int = 16, ms: float = 3.0) -> None:
        self.cpu = cpu
        self.x = torch.randn(n, width)
        self.ms = ms

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        self.cpu.now += self.ms / 1e3
        return self.x[i]


def tiny_ops_model(blocks: int = 100) -> nn.Module:
    """200 chained tiny ops: Linear(4, 4) and tanh, each far too small to amortize its call."""
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(4, 4), nn.Tanh()]
    return nn.Sequential(*layers)


def compute_heavy_model(width: int = 1024, depth: int = 4) -> nn.Module:
    """Large matmuls: `depth` Linear(width, width) layers with ReLU between."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def random_rows(n: int, width: int) -> TensorDataset:
    return TensorDataset(torch.randn(n, width))


def _unwrap(batch: object) -> torch.Tensor:
    return batch[0] if isinstance(batch, list | tuple) else batch  # type: ignore[return-value]


def profile_on_cpu(
    model: nn.Module,
    dataset: Dataset,
    *,
    cpu: SimulatedCpu,
    batch_size: int,
    steps: int = 5,
    warmup: int = 1,
    fetch_seconds_per_batch: dict[int, float] | None = None,
) -> Evidence:
    """Train `model` for `warmup + steps` steps (loss: mean of the output) timed on `cpu`, and
    return the median of each phase over the measured steps as `Evidence`, with FLOPs, aten
    ops and MFU against `cpu`'s peak."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=batch_size, drop_last=True)
    batches = iter(loader)

    first = _unwrap(next(batches))
    count = count_flops(lambda: model(first).mean().backward())
    optimizer.zero_grad(set_to_none=True)

    def optimize() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    phases: dict[str, list[float]] = {
        p: [] for p in ("data_wait", "host_to_device", "forward", "backward", "optimizer")
    }
    for step in range(warmup + steps):
        marks = [cpu.now]
        batch = next(batches)
        marks.append(cpu.now)
        x = cpu.run(lambda b=batch: _unwrap(b).to("cpu"))
        marks.append(cpu.now)
        loss = cpu.run(lambda x=x: model(x).mean())
        marks.append(cpu.now)
        cpu.run(loss.backward)
        marks.append(cpu.now)
        cpu.run(optimize)
        marks.append(cpu.now)
        if step >= warmup:
            for name, begin, end in zip(phases, marks, marks[1:], strict=False):
                phases[name].append(end - begin)
    seconds = {name: statistics.median(values) for name, values in phases.items()}
    step_seconds = sum(seconds.values())
    return Evidence(
        step_seconds=step_seconds,
        steps=steps,
        data_wait_seconds=seconds["data_wait"],
        host_to_device_seconds=seconds["host_to_device"],
        forward_seconds=seconds["forward"],
        backward_seconds=seconds["backward"],
        optimizer_seconds=seconds["optimizer"],
        other_seconds=0.0,
        micro_batch=batch_size,
        num_workers=0,
        fetch_seconds_per_batch=fetch_seconds_per_batch,
        cpus=available_cpus(),
        device_type="cpu",
        precision="fp32",
        flops_per_step=count.flops,
        aten_ops_per_step=count.ops,
        mfu=count.flops / step_seconds / cpu.flops_per_second,
        peak_source=f"simulated: {cpu.flops_per_second / 1e9:g} GFLOP/s",
        activation_bytes=count.activation_bytes,
    )
