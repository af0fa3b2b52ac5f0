"""The Trainer's instruments, built from the config: the FLOPs of a step (counted once), the
device's peak, the run monitor (timing, MFU, system sampling, the dollar meter) and, at the end,
the diagnosis of what limited the steps."""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from thrifty.config import TrainConfig
from thrifty.data.loading import WorkerChoice
from thrifty.errors import ThriftyError
from thrifty.levers.accumulation import LossFn, call_model, to_device
from thrifty.levers.activation_checkpointing import find_repeated_blocks
from thrifty.levers.precision import Precision, native_bf16
from thrifty.measure.cost import LostWork
from thrifty.measure.monitor import RunMonitor
from thrifty.measure.progress import ProgressBar
from thrifty.measure.stragglers import gather_ranks
from thrifty.measure.timing import make_timer, measure_flops
from thrifty.records.budget import Budget
from thrifty.records.directory import MetricsLog
from thrifty.records.state import TrainState
from thrifty.strategies.device import available_cpus
from thrifty.strategies.process_group import Distributed

log = logging.getLogger("thrifty")


def held_on_every_rank(dist: Distributed, count: Any, policy: Any) -> dict[str, int]:
    """The activation bytes each repeated block held in the FLOP count `count`, summed over the
    ranks: every rank then chooses the same blocks to recompute (under FSDP a recomputation
    gathers parameters, a collective all ranks must make together). Nothing to gather when
    activation checkpointing is off (`policy`, the same on every rank)."""
    if policy == "off":
        return {}
    totals: Counter[str] = Counter()
    for held in dist.all_gather(count.block_bytes if count is not None else {}):
        totals.update(held)
    return dict(totals)


def count_step_flops(
    model: nn.Module,
    data: Dataset,
    config: TrainConfig,
    device: torch.device,
    precision: Precision,
    loss_fn: LossFn | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    micro: int,
) -> Any:
    """FLOPs and aten ops of one micro-batch's forward and backward, measured once on a real
    micro-batch of `micro` samples; None when the breakdown is off or the model cannot be
    traced. A micro-batch too large for the device (the training will halve it) is counted
    on one sample and scaled: FLOPs and activations grow with the samples."""
    if not config.measure.breakdown:
        return None
    from torch.utils.data import DataLoader, default_collate

    from thrifty.data.sources import first_samples
    from thrifty.levers.micro_batch import free_memory, scaled_count

    collate = collate_fn or (data.collate_fn if isinstance(data, DataLoader) else default_collate)
    blocks = find_repeated_blocks(model)  # activation checkpointing chooses by what they hold

    def call(m: nn.Module, b: Any) -> torch.Tensor:
        with precision.autocast():
            return call_model(m, b, loss_fn)

    def count(samples: int) -> Any:
        batch = to_device(collate(first_samples(data, samples)), device)
        return measure_flops(model, batch, call, device=device, blocks=blocks)

    try:
        try:
            return count(micro)
        except torch.OutOfMemoryError:
            if micro == 1:
                raise
        free_memory(device)  # out of the handler: the failed count's tensors are gone
        return scaled_count(count(1), micro)
    except ThriftyError:
        raise
    except Exception as exc:  # a model the FLOP counter cannot trace: MFU is then unknown
        log.warning("could not count the model's FLOPs (%s): MFU will not be reported", exc)
        return None


def find_peak(config: TrainConfig, device: torch.device, precision: Precision) -> Any:
    """The device's peak FLOP/s for the dtype trained in, or None (MFU then goes unreported)."""
    from thrifty.measure.peak import peak_flops

    tf32 = device.type == "cuda" and config.precision.allow_tf32
    try:
        with torch.random.fork_rng(devices=[]):  # the CPU benchmark must not shift the RNG
            return peak_flops(
                device, precision.peak_dtype, given_tflops=config.measure.peak_tflops, tf32=tf32
            )
    except ThriftyError as exc:
        log.warning("%s; MFU will not be reported", exc)
        return None


def build_monitor(
    config: TrainConfig,
    device: torch.device,
    precision: Precision,
    dist: Distributed,
    *,
    step_flops: float | None,
    metrics: MetricsLog | None,
    budget: Budget,
    progress: TrainState,
    lost: LostWork,
) -> RunMonitor:
    """The run's monitor: GPU sensors and the dollar meter on rank 0 only; with several ranks,
    each flush gathers every rank's losses and own work (the straggler figures)."""
    flops = config.measure.flops_per_step or step_flops
    peak = find_peak(config, device, precision) if flops else None
    if peak is not None:
        log.info("MFU against %.1f TFLOP/s (%s)", peak.flops_per_second / 1e12, peak.source)
    sampler = None
    if config.measure.system and dist.is_main:
        from thrifty.measure.system import SystemSampler

        # GPU sensors only when training on one: on a CPU run their absence is no news.
        sampler = SystemSampler(
            config.measure.sample_seconds, gpu=device.type == "cuda", device=device
        ).start()
    cost = None
    if config.cost.enabled and dist.is_main:
        from thrifty.measure.cost import CostMeter

        cost = CostMeter.from_config(config.cost, world_size=dist.world_size)
        cost.add_wasted(lost)
    # Several ranks: the flush's one collective gathers losses and each rank's own work.
    gather = functools.partial(gather_ranks, world_size=dist.world_size) if dist.enabled else None
    return RunMonitor(
        metrics if metrics is not None else MetricsLog(os.devnull),
        ProgressBar(config.run.max_steps, config.run.progress if dist.is_main else "off"),
        make_timer(
            config.measure.breakdown,
            device,
            waited=(lambda: dist.agreed_seconds) if dist.enabled else None,
        ),
        exclude_steps=3 if config.compile.mode != "off" else 1,
        flops_per_step=flops,
        peak=peak,
        sampler=sampler,
        cost=cost,
        budget_fraction=functools.partial(budget.fraction_done, progress),
        gather=gather,
        # FSDP's forward all-gathers parameters, waiting on the other ranks: not own work.
        work_phases=() if dist.strategy == "fsdp" else ("forward",),
        straggler_threshold=config.measure.straggler_threshold,
    )


def diagnose_run(
    monitor: RunMonitor,
    config: TrainConfig,
    device: torch.device,
    precision: Precision,
    *,
    flops: Any,
    micro: int,
    accumulation: int,
    num_workers: int,
    worker_choice: WorkerChoice | None,
) -> Any:
    """The bottleneck and what to do about it, from what this run measured."""
    cuda = device.type == "cuda"
    return monitor.diagnose(
        accumulation_steps=accumulation,
        micro_batch=micro,
        num_workers=num_workers,
        fetch_seconds_per_batch=worker_choice.seconds_per_batch if worker_choice else None,
        cpus=available_cpus(),
        device_type=device.type,
        device_name=torch.cuda.get_device_name(device) if cuda else None,
        precision=precision.name,
        tf32=cuda and config.precision.allow_tf32,
        native_bf16=native_bf16(device),
        compiled=config.compile.mode != "off",
        activation_checkpointing=str(config.activation_checkpointing.policy),
        aten_ops_per_step=flops.ops * accumulation if flops else None,
        activation_bytes=float(flops.activation_bytes) if flops else None,
        peak_memory_bytes=float(torch.cuda.max_memory_allocated(device)) if cuda else None,
        device_memory_bytes=(
            float(torch.cuda.get_device_properties(device).total_memory) if cuda else None
        ),
    )
