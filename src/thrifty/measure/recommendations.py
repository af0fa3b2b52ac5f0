"""What to change, given a diagnosed step: each recommendation quotes the measured numbers it
rests on (in its text, and as `figures` in diagnosis.json) and says its expected effect.

None recommends against its own measurement. A step-time gain is recommended only when it
exceeds the noise of the figures it rests on (their spread across logging intervals:
`Evidence.noise`), and a lever measured without and with (`Evidence.lever_measurements`) is
recommended only where it measured faster by more than that measurement's noise. On a CPU,
bf16 and torch.compile are recommended only so: they are often slower there, and no peak
ratio predicts which.

They are ordered data → memory → compute: a starved device gains nothing from faster kernels,
and memory headroom decides which compute levers fit. Storage stalls (checkpoint saves) count
as data. When each applies:

- data: data wait ≥ 10% of the step and above its noise → num_workers = ⌈seconds one process
  takes to produce a batch ÷ (compute + handoff) seconds per batch⌉ (a measured worker count
  that keeps up, if smaller), capped at the CPUs less one for the training loop — when the
  step modelled with them (`thrifty.measure.loader_workers`: what taking a batch from a
  worker costs included) is faster by more than the step's noise; copies ≥ 10% → pinned,
  non-blocking, compact copies; checkpoint stalls ≥ 5% → save less often or asynchronously
  (a save's stall is counted, not sampled: its spread is its period, not noise).
- memory: peak ≥ 85% of device memory without activation checkpointing → every_other and the
  micro-batch that then fits in 85%; ≤ 50% with checkpointing on → turn it off; memory-bound →
  compile to fuse elementwise chains; overhead-bound with ≤ 50% used → a larger micro-batch.
- compute: bf16 or compile measured faster → that lever, with the measurement; unmeasured on
  a GPU: fp32 matmuls on hardware with native bf16 → bf16 (fp16 on a GPU without bf16),
  overhead-bound → compile (reduce-overhead when already compiled); fewer host syncs when the
  loop itself is the overhead; compute-bound → the levers left are FLOPs and price.
- a straggler (several ranks) comes first of its area: data when its lag is mostly fetching
  (more loader workers on that node, its storage and CPU load), compute otherwise (that node's
  accelerator: clocks, temperature, throttling, other processes; or replace the instance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from thrifty.measure.evidence import Evidence, LeverMeasurement, plus_minus
from thrifty.measure.evidence import ms as _ms
from thrifty.measure.evidence import pct as _pct
from thrifty.measure.evidence import us as _us
from thrifty.measure.loader_workers import WorkerModel, model_workers

if TYPE_CHECKING:
    from thrifty.measure.diagnosis import Bottleneck

Area = Literal["data", "memory", "compute"]
_AREA_ORDER = {"data": 0, "memory": 1, "compute": 2}

WORTH_A_RECOMMENDATION = 0.10  # a non-compute share of the step below this is not worth acting on
CHECKPOINT_SHARE = 0.05
MEMORY_FULL = 0.85  # peak ÷ device memory: little room left
MEMORY_ROOMY = 0.50  # peak ÷ device memory: room for a larger micro-batch
MEMORY_TARGET = 0.85  # what a suggested micro-batch may fill
# every_other checkpoints half the blocks; a checkpointed transformer block keeps only its
# input, 2 of its ~34 activation bytes per (token × hidden) (Korthikanti et al. 2022), so
# about half × 94% of block activations go: ~45% of all activations with embeddings and loss.
EVERY_OTHER_FREES = 0.45


@dataclass(frozen=True, slots=True)
class Recommendation:
    """One change to make: what to do (with the numbers it rests on) and what it should buy.
    `figures`: those numbers by name (seconds per step unless the name says otherwise; a
    `*_noise_seconds` is the spread of the figure it follows)."""

    text: str
    expected: str
    area: Area
    figures: dict[str, float] = field(default_factory=dict)


def recommend(
    e: Evidence, shares: dict[str, float], bottleneck: Bottleneck
) -> list[Recommendation]:
    """The recommendations that apply, ordered data → memory → compute."""
    candidates = (
        _straggler(e),
        _more_workers(e, shares),
        _pinned_copies(e, shares),
        _checkpoint_stalls(e, shares),
        _activation_checkpointing(e),
        _checkpointing_off(e),
        _fusion_for_memory(e, bottleneck),
        _larger_micro_batch(e, bottleneck),
        _lower_precision(e, bottleneck),
        _measured_compile(e),
        _compile_for_overhead(e, bottleneck),
        _loop_overhead(e, shares, bottleneck),
        _compute_bound_levers(e, bottleneck),
    )
    found = [r for r in candidates if r is not None]
    return sorted(found, key=lambda r: _AREA_ORDER[r.area])  # stable within an area


def _noise(e: Evidence, name: str) -> float | None:
    """`name`'s noise for a message: None (no ±) where no spread was measured."""
    return e.noise(name) if e.spread_seconds is not None else None


def _beyond_noise(e: Evidence, gain_seconds: float, *names: str) -> bool:
    """Whether a gain of `gain_seconds` per step exceeds the noise of each figure it rests
    on and of the step, where it would be seen when measured again."""
    return gain_seconds > max(e.noise(name) for name in (*names, "step"))


def unmeasured_on_cpu(e: Evidence, lever: str) -> bool:
    """Whether `lever` (compile or bf16) goes unrecommended for want of a measurement: on a
    CPU only a measurement says whether it pays."""
    return e.device_type == "cpu" and e.lever(lever) is None


def _straggler(e: Evidence) -> Recommendation | None:
    s = e.straggler
    if s is None:
        return None
    lag = (
        f"rank {s.rank} is {_ms(s.lag_seconds)} slower per step at its own work, every step "
        f"{_pct(s.lag)} longer for it"
    )
    saved = s.lag_seconds / e.step_seconds
    cost = f" (${s.usd:,.4f} so far)" if s.usd is not None else ""
    expected = (
        f"every rank's step ~{_ms(s.lag_seconds)} shorter (~{_pct(saved)} of step time), and "
        f"the {s.idle_gpu_seconds:,.1f} GPU-seconds{cost} the others spent waiting back"
    )
    if s.data_bound:
        return Recommendation(
            f"{lag}, {_ms(s.data_lag_seconds or 0.0)} of it fetching data: give that node's "
            "loader more workers (data.num_workers), check its storage or network reads and "
            "what else loads its CPUs",
            expected,
            "data",
        )
    where = (
        "in its forward"
        if s.data_lag_seconds is None
        else f"mostly outside fetching data ({_ms(max(0.0, s.data_lag_seconds))} of it)"
    )
    return Recommendation(
        f"{lag}, {where}: check that node's accelerator (nvidia-smi -q: clocks, "
        "temperature and throttle reasons, ECC errors, other processes on it) and its host's "
        "load, or replace the instance",
        expected,
        "compute",
    )


def _more_workers(e: Evidence, shares: dict[str, float]) -> Recommendation | None:
    """More loader workers, only where the wait is a real share of the step, exceeds its noise,
    and the modelled step with the workers (handoff included) is faster by more than the
    step's noise."""
    share, wait = shares["data_wait"], e.data_wait_seconds
    s = e.straggler
    if s is not None and s.data_bound and s.data_lag_seconds:
        # This rank's data wait holds its wait for the straggler's loader, which has its own
        # recommendation: only the rest is this rank's to shorten.
        share = max(0.0, share - s.data_lag_seconds / e.step_seconds)
        wait = max(0.0, wait - s.data_lag_seconds)
    if share < WORTH_A_RECOMMENDATION or wait <= e.noise("data_wait"):
        return None
    model = model_workers(e, wait)
    measured = (
        f"data wait is {_pct(share)} of step time ({plus_minus(wait, _noise(e, 'data_wait'))} "
        f"of {e.figure('step')} per step)"
    )
    figures = {**e.figures("data_wait", "step"), "data_wait_seconds": wait}
    if model.produce is None:
        if wait / e.accumulation_steps <= model.handoff:
            return None  # a worker's handoff alone would cost what the wait does
        return Recommendation(
            f"{measured}: raise data.num_workers (each worker prepares batches in parallel)",
            "the wait shrinks roughly in proportion to the workers added, while CPUs last",
            "data",
            figures,
        )
    return _worker_count(e, model, measured, share, figures)


def _worker_count(
    e: Evidence, model: WorkerModel, measured: str, share: float, figures: dict[str, float]
) -> Recommendation | None:
    need = model.needed()
    keeps_up = model.keep_up(e.num_workers or 0)
    if keeps_up:  # a measured count beats the proportional estimate
        need = min(need, keeps_up[0])
    cap = max(1, e.cpus - 1) if e.cpus else None  # one CPU stays with the training loop
    suggested = min(need, cap) if cap is not None else need
    numbers = f"{model.how}, compute {_ms(model.compute)}/batch, {model.handoff_how}"
    figures |= {
        "produce_seconds_per_batch": model.produce or 0.0,
        "compute_seconds_per_batch": model.compute,
        "handoff_seconds_per_batch": model.handoff,
    }
    current = e.num_workers
    if current is not None and suggested <= current:
        if cap is None or current < cap:
            return None  # more workers than these would not shorten the step
        return Recommendation(
            f"{measured} with num_workers = {current} already at the CPU limit ({e.cpus} CPUs, "
            "one left to the training loop): make items cheaper — cache decoded samples, "
            "pre-process offline — or use a machine with more CPUs",
            f"the loader needs about {need} workers to keep up ({numbers})",
            "data",
            figures,
        )
    new_step = model.batch_seconds(suggested) * e.accumulation_steps
    if e.step_seconds - new_step <= e.noise("step"):
        return None  # the model says no faster, or faster by less than the step varies
    new_wait = max(0.0, new_step - model.compute * e.accumulation_steps)
    capped = ""
    if cap is not None and need > cap:
        capped = (
            f" — capped at {cap} of {e.cpus} CPUs, one left to the training loop; {need} would "
            "keep up, so also make items cheaper (cache decoded samples, pre-process offline) "
            "or use more CPUs"
        )
    start = f"from {current} " if current is not None else ""
    figures["modelled_step_seconds"] = new_step
    return Recommendation(
        f"{measured}: raise data.num_workers {start}to {suggested} ({numbers}){capped}",
        f"data wait {_pct(share)} → ~{_pct(new_wait / new_step)}; step {e.figure('step')} → "
        f"~{_ms(new_step)} modelled ({e.step_seconds / new_step:.1f}× faster)",
        "data",
        figures,
    )


def _pinned_copies(e: Evidence, shares: dict[str, float]) -> Recommendation | None:
    share = shares["host_to_device"]
    if share < WORTH_A_RECOMMENDATION or not _beyond_noise(
        e, e.host_to_device_seconds, "host_to_device"
    ):
        return None
    return Recommendation(
        f"host→device copies are {_pct(share)} of step time "
        f"({e.figure('host_to_device')} of {e.figure('step')} per step): pin host memory "
        "(data.pin_memory = true) and "
        "copy with non_blocking=True; send compact dtypes (uint8 images, int32 token ids) and "
        "convert on the device",
        f"copies overlap compute: up to {_pct(share)} of step time back",
        "data",
        e.figures("host_to_device", "step"),
    )


def _checkpoint_stalls(e: Evidence, shares: dict[str, float]) -> Recommendation | None:
    share = shares["checkpoint"]
    if share < CHECKPOINT_SHARE:
        return None
    # Not weighed against noise: the stall is each save's own time, counted; intervals with
    # and without a save differ by it, which is its period, not noise.
    return Recommendation(
        f"checkpoint saves stall {_pct(share)} of step time ({_ms(e.checkpoint_seconds)} of "
        f"{e.figure('step')} per step, on average over the saves): save less often (the "
        "Young/Daly interval for your interruption rate) or save asynchronously (only the "
        "device→host copy then stalls)",
        f"up to {_pct(share)} of step time back",
        "data",
        e.figures("checkpoint", "step"),
    )


def _activation_checkpointing(e: Evidence) -> Recommendation | None:
    fraction = e.memory_fraction
    if fraction is None or fraction < MEMORY_FULL or e.activation_checkpointing != "off":
        return None
    text = (
        f"memory is {_pct(fraction)} full: activation checkpointing every_other frees "
        f"~{_pct(EVERY_OTHER_FREES)} of activation memory"
    )
    recompute = 0.5 * e.forward_seconds / e.step_seconds
    cost = f"costs ~{_pct(recompute)} more step time (half the forward recomputed)"
    fits = None
    if e.activation_bytes and e.micro_batch and e.peak_memory_bytes and e.device_memory_bytes:
        per_sample = (1 - EVERY_OTHER_FREES) * e.activation_bytes / e.micro_batch
        fixed = e.peak_memory_bytes - e.activation_bytes
        fits = math.floor((MEMORY_TARGET * e.device_memory_bytes - fixed) / per_sample)
    if fits is not None and e.micro_batch is not None and fits > e.micro_batch:
        text += f": micro-batch {e.micro_batch} → {fits} fits"
        expected = f"{fits / e.micro_batch:.1f}× the samples per step; {cost}"
    else:
        expected = f"room to raise the micro-batch or the model; {cost}"
    return Recommendation(
        text + " (activation_checkpointing.policy = every_other)", expected, "memory"
    )


def _checkpointing_off(e: Evidence) -> Recommendation | None:
    fraction = e.memory_fraction
    if fraction is None or fraction > MEMORY_ROOMY or e.activation_checkpointing == "off":
        return None
    recomputed = {"all": 1.0, "every_other": 0.5}.get(e.activation_checkpointing)
    if e.activation_checkpointing.startswith("every_nth:"):
        recomputed = 1.0 / max(1, int(e.activation_checkpointing.split(":")[1]))
    expected = "its recomputation in backward disappears"
    figures = e.figures("forward", "step")
    if recomputed is not None and e.forward_seconds > 0:
        gain = recomputed * e.forward_seconds
        if not _beyond_noise(e, gain, "forward"):
            return None
        figures["modelled_gain_seconds"] = gain
        expected = (
            f"~{_pct(gain / e.step_seconds)} of step time back ({_ms(gain)} of "
            f"{e.figure('step')}: the forward it recomputes)"
        )
    return Recommendation(
        f"memory is only {_pct(fraction)} full with activation checkpointing "
        f"{e.activation_checkpointing}: turn it off (activation_checkpointing.policy = off)",
        expected,
        "memory",
        figures,
    )


def _fusion_for_memory(e: Evidence, bottleneck: Bottleneck) -> Recommendation | None:
    if bottleneck != "memory_bound":
        return None
    if e.compiled:
        return Recommendation(
            "memory-bandwidth-bound while compiled: look for unfused elementwise chains "
            "(graph breaks: TORCH_LOGS=graph_breaks) and use fused kernels (fused AdamW, "
            "flash attention)",
            "fewer trips through memory per step",
            "memory",
        )
    if e.lever("compile") is not None or unmeasured_on_cpu(e, "compile"):
        return None  # measured: _measured_compile decides; on a CPU, only a measurement does
    return Recommendation(
        "memory-bandwidth-bound: compile the model (compile.mode = default) so chains of "
        "elementwise ops fuse into kernels that read and write memory once",
        f"fewer trips through memory; at {_pct(e.compute_mfu or 0.0)} of peak, several-fold "
        "headroom before compute limits",
        "memory",
    )


def _larger_micro_batch(e: Evidence, bottleneck: Bottleneck) -> Recommendation | None:
    if bottleneck != "overhead_bound" or not e.micro_batch:
        return None
    fraction = e.memory_fraction
    if fraction is not None and fraction > MEMORY_ROOMY:
        return None
    micro, peak, total = e.micro_batch, e.peak_memory_bytes, e.device_memory_bytes
    if fraction is not None and e.activation_bytes and peak and total:
        room = MEMORY_TARGET * total - peak
        target = micro + max(0, math.floor(room / (e.activation_bytes / micro)))
        where = f"memory is {_pct(fraction)} full"
    elif fraction is not None:  # assume all memory grows with the batch: a lower bound
        target = micro * 2 ** max(0, math.floor(math.log2(MEMORY_TARGET / fraction)))
        where = f"memory is {_pct(fraction)} full"
    else:
        target, where = micro * 4, "memory permitting"
    if target < 2 * micro:
        return None
    return Recommendation(
        f"overhead-bound: raise the micro-batch {micro} → {target} ({where}); each op then "
        "does more work for the same launch cost",
        f"up to {target / micro:.0f}× the samples per second at about the same step time "
        "(while per-op overhead dominates)",
        "memory",
    )


def _lower_precision(e: Evidence, bottleneck: Bottleneck) -> Recommendation | None:
    if e.precision != "fp32":
        return None
    measured = e.lever("bf16")
    if measured is not None:
        return _measured_lever(measured, "bf16", "in fp32", "precision.mode = bf16")
    if e.device_type == "cpu":
        return None  # on a CPU only a measurement says whether bf16 pays
    memory = " and halves activation memory" if (e.memory_fraction or 0) >= MEMORY_FULL else ""
    bandwidth = " and halves the bytes elementwise ops move" if bottleneck == "memory_bound" else ""
    if e.native_bf16:
        matmul = "tf32" if e.tf32 else "fp32"
        if e.bf16_speedup:
            speedup = f"about {e.bf16_speedup:.0f}× on the matmuls (bf16 peak ÷ {matmul} peak)"
        elif e.tf32:
            speedup = "about 2× on the matmuls (bf16 tensor cores run twice TF32)"
        else:
            speedup = "several times on the matmuls (bf16 units against fp32 ones)"
        return Recommendation(
            f"{matmul} matmuls on hardware with native bf16: precision.mode = bf16 "
            "(autocast; no loss scaling needed)",
            speedup + memory + bandwidth,
            "compute",
        )
    if e.device_type == "cuda":
        return Recommendation(
            "fp32 matmuls on a GPU without bf16: precision.mode = fp16 (autocast with a "
            "GradScaler) uses its fp16 tensor cores",
            "several times the fp32 matmul rate (T4: 65 vs 8 TFLOP/s)" + memory + bandwidth,
            "compute",
        )
    return None


def _compile_for_overhead(e: Evidence, bottleneck: Bottleneck) -> Recommendation | None:
    if bottleneck != "overhead_bound" or e.seconds_per_op is None:
        return None
    ops, per_op = e.aten_ops_per_step or 0, e.seconds_per_op
    overhead = f"{ops:,} ops × {_us(per_op)} = {_ms(ops * per_op)} per step"
    if not e.compiled:
        if e.lever("compile") is not None or unmeasured_on_cpu(e, "compile"):
            return None  # measured: _measured_compile decides; on a CPU, only a measurement does
        return Recommendation(
            f"many small ops ({overhead}): compile the model (compile.mode = default) to fuse "
            "them into fewer kernels",
            "the per-op share of the step shrinks with the op count",
            "compute",
        )
    if e.device_type == "cuda":
        return Recommendation(
            f"many small ops even compiled ({overhead}): compile.mode = reduce-overhead replays "
            "the step as CUDA graphs (one launch instead of thousands)",
            "launch overhead mostly gone",
            "compute",
        )
    return None


def _loop_overhead(
    e: Evidence, shares: dict[str, float], bottleneck: Bottleneck
) -> Recommendation | None:
    share = shares["other"]
    if share < WORTH_A_RECOMMENDATION or bottleneck != "overhead_bound":
        return None
    other = share * e.step_seconds
    if not _beyond_noise(e, other, "other"):
        return None
    return Recommendation(
        f"{_pct(share)} of step time ({plus_minus(other, _noise(e, 'other'))} of "
        f"{e.figure('step')}) is outside data, copies and compute: read losses less often "
        "(run.log_every), avoid .item()/.cpu() every step, move per-step Python work out of "
        "the loop",
        f"up to {_pct(share)} of step time back",
        "compute",
        {**e.figures("step"), "other_seconds": other, "other_noise_seconds": e.noise("other")},
    )


def _compute_bound_levers(e: Evidence, bottleneck: Bottleneck) -> Recommendation | None:
    if bottleneck != "compute_bound" or _lower_precision(e, bottleneck) is not None:
        return None
    return Recommendation(
        "the step is compute-bound: the levers left cut FLOPs or their price — stop when the "
        "validation loss stops improving (early stopping), size the model for the budget "
        "(thrifty plan), run on spot instances",
        "same step time; fewer steps or cheaper hours",
        "compute",
    )


def _measured_compile(e: Evidence) -> Recommendation | None:
    measured = e.lever("compile")
    if measured is None or e.compiled:
        return None
    return _measured_lever(measured, "compiled", "eager", "compile.mode = default")


def _measured_lever(
    m: LeverMeasurement, lever: str, baseline: str, setting: str
) -> Recommendation | None:
    """A lever measured without and with: recommended, with the figures, only where it saved
    more than the measurements' noise."""
    if not m.faster:
        return None
    return Recommendation(
        f"measured faster: {m.describe(lever, baseline)}: {setting}",
        f"{m.without_seconds / m.with_seconds:.2f}× faster per step ({_ms(m.gain_seconds)} "
        f"saved, more than the measurements' noise of {_ms(m.noise_seconds)})",
        "compute",
        {
            "without_seconds": m.without_seconds,
            "without_noise_seconds": m.without_noise,
            "with_seconds": m.with_seconds,
            "with_noise_seconds": m.with_noise,
        },
    )
