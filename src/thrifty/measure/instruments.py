"""The Trainer's instruments, built from the config: the FLOPs of a step (counted once), the
device's peak, the run monitor (timing, MFU, system sampling, the dollar meter) and, at the end,
the diagnosis of what limited the steps."""

from __future__ import annotations

import functools
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from thrifty.config import CostConfig, MeasureConfig
from thrifty.data.geometry import BatchGeometry
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
from thrifty.records.state import TrainState
from thrifty.rundir.files import MetricsLog
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
    geometry: BatchGeometry,
    device: torch.device,
    precision: Precision,
    loss_fn: LossFn | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    *,
    breakdown: bool,
) -> Any:
    """FLOPs and aten ops of one micro-batch (`geometry.micro` samples) forward and backward,
    counted once; None when the breakdown (measure.breakdown) is off or the model cannot be
    traced.

    The count runs eager, before activation checkpointing and compile: at the full micro-batch
    its step would peak far above the training's (a compiled step frees what it fuses; a
    checkpointed one recomputes what it would keep), so it is made on the micro-batch's first
    two samples and first three, and each figure follows the line through both
    (`extended_count`): FLOPs and activations grow with the samples, a scalar loss does not.
    Three samples that do not fit leave one, scaled.

    First, breakdown or not, the first micro-batch is collated as the loader will: a missing
    or failing collator is one line naming collate_fn (`thrifty.data.collating`)."""
    from thrifty.data.collating import collate_checked, collate_used
    from thrifty.levers.micro_batch import cut_batch, free_memory

    micro = geometry.micro
    collate, named = collate_used(data, collate_fn)
    samples = _first_samples(data, micro, auto=geometry.auto)
    batch = collate_checked(samples, collate, named)
    if not breakdown:
        return None
    blocks = find_repeated_blocks(model)  # activation checkpointing chooses by what they hold

    def call(m: nn.Module, b: Any) -> torch.Tensor:
        with precision.autocast():
            return call_model(m, b, loss_fn)

    size = min(micro, len(samples))  # a dataset smaller than the micro-batch is one batch

    def count(n: int) -> Any:
        # Cut from the micro-batch, each sample keeps its padded length there.
        cut = cut_batch(batch, size, n) if len(samples) == size else None
        part = batch if n == len(samples) else cut if cut is not None else collate(samples[:n])
        return measure_flops(model, to_device(part, device), call, device=device, blocks=blocks)

    try:
        try:
            found = _small_count(count, size, device)
        except ThriftyError as exc:
            raise _as_the_batch_says(exc, lambda: call(model, to_device(batch, device))) from None
    except ThriftyError as exc:
        if collate_fn is None:
            raise
        # The batch the model could not take is the given collator's: say so beside the fix.
        raise ThriftyError(f"{exc}; the batch is what {named} returned") from None
    except Exception as exc:  # a model the FLOP counter cannot trace: MFU is then unknown
        log.warning("could not count the model's FLOPs (%s): MFU will not be reported", exc)
        return None
    free_memory(device)  # the eager steps' cached blocks: the training's, not the set-up's
    return found


def _as_the_batch_says(error: ThriftyError, whole: Callable[[], Any]) -> ThriftyError:
    """`error`, raised by the model on a few samples cut from the first micro-batch, in the
    words the whole micro-batch gets (the shapes it names are then those of the user's
    batches): `whole()` calls the model on it, without gradients (the run ends here; nothing
    is kept for a backward). `error` itself when that call says nothing else."""
    try:
        with torch.no_grad():
            whole()
    except ThriftyError as said:
        return said
    except Exception:  # out of memory, say: the cut batch's words then
        pass
    return error


# The counted sizes: the line through them gives every other (one sample takes other paths
# in some models, a squeezed batch dimension).
_COUNTED = 2


def _small_count(count: Callable[[int], Any], micro: int, device: torch.device) -> Any:
    """The count of `micro` samples from `count(n)`, a count of the first `n`, with n at most
    three. Out of memory there: one sample, scaled; at one, the error goes on (the training
    would not fit either)."""
    from thrifty.levers.micro_batch import extended_count, free_memory, scaled_count

    try:
        if micro <= _COUNTED + 1:
            return count(micro)
        low = count(_COUNTED)
        return extended_count(low, count(_COUNTED + 1), _COUNTED, micro)
    except torch.OutOfMemoryError:
        if micro == 1:
            raise
    free_memory(device)  # out of the handler: the failed count's tensors are gone
    return scaled_count(count(1), micro)


# Samples collated at set-up with batch.micro = "auto" (counted on one): enough to show
# samples of different shapes that one sample cannot.
_AUTO_PROBE = 8


def _first_samples(data: Any, micro: int, auto: bool) -> list[Any]:
    """The first micro-batch's samples; with batch.micro = "auto", up to _AUTO_PROBE of a
    map-style dataset (the micro-batch search will collate that many and more)."""
    from torch.utils.data import DataLoader

    from thrifty.data.sources import first_samples, is_stream

    source = data.dataset if isinstance(data, DataLoader) else data
    if not auto or is_stream(source):
        return first_samples(data, micro)
    return first_samples(data, max(micro, min(_AUTO_PROBE, len(cast(Sized, source)))))


def find_peak(
    device: torch.device, precision: Precision, *, given_tflops: float | None, allow_tf32: bool
) -> Any:
    """The device's peak FLOP/s for the dtype trained in (`given_tflops`: measure.peak_tflops;
    `allow_tf32`: precision.allow_tf32), or None (MFU then goes unreported)."""
    from thrifty.measure.peak import peak_flops

    tf32 = device.type == "cuda" and allow_tf32
    try:
        with torch.random.fork_rng(devices=[]):  # the CPU benchmark must not shift the RNG
            return peak_flops(device, precision.peak_dtype, given_tflops=given_tflops, tf32=tf32)
    except ThriftyError as exc:
        log.warning("%s; MFU will not be reported", exc)
        return None


def usable_peak(peak: Any) -> Any:
    """`peak`, or None (said once) when it is no basis for MFU: zero or not a number (a CPU
    benchmark whose products all timed at nothing, a figure given as 0)."""
    if peak is None or (math.isfinite(peak.flops_per_second) and peak.flops_per_second > 0):
        return peak
    log.warning(
        "MFU is not shown: the peak found for this device is %s FLOP/s (%s), nothing to measure "
        "against; give the dense peak for the dtype trained in (measure.peak_tflops, or "
        "--peak-tflops on the command line)",
        f"{peak.flops_per_second:g}",
        peak.source,
    )
    return None


def flops_rate(flops_per_second: float) -> str:
    """A peak in the unit that shows it: "312.0 TFLOP/s", or below one TFLOP/s "55.1 GFLOP/s"
    (a CPU's, which "0.1 TFLOP/s" would round away)."""
    if flops_per_second >= 1e12:
        return f"{flops_per_second / 1e12:.1f} TFLOP/s"
    return f"{flops_per_second / 1e9:.3g} GFLOP/s"


def build_monitor(
    measure: MeasureConfig,
    cost: CostConfig,
    device: torch.device,
    precision: Precision,
    dist: Distributed,
    *,
    step_flops: float | None,
    metrics: MetricsLog | None,
    budget: Budget,
    progress: TrainState,
    lost: LostWork,
    bar: str,
    compiled: bool,
    allow_tf32: bool,
) -> RunMonitor:
    """The run's monitor: GPU sensors and the dollar meter on rank 0 only; with several ranks,
    each flush gathers every rank's losses and own work (the straggler figures). `bar` is
    run.progress, `compiled` whether compile.mode is on (its first steps compile),
    `allow_tf32` precision.allow_tf32 (the peak's dtype). Thirteen parameters: what the
    monitor measures and against what, each read by it alone."""
    flops = measure.flops_per_step or step_flops
    peak = None
    if flops:
        given = measure.peak_tflops
        peak = usable_peak(find_peak(device, precision, given_tflops=given, allow_tf32=allow_tf32))
    if peak is not None:
        log.info("MFU against %s (%s)", flops_rate(peak.flops_per_second), peak.source)
    sampler = None
    if measure.system and dist.is_main:
        from thrifty.measure.system import SystemSampler

        # GPU sensors only when training on one: on a CPU run their absence is no news.
        sampler = SystemSampler(
            measure.sample_seconds, gpu=device.type == "cuda", device=device
        ).start()
    meter = None
    if cost.enabled and dist.is_main:
        from thrifty.measure.cost import CostMeter

        meter = CostMeter.from_config(cost, world_size=dist.world_size)
        meter.add_wasted(lost)
    # Several ranks: the flush's one collective gathers losses and each rank's own work.
    gather = functools.partial(gather_ranks, world_size=dist.world_size) if dist.enabled else None
    return RunMonitor(
        metrics if metrics is not None else MetricsLog(os.devnull),
        ProgressBar(budget.max_steps, bar if dist.is_main else "off"),
        make_timer(
            measure.breakdown,
            device,
            waited=(lambda: dist.agreed_seconds) if dist.enabled else None,
        ),
        exclude_steps=3 if compiled else 1,
        flops_per_step=flops,
        peak=peak,
        sampler=sampler,
        cost=meter,
        budget_fraction=functools.partial(budget.fraction_done, progress),
        gather=gather,
        # FSDP's forward all-gathers parameters, waiting on the other ranks: not own work.
        work_phases=() if dist.strategy == "fsdp" else ("forward",),
        straggler_threshold=measure.straggler_threshold,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class SetUp:
    """The levers a run was set up with, as its diagnosis and summary name them."""

    allow_tf32: bool  # precision.allow_tf32
    compiled: bool  # compile.mode is not "off"
    checkpointing: str  # activation_checkpointing.policy


def diagnose_run(
    monitor: RunMonitor,
    device: torch.device,
    precision: Precision,
    *,
    flops: Any,
    micro: int,
    accumulation: int,
    num_workers: int,
    worker_choice: WorkerChoice | None,
    set_up: SetUp,
) -> Any:
    """The bottleneck and what to do about it, from what this run measured. Ten parameters:
    what the run measured and how it was set up, each a figure of the diagnosis."""
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
        tf32=cuda and set_up.allow_tf32,
        native_bf16=native_bf16(device),
        compiled=set_up.compiled,
        activation_checkpointing=set_up.checkpointing,
        aten_ops_per_step=flops.ops * accumulation if flops else None,
        activation_bytes=float(flops.activation_bytes) if flops else None,
        peak_memory_bytes=float(torch.cuda.max_memory_allocated(device)) if cuda else None,
        device_memory_bytes=(
            float(torch.cuda.get_device_properties(device).total_memory) if cuda else None
        ),
    )
