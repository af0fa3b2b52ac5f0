"""The sections of a run's config that say where and with what it runs: checkpoints, spot
notices, processes, measurement, loggers and the task's factories."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from thrifty.config.checks import (
    fail,
    non_negative,
    parse_duration,
    positive,
)
from thrifty.records.stop_signals import parse_signals

# AWS Spot Instance Advisor buckets of monthly interruption frequency: (low, high, typical).
# The typical value is the bucket's midpoint; ">20%" has no upper edge, so 25% is assumed.
ADVISOR_BUCKETS: dict[str, tuple[float, float | None, float]] = {
    "<5%": (0.0, 0.05, 0.025),
    "5-10%": (0.05, 0.10, 0.075),
    "10-15%": (0.10, 0.15, 0.125),
    "15-20%": (0.15, 0.20, 0.175),
    ">20%": (0.20, None, 0.25),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointConfig:
    """Spot-safe checkpoints: where, how often, how many, and how to resume."""

    SECTION: ClassVar[str] = "checkpoint"
    location: str | None = None  # local dir or fsspec URL; default <run dir>/checkpoints
    local_dir: str | None = None  # staging dir for a URL location; default <run dir>/checkpoints
    # "auto" (Young/Daly from the measured save time), N steps, a duration like "10m", or "off"
    # (then only the emergency and final checkpoints are written).
    every: int | str = "auto"
    interruption_rate: float | str = "5-10%"  # per hour, or an AWS advisor bucket ("<5%", ...)
    # "auto"'s longest interval: the most work a machine that dies without notice takes with it
    # (Young/Daly's optimum for a rare interruption can be half a day).
    max_interval: str | float = "30m"
    keep_last: int = 2
    keep_best: bool = False
    final: bool = True  # a checkpoint when the run ends; false for a throwaway (a tune trial)
    resume: str = "auto"  # auto | never | a checkpoint's path or URL
    upload_deadline: str | float = "90s"  # how long an emergency save waits for its upload
    upload_retries: int = 5
    storage_options: dict[str, Any] = field(default_factory=dict)  # never written to disk

    def __post_init__(self) -> None:
        s = self.SECTION
        if isinstance(self.every, int):
            positive(s, "every", self.every)
        elif self.every not in ("auto", "off"):
            parse_duration(self.every, f"{s}.every")
        if isinstance(self.interruption_rate, str):
            if self.interruption_rate.replace(" ", "") not in ADVISOR_BUCKETS:
                fail(
                    s,
                    "interruption_rate",
                    self.interruption_rate,
                    f"give interruptions per hour or one of {', '.join(ADVISOR_BUCKETS)}",
                )
        else:
            positive(s, "interruption_rate", self.interruption_rate)
        if self.keep_last < 2:
            fail(
                s,
                "keep_last",
                self.keep_last,
                "must be at least 2: with one, a corrupt newest checkpoint leaves nothing to resume",
            )
        if not self.resume:
            fail(s, "resume", self.resume, "use auto, never, or a checkpoint's path or URL")
        parse_duration(self.upload_deadline, f"{s}.upload_deadline")
        parse_duration(self.max_interval, f"{s}.max_interval")
        non_negative(s, "upload_retries", self.upload_retries)

    @property
    def upload_deadline_seconds(self) -> float:
        return parse_duration(self.upload_deadline, f"{self.SECTION}.upload_deadline")

    @property
    def max_interval_seconds(self) -> float:
        return parse_duration(self.max_interval, f"{self.SECTION}.max_interval")


@dataclass(frozen=True, kw_only=True, slots=True)
class SpotConfig:
    """Where preemption notices come from: a cloud's metadata service and these signals."""

    SECTION: ClassVar[str] = "spot"
    provider: Literal["auto", "aws", "gcp", "azure", "none"] = "auto"
    metadata_url: str | None = None  # override the provider's metadata base URL
    poll_seconds: float | None = None  # default: the provider's recommended rate
    # Each one saves an emergency checkpoint and exits 75; SIGUSR1 is Slurm's --signal=USR1@N.
    signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGINT", "SIGUSR1"])

    def __post_init__(self) -> None:
        positive(self.SECTION, "poll_seconds", self.poll_seconds)
        parse_signals(self.signals, f"{self.SECTION}.signals")


@dataclass(frozen=True, kw_only=True, slots=True)
class DistributedConfig:
    """How a run launched by torchrun (or `--nprocs`) spreads over its processes."""

    SECTION: ClassVar[str] = "distributed"
    # auto: ddp when launched with more than one process, single otherwise.
    strategy: Literal["auto", "single", "ddp", "fsdp"] = "auto"
    backend: Literal["auto", "nccl", "gloo"] = "auto"  # auto: nccl on CUDA, gloo on CPU
    # How long a collective waits for a rank that does not arrive before the job fails: at
    # start-up and in the first steps (loading, compiling, the first checkpoint), then, once
    # the steps are steady, `step_timeout`, so a dead rank does not idle the fleet for long.
    timeout: str | float = "10m"
    step_timeout: str | float = "2m"
    steady_after: int = 3  # steps after which `step_timeout` applies

    def __post_init__(self) -> None:
        parse_duration(self.timeout, f"{self.SECTION}.timeout")
        parse_duration(self.step_timeout, f"{self.SECTION}.step_timeout")
        positive(self.SECTION, "steady_after", self.steady_after)

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout, f"{self.SECTION}.timeout")

    @property
    def step_timeout_seconds(self) -> float:
        return parse_duration(self.step_timeout, f"{self.SECTION}.step_timeout")


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasureConfig:
    """What the loop measures: step-time breakdown, system load, FLOPs and MFU, a trace."""

    SECTION: ClassVar[str] = "measure"
    breakdown: bool = True  # per-phase step timings (CUDA events on GPU, one sync per log)
    system: bool = True  # CPU/RAM (psutil) and GPU (NVML) sampled in a background thread
    sample_seconds: float = 0.5
    flops_per_step: float | None = None  # model FLOPs per optimizer step; default measured
    peak_tflops: float | None = None  # the device's peak; default catalog (GPU) or measured (CPU)
    trace: str | None = None  # write a torch.profiler trace of a few steps to this directory
    trace_steps: int = 3
    # A rank whose step time is this fraction above the median rank's, interval after
    # interval, is named a straggler (every other rank waits for it at each all-reduce).
    straggler_threshold: float = 0.15

    def __post_init__(self) -> None:
        for key in (
            "sample_seconds",
            "flops_per_step",
            "peak_tflops",
            "trace_steps",
            "straggler_threshold",
        ):
            positive(self.SECTION, key, getattr(self, key))


@dataclass(frozen=True, kw_only=True, slots=True)
class LogConfig:
    """Where a run's figures go besides the run directory: TensorBoard, MLflow, the report."""

    SECTION: ClassVar[str] = "log"
    tensorboard: bool = False  # scalars under <run dir>/tensorboard (thrifty[tensorboard])
    mlflow: str | None = None  # a tracking URI, e.g. "file:./mlruns" (thrifty[mlflow])
    mlflow_experiment: str = "thrifty"
    report: bool = True  # write <run dir>/report.html when the run ends or is preempted


@dataclass(frozen=True, kw_only=True, slots=True)
class TaskConfig:
    """What `thrifty train` trains: factories named by import path `package.module:function`."""

    SECTION: ClassVar[str] = "task"
    model: str | None = None  # () -> nn.Module
    train_data: str | None = None  # () -> Dataset
    val_data: str | None = None  # () -> Dataset
    optimizer: str | None = None  # (model) -> Optimizer
    # (optimizer, **scheduler_args) -> LRScheduler, stepped in place of [schedule] once per
    # optimizer step, or once per epoch with schedule.interval = "epoch"; e.g.
    # "torch.optim.lr_scheduler:StepLR" with scheduler_args = { step_size = 3 }
    scheduler: str | None = None
    loss_fn: str | None = None  # (output, batch) -> loss
    collate_fn: str | None = None  # (list of samples) -> batch, the DataLoader's collate_fn
    model_args: dict[str, Any] = field(default_factory=dict)
    data_args: dict[str, Any] = field(default_factory=dict)  # passed to both data factories
    scheduler_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        keys = (
            "model",
            "train_data",
            "val_data",
            "optimizer",
            "scheduler",
            "loss_fn",
            "collate_fn",
        )
        for key in keys:
            value = getattr(self, key)
            if value is not None and not re.fullmatch(r"[\w.]+:[\w.]+", value):
                fail(self.SECTION, key, value, "use an import path like 'package.module:factory'")
        if self.scheduler_args and self.scheduler is None:
            fail(
                self.SECTION,
                "scheduler_args",
                self.scheduler_args,
                "needs task.scheduler, the factory they are passed to "
                "(e.g. 'torch.optim.lr_scheduler:StepLR')",
            )
