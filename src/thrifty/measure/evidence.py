"""The measured facts a diagnosis reads: per-phase seconds of a training step and how much
they vary, FLOPs, MFU, memory, utilization, levers measured with and without — and how they
are worded.

Units: seconds per optimizer step (means over the measured steps), bytes, FLOPs per step,
utilization in percent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from thrifty.errors import ThriftyError
from thrifty.measure.stragglers import Straggler

PHASES = ("data_wait", "host_to_device", "forward", "backward", "optimizer", "checkpoint", "other")
COMPUTE_PHASES = ("forward", "backward", "optimizer")
LEVERS_MEASURED = ("compile", "bf16")  # the levers a LeverMeasurement may be given for


@dataclass(frozen=True, kw_only=True, slots=True)
class LeverMeasurement:
    """Seconds per optimizer step measured without a lever and with it (`thrifty tune`'s
    trials, or two runs), each with its noise: the spread of its per-step mean, in seconds.

    The lever counts as faster only when the step it saves exceeds both noises together.
    `source` says who measured, in a few words ("thrifty tune", "runs a and b").
    """

    without_seconds: float
    with_seconds: float
    without_noise: float = 0.0
    with_noise: float = 0.0
    source: str = "measured"

    def __post_init__(self) -> None:
        for name in ("without_seconds", "with_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"LeverMeasurement.{name} = {getattr(self, name)!r}: must be greater than 0 "
                    "(seconds per step)"
                )
        for name in ("without_noise", "with_noise"):
            if not getattr(self, name) >= 0:
                raise ValueError(
                    f"LeverMeasurement.{name} = {getattr(self, name)!r}: must be 0 or greater "
                    "(seconds)"
                )

    @property
    def gain_seconds(self) -> float:
        """Seconds per step the lever saves (negative: it costs)."""
        return self.without_seconds - self.with_seconds

    @property
    def noise_seconds(self) -> float:
        return self.without_noise + self.with_noise

    @property
    def faster(self) -> bool:
        """Whether the lever saved more than the measurements' noise."""
        return self.gain_seconds > self.noise_seconds

    def describe(self, lever: str, baseline: str) -> str:
        """`lever` against `baseline` with the figures, e.g. "bf16 12.0 ± 0.4 ms per step
        against 20.0 ± 0.5 ms in fp32 (thrifty tune)"."""
        return (
            f"{lever} {plus_minus(self.with_seconds, self.with_noise)} per step against "
            f"{plus_minus(self.without_seconds, self.without_noise)} {baseline} ({self.source})"
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    """Measured facts about a training job. Seconds are means per optimizer step.

    Phase seconds must be device time: on a GPU kernels run asynchronously, so host timers show
    only launch time — use CUDA events at the phase boundaries (as the Trainer does) or sync.
    `other_seconds` None means the step time the other phases do not account for.

    `busy_seconds` (CPU runs): per compute phase, the seconds this process held the CPU —
    the phase's wall time × the share of the step's compute span the process held (CPU time
    ÷ threads ÷ wall time, at most 1). Other processes on a shared machine stretch the wall
    time but not this, so compute is judged on it (against a peak measured the same way).
    """

    step_seconds: float
    steps: int = 1  # optimizer steps measured
    data_wait_seconds: float = 0.0
    host_to_device_seconds: float = 0.0
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    optimizer_seconds: float = 0.0
    checkpoint_seconds: float = 0.0
    other_seconds: float | None = None
    accumulation_steps: int = 1  # micro-batches per optimizer step
    micro_batch: int | None = None  # samples per micro-batch
    num_workers: int | None = None
    fetch_seconds_per_batch: Mapping[int, float] | None = None  # WorkerChoice.seconds_per_batch
    cpus: int | None = None  # CPUs this process may use
    device_type: str = "cpu"
    device_name: str | None = None
    precision: str = "fp32"  # what the matmuls run in: fp32 | bf16 | fp16
    tf32: bool = False  # fp32 matmuls may use TF32 tensor cores
    native_bf16: bool = False  # the hardware runs bf16 matmuls natively
    bf16_speedup: float | None = None  # bf16 peak ÷ peak of the dtype in use, when known
    compiled: bool = False
    activation_checkpointing: str = "off"  # the policy in use
    flops_per_step: float | None = None
    aten_ops_per_step: int | None = None  # forward + backward, all micro-batches
    mfu: float | None = None  # model FLOP/s over the whole step ÷ peak
    busy_seconds: Mapping[str, float] | None = None  # per compute phase; see the docstring
    peak_source: str | None = None
    peak_memory_bytes: float | None = None
    device_memory_bytes: float | None = None
    activation_bytes: float | None = None  # saved for backward, per micro-batch
    gpu_util_mean: float | None = None  # percent
    gpu_util_std: float | None = None
    cpu_util_mean: float | None = None  # percent of all CPUs
    cpu_util_std: float | None = None
    load_per_cpu: float | None = None  # the machine's mean 1-minute load average per CPU
    steal_percent: float | None = None  # mean CPU time a hypervisor gave to other guests
    step_swing: float | None = None  # slowest logging interval's mean step ÷ the fastest's
    # Several ranks: each rank's own work per step (thrifty.measure.stragglers), rank order.
    rank_work_seconds: tuple[float, ...] | None = None
    straggler: Straggler | None = None  # the rank the others waited for, if one was
    # Noise: per phase name and "step", the spread of its mean per step (seconds); see noise().
    spread_seconds: Mapping[str, float] | None = None
    spread_windows: int | None = None  # logging intervals it spans (1: per-step spread)
    # Levers measured without and with, keyed by a name in LEVERS_MEASURED.
    lever_measurements: Mapping[str, LeverMeasurement] | None = None

    def __post_init__(self) -> None:
        if self.steps < 1 or not self.step_seconds > 0:
            raise ThriftyError(
                f"a profile of {self.steps} step(s) and {self.step_seconds!r} s per step cannot "
                "be diagnosed: measure at least 1 step that takes time (--steps N with N >= 1)"
            )
        for phase in PHASES:
            value = getattr(self, f"{phase}_seconds")
            if value is not None and not value >= 0:
                raise ValueError(f"Evidence.{phase}_seconds = {value!r}: must be 0 or greater")
        if self.accumulation_steps < 1:
            raise ValueError(
                f"Evidence.accumulation_steps = {self.accumulation_steps}: must be 1 or more"
            )
        unknown = sorted(set(self.lever_measurements or {}) - set(LEVERS_MEASURED))
        if unknown:
            raise ValueError(
                f"Evidence.lever_measurements has {unknown[0]!r}: give some of "
                f"{', '.join(LEVERS_MEASURED)}"
            )

    def noise(self, name: str) -> float:
        """The noise of `name`'s mean seconds per step (a phase in PHASES, or "step"): how far
        it moved between logging intervals (the standard deviation of their means; with one
        interval, the step's spread from step to step: `thrifty.measure.spread`); 0 where no
        spread was measured."""
        return float((self.spread_seconds or {}).get(name, 0.0))

    def figure(self, name: str) -> str:
        """`name`'s mean seconds per step with its noise, e.g. "12.3 ± 1.1 ms"."""
        seconds = self.step_seconds if name == "step" else self.seconds()[name]
        noise = self.noise(name) if self.spread_seconds is not None else None
        return plus_minus(seconds, noise)

    def figures(self, *names: str) -> dict[str, float]:
        """Each name's mean seconds per step and its noise, as diagnosis.json carries them:
        `{name}_seconds` and `{name}_noise_seconds`."""
        out: dict[str, float] = {}
        for name in names:
            seconds = self.step_seconds if name == "step" else self.seconds()[name]
            out[f"{name}_seconds"] = seconds
            out[f"{name}_noise_seconds"] = self.noise(name)
        return out

    def lever(self, name: str) -> LeverMeasurement | None:
        """What was measured of lever `name` (in LEVERS_MEASURED), or None."""
        return (self.lever_measurements or {}).get(name)

    def seconds(self) -> dict[str, float]:
        """Seconds per step of each phase in PHASES; `other` fills the step when not given."""
        measured = {p: float(getattr(self, f"{p}_seconds")) for p in PHASES if p != "other"}
        other = self.other_seconds
        if other is None:
            other = max(0.0, self.step_seconds - sum(measured.values()))
        return {**measured, "other": float(other)}

    def breakdown(self) -> dict[str, float]:
        """Fractions of step time per phase, summing to 1 (of the phases' sum, should they add
        up to more than the measured step)."""
        seconds = self.seconds()
        total = max(sum(seconds.values()), self.step_seconds)
        shares = {p: s / total for p, s in seconds.items()}
        shares["other"] += 1.0 - sum(shares.values())  # what rounding left out
        return shares

    @property
    def compute_seconds(self) -> float:
        return sum(getattr(self, f"{p}_seconds") for p in COMPUTE_PHASES)

    def _held(self, phase: str) -> float:
        """Seconds of `phase` per step, counting only the time this process held the CPU
        where that was measured."""
        if self.busy_seconds is not None and phase in self.busy_seconds:
            return float(self.busy_seconds[phase])
        return float(getattr(self, f"{phase}_seconds"))

    @property
    def compute_mfu(self) -> float | None:
        """MFU over compute time only: MFU × step ÷ (forward + backward + optimizer), with
        compute counted while this process held the CPU where that was measured."""
        compute = sum(self._held(p) for p in COMPUTE_PHASES)
        if self.mfu is None or compute <= 0:
            return None
        return self.mfu * self.step_seconds / compute

    @property
    def seconds_per_op(self) -> float | None:
        """Forward+backward seconds per aten op (what one op costs, launch included)."""
        busy = self._held("forward") + self._held("backward")
        if not self.aten_ops_per_step or busy <= 0:
            return None
        return busy / self.aten_ops_per_step

    @property
    def memory_fraction(self) -> float | None:
        if not self.peak_memory_bytes or not self.device_memory_bytes:
            return None
        return self.peak_memory_bytes / self.device_memory_bytes


def pct(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{fraction * 100:.0f}%"


def ms(seconds: float) -> str:
    """Milliseconds to a tenth, below one to a hundredth (0.44 ms → 0.36 ms, not 0.4 → 0.4);
    seconds from 10 s."""
    if seconds < 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e3:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def plus_minus(seconds: float, noise: float | None) -> str:
    """`seconds` and its noise in one unit, e.g. "12.3 ± 1.1 ms"; no ± when `noise` is None."""
    if noise is None:
        return ms(seconds)
    if seconds < 10:
        return f"{seconds * 1e3:.1f} ± {noise * 1e3:.1f} ms"
    return f"{seconds:.1f} ± {noise:.1f} s"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def gib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f} GiB"
