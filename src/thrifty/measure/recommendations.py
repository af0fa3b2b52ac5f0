"""What to change, given a diagnosed step: each recommendation quotes the measured numbers it
rests on and says its expected effect.

They are ordered data → memory → compute: a starved device gains nothing from faster kernels,
and memory headroom decides which compute levers fit. Storage stalls (checkpoint saves) count
as data. When each applies:

- data: data wait ≥ 10% of the step → num_workers = ⌈seconds one process takes to produce a
  batch ÷ compute seconds per batch⌉ (a measured worker count that keeps up, if smaller),
  capped at the CPUs less one for the training loop; copies ≥ 10% → pinned, non-blocking,
  compact copies; checkpoint stalls ≥ 5% → save less often or asynchronously.
- memory: peak ≥ 85% of device memory without activation checkpointing → every_other and the
  micro-batch that then fits in 85%; ≤ 50% with checkpointing on → turn it off; memory-bound →
  compile to fuse elementwise chains; overhead-bound with ≤ 50% used → a larger micro-batch.
- compute: fp32 matmuls on hardware with native bf16 → bf16 (fp16 on a GPU without bf16);
  overhead-bound → compile (reduce-overhead when already compiled), fewer host syncs when the
  loop itself is the overhead; compute-bound → the levers left are FLOPs and price.
- a straggler (several ranks) comes first of its area: data when its lag is mostly fetching
  (more loader workers on that node, its storage and CPU load), compute otherwise (that node's
  accelerator: clocks, temperature, throttling, other processes; or replace the instance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from thrifty.measure.evidence import Evidence
from thrifty.measure.evidence import ms as _ms
from thrifty.measure.evidence import pct as _pct
from thrifty.measure.evidence import us as _us

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
    """One change to make: what to do (with the numbers it rests on) and what it should buy."""

    text: str
    expected: str
    area: Area


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
        _compile_for_overhead(e, bottleneck),
        _loop_overhead(e, shares, bottleneck),
        _compute_bound_levers(e, bottleneck),
    )
    found = [r for r in candidates if r is not None]
    return sorted(found, key=lambda r: _AREA_ORDER[r.area])  # stable within an area


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
    share = shares["data_wait"]
    s = e.straggler
    if s is not None and s.data_bound and s.data_lag_seconds:
        # This rank's data wait holds its wait for the straggler's loader, which has its own
        # recommendation: only the rest is this rank's to shorten.
        share = max(0.0, share - s.data_lag_seconds / e.step_seconds)
    if share < WORTH_A_RECOMMENDATION:
        return None
    wait = f"data wait is {_pct(share)} of step time"
    per_batch = max((e.step_seconds - e.data_wait_seconds) / e.accumulation_steps, 1e-9)
    produce, how = _seconds_to_produce_a_batch(e, per_batch)
    if produce is None:
        return Recommendation(
            f"{wait}: raise data.num_workers (each worker prepares batches in parallel)",
            "the wait shrinks roughly in proportion to the workers added, while CPUs last",
            "data",
        )
    need = max(1, math.ceil(produce / per_batch))
    keeps_up = [
        n
        for n, s in (e.fetch_seconds_per_batch or {}).items()
        if s <= per_batch and n > (e.num_workers or 0)
    ]
    if keeps_up:  # a measured count beats the proportional estimate
        need = min(need, min(keeps_up))
    cap = max(1, e.cpus - 1) if e.cpus else None  # one CPU stays with the training loop
    suggested = min(need, cap) if cap is not None else need
    numbers = f"{how}, compute {_ms(per_batch)}/batch"
    current = e.num_workers
    if current is not None and suggested <= current:
        return Recommendation(
            f"{wait} with num_workers = {current} already at the CPU limit ({e.cpus} CPUs, one "
            "left to the training loop): make items cheaper — cache decoded samples, pre-process "
            "offline — or use a machine with more CPUs",
            f"the loader needs about {need} workers to keep up ({numbers})",
            "data",
        )
    new_wait = max(0.0, produce / suggested - per_batch) * e.accumulation_steps
    new_step = e.step_seconds - e.data_wait_seconds + min(new_wait, e.data_wait_seconds)
    capped = ""
    if cap is not None and need > cap:
        capped = (
            f" — capped at {cap} of {e.cpus} CPUs, one left to the training loop; {need} would "
            "keep up, so also make items cheaper (cache decoded samples, pre-process offline) "
            "or use more CPUs"
        )
    start = f"from {current} " if current is not None else ""
    return Recommendation(
        f"{wait}: raise data.num_workers {start}to {suggested} ({numbers}){capped}",
        f"data wait {_pct(share)} → ~{_pct(min(new_wait, e.data_wait_seconds) / new_step)}; "
        f"step {_ms(e.step_seconds)} → ~{_ms(new_step)} ({e.step_seconds / new_step:.1f}× faster)",
        "data",
    )


def _seconds_to_produce_a_batch(e: Evidence, per_batch: float) -> tuple[float | None, str]:
    """Seconds one loader process takes to produce one batch, and how that was found."""
    fetch = e.fetch_seconds_per_batch or {}
    if 0 in fetch:
        return fetch[0], f"measured fetch {_ms(fetch[0])}/batch in one process"
    if fetch:
        n = min(k for k in fetch if k > 0)
        return n * fetch[n], f"measured fetch {_ms(fetch[n])}/batch with {n} workers"
    if e.num_workers is None:
        return None, ""
    wait = e.data_wait_seconds / e.accumulation_steps
    if e.num_workers == 0:  # the main process fetches: the wait is the fetch
        return wait, f"fetch {_ms(wait)}/batch in the training process"
    # n workers deliver a batch every (compute + wait) seconds: each takes n times that.
    produce = e.num_workers * (per_batch + wait)
    return produce, f"fetch ~{_ms(produce)}/batch per worker, estimated from the wait"


def _pinned_copies(e: Evidence, shares: dict[str, float]) -> Recommendation | None:
    share = shares["host_to_device"]
    if share < WORTH_A_RECOMMENDATION:
        return None
    return Recommendation(
        f"host→device copies are {_pct(share)} of step time "
        f"({_ms(e.host_to_device_seconds)}/step): pin host memory (data.pin_memory = true) and "
        "copy with non_blocking=True; send compact dtypes (uint8 images, int32 token ids) and "
        "convert on the device",
        f"copies overlap compute: up to {_pct(share)} of step time back",
        "data",
    )


def _checkpoint_stalls(e: Evidence, shares: dict[str, float]) -> Recommendation | None:
    share = shares["checkpoint"]
    if share < CHECKPOINT_SHARE:
        return None
    return Recommendation(
        f"checkpoint saves stall {_pct(share)} of step time: save less often (the Young/Daly "
        "interval for your interruption rate) or save asynchronously (only the device→host "
        "copy then stalls)",
        f"up to {_pct(share)} of step time back",
        "data",
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
    if recomputed is not None and e.forward_seconds > 0:
        expected = (
            f"~{_pct(recomputed * e.forward_seconds / e.step_seconds)} of step time back "
            "(the forward it recomputes)"
        )
    return Recommendation(
        f"memory is only {_pct(fraction)} full with activation checkpointing "
        f"{e.activation_checkpointing}: turn it off (activation_checkpointing.policy = off)",
        expected,
        "memory",
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
    return Recommendation(
        f"{_pct(share)} of step time ({_ms(share * e.step_seconds)}) is outside data, copies "
        "and compute: read losses less often (run.log_every), avoid .item()/.cpu() every step, "
        "move per-step Python work out of the loop",
        f"up to {_pct(share)} of step time back",
        "compute",
    )


def _compute_bound_levers(e: Evidence, bottleneck: Bottleneck) -> Recommendation | None:
    if bottleneck != "compute_bound" or (e.precision == "fp32" and e.native_bf16):
        return None
    return Recommendation(
        "the step is compute-bound: the levers left cut FLOPs or their price — stop when the "
        "validation loss stops improving (early stopping), size the model for the budget "
        "(thrifty plan), run on spot instances",
        "same step time; fewer steps or cheaper hours",
        "compute",
    )
