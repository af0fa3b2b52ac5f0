"""Where a training step's time goes, what limits it, and what to change first.

`diagnose(evidence)` classifies a job into one of five bottlenecks from measured facts —
per-phase seconds of the step, FLOPs and aten ops per step, MFU, memory, utilization — and
returns ordered recommendations, each quoting the numbers it rests on and its expected effect.

The rules, in order (the first that holds wins):

1. **Time outside compute.** The step's shares are measured per phase. Among the shares that
   are not compute, the largest that reaches its threshold names the bottleneck:
   data wait ≥ 25% → `data_loading` (the device idles waiting for the next batch);
   host→device copies ≥ 20% → `host_to_device`; unattributed "other" time ≥ 25% →
   `overhead_bound` (Python in the loop, host syncs, logging). Checkpoint saves are reported
   and get a recommendation, but do not name the bottleneck: they are a chosen cost, not a
   limit of the step.
2. **Compute is most of the step.** Then what limits compute, judged on compute time only
   (MFU × step ÷ compute seconds, so a data wait below the threshold does not blur it):
   compute-time MFU ≥ 30% → `compute_bound` (the ideal: the matmul units are busy; 30% is
   where well-tuned large-model training sits, e.g. nanoGPT 124M ≈ 37% of an A100);
   else forward+backward seconds per aten op < 20 µs, or a GPU busy < 50% of the time while
   nothing else waits → `overhead_bound` (each op is too small to amortize its launch and
   dispatch: a kernel launch costs ~5–10 µs, eager dispatch a few µs more);
   else → `memory_bound` (ops are not tiny, yet the matmul units are mostly idle: elementwise
   and normalization ops, limited by memory bandwidth, dominate).
   With no MFU (no FLOP count or no peak), a step that is not overhead-bound is reported as
   `compute_bound`, and the evidence says that compute- and memory-bound could not be told
   apart.

With several ranks, a straggler (`thrifty.measure.stragglers`: one rank slower than the others
at its own work, interval after interval, by more than `measure.straggler_threshold`) is named
beside the bottleneck, with what the other ranks' wait for it costs.

Recommendations (`thrifty.measure.recommendations`) are ordered data → memory → compute, and
none goes against the measurement: a gain is recommended only when it exceeds the noise of the
figures it rests on (their spread across logging intervals, quoted as ±), and on a CPU bf16
and torch.compile only where a measurement showed them faster.

Units: seconds per optimizer step (means over the measured steps), bytes, FLOPs per step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from thrifty.measure.evidence import COMPUTE_PHASES, PHASES, Evidence, LeverMeasurement
from thrifty.measure.evidence import gib as _gib
from thrifty.measure.evidence import ms as _ms
from thrifty.measure.evidence import pct as _pct
from thrifty.measure.evidence import us as _us
from thrifty.measure.recommendations import Recommendation, recommend, unmeasured_on_cpu

__all__ = [
    "BOTTLENECKS",
    "PHASES",
    "Bottleneck",
    "Diagnosis",
    "Evidence",
    "LeverMeasurement",
    "Recommendation",
    "diagnose",
]

Bottleneck = Literal[
    "data_loading", "host_to_device", "memory_bound", "compute_bound", "overhead_bound"
]
BOTTLENECKS: tuple[str, ...] = (
    "data_loading",
    "host_to_device",
    "memory_bound",
    "compute_bound",
    "overhead_bound",
)

# Thresholds (fractions of step time unless said); the module docstring says why each.
DATA_WAIT_SHARE = 0.25
HOST_TO_DEVICE_SHARE = 0.20
OTHER_SHARE = 0.25
COMPUTE_BOUND_MFU = 0.30
TINY_OP_SECONDS = 20e-6
LOW_GPU_UTIL_PERCENT = 50.0
SWING_STD_PERCENT = 25.0  # utilization std (percentage points) that counts as oscillating
# A busy machine: more threads waiting to run than half again the CPUs, a hypervisor giving
# the CPUs to other guests, or a logging interval's steps three times slower than another's.
BUSY_LOAD_PER_CPU = 1.5
BUSY_STEAL_PERCENT = 5.0
BUSY_SWING = 3.0


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """The bottleneck, the measured facts behind it, and the changes to make, in order."""

    bottleneck: Bottleneck
    evidence: list[str]
    recommendations: list[Recommendation]
    breakdown: dict[str, float]
    mfu: float | None
    measured: Evidence | None = field(default=None, repr=False)
    busy: str | None = None  # the line that names a busy machine, when it was one

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: bottleneck, evidence, recommendations, breakdown, mfu and the inputs."""
        out: dict[str, Any] = {
            "bottleneck": self.bottleneck,
            "evidence": list(self.evidence),
            "recommendations": [asdict(r) for r in self.recommendations],
            "breakdown": dict(self.breakdown),
            "mfu": self.mfu,
            "busy": self.busy,
        }
        if self.measured is not None:
            measured = asdict(self.measured)
            fetch = measured.get("fetch_seconds_per_batch")
            if fetch is not None:  # JSON object keys are strings
                measured["fetch_seconds_per_batch"] = {str(k): v for k, v in fetch.items()}
            out["measured"] = measured
            if self.measured.rank_work_seconds is not None:  # several ranks were compared
                straggler = self.measured.straggler
                out["straggler"] = asdict(straggler) if straggler is not None else None
        return out


def diagnose(evidence: Evidence) -> Diagnosis:
    """Classify what limits the step and list what to change, data → memory → compute."""
    shares = evidence.breakdown()
    bottleneck, reason = _classify(evidence, shares)
    recommendations = recommend(evidence, shares, bottleneck)
    busy = busy_machine(evidence)
    return Diagnosis(
        bottleneck=bottleneck,
        evidence=[
            reason,
            *([busy] if busy else []),
            *_facts(evidence, shares),
            *_lever_facts(evidence, bottleneck),
        ],
        recommendations=recommendations,
        breakdown=shares,
        mfu=evidence.mfu,
        measured=evidence,
        busy=busy,
    )


def busy_machine(e: Evidence) -> str | None:
    """One line that names a busy machine (the load above the CPUs, steal time) or a throughput
    that swings between logging intervals, or None. Either skews every figure of the run, and
    the bottleneck the diagnosis finds may be the machine's, not the run's."""
    shared = []
    if e.load_per_cpu is not None and e.load_per_cpu > BUSY_LOAD_PER_CPU:
        shared.append(f"a load average of {e.load_per_cpu:.1f} threads per CPU")
    if e.steal_percent is not None and e.steal_percent >= BUSY_STEAL_PERCENT:
        shared.append(f"{e.steal_percent:.0f}% of the CPU time stolen by the hypervisor")
    swing = []
    if e.step_swing is not None and e.step_swing >= BUSY_SWING:
        swing.append(f"steps {e.step_swing:.0f}x slower in one logging interval than in another")
    if shared:
        return (
            f"the machine was busy ({', '.join(shared + swing)}): other work took the run's CPU "
            "time, so these figures and this diagnosis measure the machine as much as the run; "
            "measure again on a machine of its own"
        )
    if swing:
        return (
            f"the throughput swung ({swing[0]}): something took the run's time in bursts (other "
            "work on the machine, a loader that stalls, a throttled clock), so these figures "
            "are means over unlike intervals and this diagnosis may blame the wrong part; "
            "measure again on a quiet machine"
        )
    return None


# --- classification ---------------------------------------------------------------------------


def _classify(e: Evidence, shares: dict[str, float]) -> tuple[Bottleneck, str]:
    waits: list[tuple[float, Bottleneck, str]] = []
    if shares["data_wait"] >= DATA_WAIT_SHARE:
        waits.append((shares["data_wait"], "data_loading", "waiting for batches"))
    if shares["host_to_device"] >= HOST_TO_DEVICE_SHARE:
        waits.append((shares["host_to_device"], "host_to_device", "copying batches to the device"))
    if shares["other"] >= OTHER_SHARE:
        waits.append(
            (
                shares["other"],
                "overhead_bound",
                "outside data, copies and compute (Python in the loop, host syncs, logging)",
            )
        )
    if waits:
        share, bottleneck, what = max(waits, key=lambda w: w[0])
        return bottleneck, f"{_pct(share)} of step time is spent {what}"

    compute = sum(shares[p] for p in COMPUTE_PHASES)
    lead = f"compute is {_pct(compute)} of step time"
    mfu, per_op = e.compute_mfu, e.seconds_per_op
    if mfu is not None and mfu >= COMPUTE_BOUND_MFU:
        return "compute_bound", (
            f"{lead} and runs at {_pct(mfu)} of peak (≥ {_pct(COMPUTE_BOUND_MFU)}): "
            "the matmul units are busy"
        )
    if per_op is not None and per_op < TINY_OP_SECONDS:
        return "overhead_bound", (
            f"{lead}, but each of its {e.aten_ops_per_step:,} aten ops takes "
            f"{_us(per_op)} on average (< {_us(TINY_OP_SECONDS)}): launch and dispatch "
            "overhead, not arithmetic, sets the step time"
        )
    idle_gpu = (
        e.device_type == "cuda"
        and e.gpu_util_mean is not None
        and e.gpu_util_mean < LOW_GPU_UTIL_PERCENT
    )
    if idle_gpu:
        return "overhead_bound", (
            f"{lead}, yet the GPU is busy only {e.gpu_util_mean:.0f}% of the time: the host "
            "cannot issue work fast enough"
        )
    if mfu is None:
        return "compute_bound", (
            f"{lead}; with no MFU (no FLOP count or no peak) compute- and memory-bound cannot be "
            "told apart"
        )
    return "memory_bound", (
        f"{lead} but runs at only {_pct(mfu)} of peak with ops that are not tiny"
        + (f" ({_us(per_op)} each)" if per_op is not None else "")
        + ": memory-bandwidth-bound ops (elementwise, normalization) dominate"
    )


def _facts(e: Evidence, shares: dict[str, float]) -> list[str]:
    facts = [
        f"step {e.figure('step')} over {e.steps} measured step(s): "
        + ", ".join(f"{p.replace('_', ' ')} {_pct(s)}" for p, s in shares.items()),
        *_noise_fact(e),
    ]
    if e.mfu is not None:
        facts.append(
            f"MFU {_pct(e.mfu)} over the whole step"
            + (f", {_pct(e.compute_mfu)} over compute time" if e.compute_mfu is not None else "")
            + (f" (peak: {e.peak_source})" if e.peak_source else "")
        )
    if e.flops_per_step is not None:
        facts.append(f"{e.flops_per_step / 1e9:,.3g} GFLOP per step")
    if e.aten_ops_per_step:
        per_op = e.seconds_per_op
        facts.append(
            f"{e.aten_ops_per_step:,} aten ops per step (forward + backward)"
            + (f", {_us(per_op)} each on average" if per_op is not None else "")
        )
    if e.fetch_seconds_per_batch:
        measured = ", ".join(
            f"{n} worker{'s' if n != 1 else ''}: {_ms(s)}"
            for n, s in sorted(e.fetch_seconds_per_batch.items())
        )
        facts.append(f"measured fetch time per batch — {measured}")
    if e.num_workers is not None:
        facts.append(f"num_workers = {e.num_workers}" + (f" of {e.cpus} CPUs" if e.cpus else ""))
    tf32 = e.tf32 and e.precision == "fp32"
    facts.append(
        f"precision {e.precision}"
        + (" (TF32 matmuls allowed)" if tf32 else "")
        + ("; the hardware runs bf16 natively" if e.native_bf16 else "")
        + (
            f"; activation checkpointing {e.activation_checkpointing}"
            if e.activation_checkpointing != "off"
            else ""
        )
        + ("; compiled" if e.compiled else "")
    )
    fraction = e.memory_fraction
    if fraction is not None:
        facts.append(
            f"peak memory {_gib(e.peak_memory_bytes)} of {_gib(e.device_memory_bytes)} "
            f"({_pct(fraction)})"
        )
    for label, mean, std in (
        ("GPU", e.gpu_util_mean, e.gpu_util_std),
        ("CPU", e.cpu_util_mean, e.cpu_util_std),
    ):
        if mean is None:
            continue
        fact = f"{label} utilization {mean:.0f}%" + (f" ± {std:.0f}%" if std is not None else "")
        if label == "GPU" and std is not None and std >= SWING_STD_PERCENT:
            fact += ": it swings, the signature of a starved loader"
        facts.append(fact)
    return facts + _rank_facts(e)


def _noise_fact(e: Evidence) -> list[str]:
    """What the ± figures are."""
    if e.spread_seconds is None:
        return []
    windows = e.spread_windows or 0
    if windows >= 2:
        return [
            f"± is the noise: how far a figure's mean per step moved between the {windows} "
            "logging intervals (standard deviation); a gain smaller than it is not recommended"
        ]
    return [
        "± is the noise: with a single logging interval, the step time's spread from step to "
        "step stands for every figure; a gain smaller than it is not recommended"
    ]


def _lever_facts(e: Evidence, bottleneck: Bottleneck) -> list[str]:
    """Levers measured without and with, and the ones left unrecommended on a CPU for want of
    a measurement (where a GPU would have had them recommended)."""
    facts = []
    for lever, label, baseline in (("bf16", "bf16", "in fp32"), ("compile", "compiled", "eager")):
        m = e.lever(lever)
        if m is not None:
            verdict = "faster" if m.faster else "not faster by more than the noise"
            facts.append(f"{m.describe(label, baseline)}: {verdict}")
    unmeasured = []
    if e.precision == "fp32" and e.native_bf16 and unmeasured_on_cpu(e, "bf16"):
        unmeasured.append("bf16")
    slow_ops = bottleneck in ("memory_bound", "overhead_bound")
    if slow_ops and not e.compiled and unmeasured_on_cpu(e, "compile"):
        unmeasured.append("torch.compile")
    if unmeasured:
        what = " and ".join(unmeasured)
        facts.append(
            f"{what} not recommended: on a CPU they are often slower, and only a measurement "
            "tells — thrifty tune CONFIG.toml --levers precision,compile measures them"
        )
    return facts


def _rank_facts(e: Evidence) -> list[str]:
    """Each rank's own work per step and, when one holds the others up, the straggler."""
    if e.rank_work_seconds is None:
        return []
    facts = [
        "own work per step, in rank order (what each rank does outside its waits for the "
        "others): " + ", ".join(_ms(s) for s in e.rank_work_seconds)
    ]
    s = e.straggler
    if s is not None:
        others = s.ranks - 1
        cost = f" (${s.usd:,.4f})" if s.usd is not None else ""
        facts.append(
            f"rank {s.rank} is a straggler: its own work takes {_ms(s.lag_seconds)} more per "
            f"step than the other ranks' median, which makes every step {_pct(s.lag)} longer "
            f"than theirs (threshold {_pct(s.threshold)}), and it was the slowest in "
            f"{s.slowest_intervals} of {s.intervals} logging intervals; the other {others} "
            f"rank{'s' if others != 1 else ''} waited {s.idle_gpu_seconds:,.1f} GPU-seconds "
            f"for it over {s.steps} steps{cost}"
        )
    return facts
