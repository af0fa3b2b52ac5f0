"""Workloads with known bottlenecks, and a small CPU profiler that turns a few real training
steps into the `Evidence` the diagnosis reads."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from thrifty.loading import available_cpus
from thrifty.measure.diagnosis import Evidence
from thrifty.measure.flops import count_flops
from thrifty.measure.peak import measure_cpu_peak


class SlowItems(Dataset):
    """Each item takes `ms` milliseconds to produce (think reading and decoding a file)."""

    def __init__(self, n: int = 256, width: int = 16, ms: float = 3.0) -> None:
        self.x = torch.randn(n, width)
        self.ms = ms

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
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
    batch_size: int,
    steps: int = 5,
    warmup: int = 1,
    num_workers: int = 0,
    fetch_seconds_per_batch: dict[int, float] | None = None,
) -> Evidence:
    """Train `model` for `warmup + steps` steps on CPU (loss: mean of the output) and return
    the median of each phase over the measured steps as `Evidence`, with FLOPs, aten ops and
    MFU against a measured matmul peak.

    The data wait is wall time (a slow dataset sleeps or burns CPU in this thread). The other
    phases are this thread's CPU time: with one intra-op thread torch runs them all on this
    thread, so on an idle machine that equals their wall time, and on a shared machine it
    leaves out the time other processes held the core — the classification then describes
    the workload, not the neighbours.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _profile(
            model, dataset, batch_size, steps, warmup, num_workers, fetch_seconds_per_batch
        )
    finally:
        torch.set_num_threads(previous_threads)


def _profile(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int,
    steps: int,
    warmup: int,
    num_workers: int,
    fetch_seconds_per_batch: dict[int, float] | None,
) -> Evidence:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, drop_last=True)
    batches = iter(loader)

    first = _unwrap(next(batches))
    count = count_flops(lambda: model(first).mean().backward())
    optimizer.zero_grad(set_to_none=True)
    peak = measure_cpu_peak("fp32")

    phases: dict[str, list[float]] = {
        p: [] for p in ("data_wait", "host_to_device", "forward", "backward", "optimizer")
    }
    clock = time.thread_time
    for step in range(warmup + steps):
        start = time.perf_counter()
        batch = next(batches)
        marks = [time.perf_counter() - start, clock()]
        x = _unwrap(batch).to("cpu")
        marks.append(clock())
        loss = model(x).mean()
        marks.append(clock())
        loss.backward()
        marks.append(clock())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(clock())
        if step >= warmup:
            phases["data_wait"].append(marks[0])
            for name, begin, end in zip(list(phases)[1:], marks[1:], marks[2:], strict=False):
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
        num_workers=num_workers,
        fetch_seconds_per_batch=fetch_seconds_per_batch,
        cpus=available_cpus(),
        device_type="cpu",
        precision="fp32",
        flops_per_step=count.flops,
        aten_ops_per_step=count.ops,
        mfu=count.flops / step_seconds / peak.flops_per_second,
        peak_source=peak.source,
        activation_bytes=count.activation_bytes,
    )
