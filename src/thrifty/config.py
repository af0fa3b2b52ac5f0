"""Training configuration: small typed sections, one per concern, validated at construction.

A `TrainConfig` is built from a TOML file (or a dict) plus `section.key=value` overrides. Every
invalid value raises `ConfigError` naming the dotted field, the value given and what is allowed;
unknown keys are errors, so a typo is never silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Union, get_args, get_origin

from thrifty.errors import ConfigError
from thrifty.measure.cost import CostConfig
from thrifty.run.guard import GuardConfig, check_target

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def _fail(section: str, key: str, value: object, allowed: str) -> typing.NoReturn:
    raise ConfigError(f"{section}.{key} = {value!r} is invalid: {allowed}")


def _positive(section: str, key: str, value: float | int | None) -> None:
    if value is not None and not value > 0:
        _fail(section, key, value, "must be greater than 0")


def _non_negative(section: str, key: str, value: float | int) -> None:
    if not value >= 0:
        _fail(section, key, value, "must be 0 or greater")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: str | int | float, where: str = "duration") -> float:
    """Seconds from `90`, `"90s"`, `"30m"`, `"2.5h"` or `"1d"`."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if match is None:
            raise ConfigError(
                f"{where} = {text!r} is invalid: give seconds or a number with s, m, h or d "
                '(e.g. "30m")'
            )
        seconds = float(match.group(1)) * _DURATION_SECONDS[match.group(2)]
    if not seconds > 0:
        raise ConfigError(f"{where} = {text!r} is invalid: must be greater than 0")
    return seconds


# --------------------------------------------------------------------------------------------
# Sections


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """What to run for, where to write, and on which device."""

    SECTION: ClassVar[str] = "run"
    name: str = "run"
    out: str | None = None  # run directory; default runs/<name>-<timestamp>
    overwrite: bool = False  # allow writing into a directory that already holds a run
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0
    deterministic: bool = False  # torch.use_deterministic_algorithms; slower, bit-exact
    max_steps: int | None = None  # optimizer steps
    max_tokens: int | None = None
    max_time: str | float | None = None  # seconds or "30m"
    max_epochs: int | None = None
    log_every: int = 10  # steps between metric flushes (one host sync each)
    progress: Literal["auto", "on", "off"] = "auto"
    # On a resume, apply changes to the optimization (learning rate, schedule, optimizer, seed,
    # precision, batch, task) instead of refusing them; see thrifty.run.config_changes.
    allow_config_change: bool = False

    def __post_init__(self) -> None:
        s = self.SECTION
        for key in ("max_steps", "max_tokens", "max_epochs", "log_every"):
            _positive(s, key, getattr(self, key))
        if self.max_time is not None:
            parse_duration(self.max_time, f"{s}.max_time")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", self.device):
            _fail(s, "device", self.device, "use auto, cpu, cuda or cuda:N")
        if all(
            getattr(self, k) is None for k in ("max_steps", "max_tokens", "max_time", "max_epochs")
        ):
            raise ConfigError(
                "run has no budget: set at least one of run.max_steps, run.max_tokens, "
                "run.max_time or run.max_epochs"
            )

    @property
    def max_seconds(self) -> float | None:
        return None if self.max_time is None else parse_duration(self.max_time, "run.max_time")


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionConfig:
    """Mixed precision. `auto` picks bf16 where the hardware runs it natively."""

    SECTION: ClassVar[str] = "precision"
    mode: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    # fp32 matmuls may use TF32 tensor cores on CUDA (torch.backends.cuda.matmul.allow_tf32)
    allow_tf32: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationCheckpointingConfig:
    """Recompute activations in backward instead of keeping them: less memory, more compute."""

    SECTION: ClassVar[str] = "activation_checkpointing"
    # off | every_other | all | every_nth:N | a list of module-name patterns (fnmatch)
    policy: str | list[str] = "off"

    def __post_init__(self) -> None:
        from thrifty.levers.activation_checkpointing import parse_policy

        try:
            parse_policy(self.policy)
        except ValueError as exc:
            _fail(self.SECTION, "policy", self.policy, str(exc))


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchConfig:
    """Micro-batch (what fits in memory) and effective batch (what the optimizer sees)."""

    SECTION: ClassVar[str] = "batch"
    # Samples per forward/backward, per process; "auto": the largest that fits on the device
    # (measured at start), the accumulation making up batch.effective.
    micro: int | Literal["auto"] = 16
    effective: int | None = None  # samples per optimizer step, over all processes; default micro
    # How micro-batch losses are weighted: by samples, by tokens (a batch's `loss_mask`), or
    # auto (tokens when the batch carries a loss_mask, samples otherwise).
    normalize: Literal["auto", "samples", "tokens"] = "auto"
    # With micro = "auto": the share of the device's memory a micro-batch must leave free.
    memory_margin: float = 0.1

    def __post_init__(self) -> None:
        _positive(self.SECTION, "effective", self.effective)
        if not 0 <= self.memory_margin < 1:
            _fail(self.SECTION, "memory_margin", self.memory_margin, "must be in [0, 1)")
        if self.micro == "auto":
            if self.effective is None:
                _fail(
                    self.SECTION,
                    "micro",
                    self.micro,
                    "needs batch.effective, the batch the optimizer sees (the micro-batch is "
                    "chosen to fit and the accumulation makes up the rest)",
                )
            return
        _positive(self.SECTION, "micro", self.micro)
        if self.effective is not None and self.effective % self.micro:
            _fail(
                self.SECTION,
                "effective",
                self.effective,
                f"must be a multiple of batch.micro = {self.micro} "
                f"(e.g. {self.micro * max(1, round(self.effective / self.micro))})",
            )

    def accumulation_steps(self, world_size: int = 1, micro: int | None = None) -> int:
        """Micro-batches per optimizer step on each process, with `micro` samples each (default
        batch.micro, which must then be a number)."""
        micro = micro or self.fixed_micro
        effective = self.effective or micro * world_size
        per_step = micro * world_size
        if effective % per_step:
            raise ConfigError(
                f"batch.effective = {effective} is invalid: must be a multiple of batch.micro × "
                f"world size = {micro} × {world_size} = {per_step}"
            )
        return effective // per_step

    @property
    def fixed_micro(self) -> int:
        """batch.micro when it is a number; with "auto" the Trainer finds it at start."""
        if self.micro == "auto":
            raise ConfigError(
                "batch.micro = 'auto' is invalid here: this needs the micro-batch as a number; "
                "set it with --set batch.micro=N"
            )
        return self.micro


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerConfig:
    """The optimizer the Trainer builds when none is given, and gradient clipping."""

    SECTION: ClassVar[str] = "optimizer"
    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 3e-4  # at reference_batch; scaled linearly with the effective batch
    reference_batch: int | None = None  # None: no linear scaling
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    momentum: float = 0.0  # sgd only
    grad_clip: float = 1.0  # max gradient norm; 0 turns clipping off

    def __post_init__(self) -> None:
        s = self.SECTION
        _positive(s, "lr", self.lr)
        _positive(s, "reference_batch", self.reference_batch)
        _non_negative(s, "weight_decay", self.weight_decay)
        _non_negative(s, "momentum", self.momentum)
        _non_negative(s, "grad_clip", self.grad_clip)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            _fail(s, "betas", self.betas, "two numbers in [0, 1), e.g. [0.9, 0.95]")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleConfig:
    """Learning-rate schedule: linear warmup, then cosine decay or constant."""

    SECTION: ClassVar[str] = "schedule"
    warmup_steps: int = 0
    decay: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = 0.1  # cosine ends at lr × min_lr_ratio
    total_steps: int | None = None  # cosine horizon; default run.max_steps

    def __post_init__(self) -> None:
        _non_negative(self.SECTION, "warmup_steps", self.warmup_steps)
        _positive(self.SECTION, "total_steps", self.total_steps)
        if not 0 <= self.min_lr_ratio <= 1:
            _fail(self.SECTION, "min_lr_ratio", self.min_lr_ratio, "must be between 0 and 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    """DataLoader settings. `num_workers = "auto"` measures fetch time over a few candidates."""

    SECTION: ClassVar[str] = "data"
    num_workers: int | Literal["auto"] = "auto"
    prefetch_factor: int = 2  # batches in flight per worker
    persistent_workers: bool = True
    pin_memory: bool | Literal["auto"] = "auto"  # auto: only when training on CUDA
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.num_workers != "auto":
            _non_negative(self.SECTION, "num_workers", self.num_workers)
        _positive(self.SECTION, "prefetch_factor", self.prefetch_factor)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompileConfig:
    """torch.compile. Compile warm-up is excluded from throughput figures."""

    SECTION: ClassVar[str] = "compile"
    mode: Literal["off", "default", "reduce-overhead", "max-autotune"] = "off"


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    """Validation: how often and on how many batches."""

    SECTION: ClassVar[str] = "eval"
    every: int = 100  # optimizer steps between validations
    batches: int = 0  # validation batches per evaluation; 0 = the whole validation set
    micro: int | None = None  # validation batch size; default batch.micro

    def __post_init__(self) -> None:
        _positive(self.SECTION, "every", self.every)
        _non_negative(self.SECTION, "batches", self.batches)
        _positive(self.SECTION, "micro", self.micro)


@dataclass(frozen=True, kw_only=True, slots=True)
class EarlyStoppingConfig:
    """Stop when the validation loss has not improved by min_delta for `patience` evaluations."""

    SECTION: ClassVar[str] = "early_stopping"
    patience: int = 0  # evaluations without improvement; 0 turns early stopping off
    min_delta: float = 0.0
    # A validation loss to reach: the run stops (stop_reason "forecast") once a fit of the
    # validation curve says, with its uncertainty, that the budget cannot reach it ([guard]).
    target: float | None = None

    def __post_init__(self) -> None:
        _non_negative(self.SECTION, "patience", self.patience)
        _non_negative(self.SECTION, "min_delta", self.min_delta)
        check_target(self.target, f"{self.SECTION}.target")


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
            _positive(s, "every", self.every)
        elif self.every not in ("auto", "off"):
            parse_duration(self.every, f"{s}.every")
        if isinstance(self.interruption_rate, str):
            from thrifty.plan.spot import ADVISOR_BUCKETS

            if self.interruption_rate.replace(" ", "") not in ADVISOR_BUCKETS:
                _fail(
                    s,
                    "interruption_rate",
                    self.interruption_rate,
                    f"give interruptions per hour or one of {', '.join(ADVISOR_BUCKETS)}",
                )
        else:
            _positive(s, "interruption_rate", self.interruption_rate)
        if self.keep_last < 2:
            _fail(
                s,
                "keep_last",
                self.keep_last,
                "must be at least 2: with one, a corrupt newest checkpoint leaves nothing to resume",
            )
        if not self.resume:
            _fail(s, "resume", self.resume, "use auto, never, or a checkpoint's path or URL")
        parse_duration(self.upload_deadline, f"{s}.upload_deadline")
        _non_negative(s, "upload_retries", self.upload_retries)

    @property
    def upload_deadline_seconds(self) -> float:
        return parse_duration(self.upload_deadline, f"{self.SECTION}.upload_deadline")


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
        _positive(self.SECTION, "poll_seconds", self.poll_seconds)
        from thrifty.run.preemption import parse_signals

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
        _positive(self.SECTION, "steady_after", self.steady_after)

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
            _positive(self.SECTION, key, getattr(self, key))


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
    # (optimizer, **scheduler_args) -> LRScheduler, stepped once per optimizer step in place of
    # [schedule]; e.g. "torch.optim.lr_scheduler:StepLR" with scheduler_args = { step_size = 3 }
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
                _fail(self.SECTION, key, value, "use an import path like 'package.module:factory'")
        if self.scheduler_args and self.scheduler is None:
            _fail(
                self.SECTION,
                "scheduler_args",
                self.scheduler_args,
                "needs task.scheduler, the factory they are passed to "
                "(e.g. 'torch.optim.lr_scheduler:StepLR')",
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Every section of a training run. Build with `TrainConfig.from_dict` or `load_config`."""

    run: RunConfig
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    activation_checkpointing: ActivationCheckpointingConfig = field(
        default_factory=ActivationCheckpointingConfig
    )
    batch: BatchConfig = field(default_factory=BatchConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    spot: SpotConfig = field(default_factory=SpotConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    log: LogConfig = field(default_factory=LogConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        return _build(cls, data, prefix="")

    def to_dict(self, secrets: bool = True) -> dict[str, Any]:
        """Plain nested dict (None values dropped), suitable for TOML.

        With `secrets=False` (what is written to disk) the dict goes through
        `thrifty.redact.redact_value`: storage_options are left out, URLs lose any
        user:password part and signed query values, and secret-named values are masked.
        """
        data = {
            f.name: {
                k: v for k, v in dataclasses.asdict(getattr(self, f.name)).items() if v is not None
            }
            for f in dataclasses.fields(self)
        }
        if secrets:
            return data
        from thrifty.redact import redact_value

        redacted: dict[str, Any] = redact_value(data)
        return redacted

    def replace(self, **overrides: str) -> TrainConfig:
        """A copy with `section.key` overrides applied, e.g. `replace(**{"batch.micro": "8"})`."""
        return TrainConfig.from_dict(apply_overrides(self.to_dict(), overrides.items()))


# --------------------------------------------------------------------------------------------
# Building sections from plain data, with type checks that name the field


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _matches(value: Any, tp: Any) -> bool:
    origin = get_origin(tp)
    if tp is Any:
        return True
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_matches(v, get_args(tp)[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
    return isinstance(value, tp)


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"allowed: {', '.join(fields)}"
        where = prefix.rstrip(".") or "the config"
        raise ConfigError(f"unknown key {prefix}{key} in {where}: {hint}")
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value, f"{name}.")
            continue
        if isinstance(value, int) and not isinstance(value, bool) and tp is float:
            value = float(value)
        if not _matches(value, tp):
            raise ConfigError(f"{prefix}{name} = {value!r} is invalid: expected {_type_name(tp)}")
        kwargs[name] = value
    if cls is TrainConfig and "run" not in kwargs:
        kwargs["run"] = _build(RunConfig, {}, "run.")
    return cls(**kwargs)


# --------------------------------------------------------------------------------------------
# TOML files and overrides


# config.toml's array of tables recording what changed on each resume (thrifty.run.config_changes);
# load_config skips it, so a run's config.toml starts that run again as it is now.
HISTORY_TABLE = "config_changes"


def toml_loads(text: str) -> dict[str, Any]:
    """Parse TOML text; malformed text raises ValueError (tomllib.TOMLDecodeError)."""
    return tomllib.loads(text)


def parse_override_value(text: str) -> Any:
    """A TOML value when the text parses as one (`8`, `1e-3`, `true`, `[1, 2]`), else the string."""
    try:
        return toml_loads(f"v = {text}")["v"]
    except Exception:
        return text


def apply_overrides(
    data: Mapping[str, Any], overrides: Iterable[tuple[str, Any]]
) -> dict[str, Any]:
    """Set `section.key` values in a nested dict; string values are parsed as TOML values."""
    result = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for dotted, raw in overrides:
        parts = dotted.split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(
                f"override {dotted!r} is invalid: use section.key=value, e.g. batch.micro=8"
            )
        value = parse_override_value(raw) if isinstance(raw, str) else raw
        table = result
        for part in parts[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(f"override {dotted!r} is invalid: {part} is not a section")
        table[parts[-1]] = value
    return result


def parse_set_args(items: Iterable[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} is invalid: use --set section.key=value")
        pairs.append((key.strip(), value.strip()))
    return pairs


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's own TOML tables, without the record of earlier resumes."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    try:
        loaded = toml_loads(text)
    except Exception as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc
    loaded.pop(HISTORY_TABLE, None)  # a record of earlier resumes, not settings
    return loaded


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[tuple[str, Any]] = (),
    base: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """Read a TOML file (optionally on top of `base`) and apply `section.key` overrides."""
    data: dict[str, Any] = {k: dict(v) for k, v in (base or {}).items()}
    if path is not None:
        for section, table in read_config_file(path).items():
            if isinstance(table, dict) and isinstance(data.get(section), dict):
                data[section] = {**data[section], **table}
            else:
                data[section] = table
    return TrainConfig.from_dict(apply_overrides(data, overrides))


def dump_toml(data: Mapping[str, Any]) -> str:
    """A nested dict of sections as TOML that `load_config` reads back equal.

    TOML has no null: None values are left out, at any depth (an unset key reads back unset).
    """
    import tomli_w  # imported here: importing thrifty stays cheap

    return tomli_w.dumps(_without_none(data))


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_without_none(v) for v in value]
    return value


def flatten_keys(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as dotted keys: {"run": {"seed": 0}} -> {"run.seed": 0}."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
