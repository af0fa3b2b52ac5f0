"""The sections of a run's config that say what it trains and how: run, precision, activation
checkpointing, batch, optimizer, schedule, data, compile, eval, early stopping."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from thrifty.config.checks import (
    check_target,
    fail,
    non_negative,
    parse_duration,
    positive,
)
from thrifty.errors import ConfigError


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
    # precision, batch, task) instead of refusing them; see thrifty.rundir.config_changes.
    allow_config_change: bool = False

    def __post_init__(self) -> None:
        s = self.SECTION
        for key in ("max_steps", "max_tokens", "max_epochs", "log_every"):
            positive(s, key, getattr(self, key))
        if self.max_time is not None:
            parse_duration(self.max_time, f"{s}.max_time")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", self.device):
            fail(s, "device", self.device, "use auto, cpu, cuda or cuda:N")
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
    """Mixed precision. `auto` picks bf16 where the hardware runs it natively; `fp8` is bf16
    with torchao's float8 linears (CUDA compute capability 8.9 and newer), never chosen by
    `auto`: `thrifty tune` keeps it only where it is faster and its loss stays with bf16's."""

    SECTION: ClassVar[str] = "precision"
    mode: Literal["auto", "bf16", "fp16", "fp32", "fp8"] = "auto"
    # fp32 matmuls may use TF32 tensor cores on CUDA (torch.backends.cuda.matmul.allow_tf32)
    allow_tf32: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class ActivationCheckpointingConfig:
    """Recompute activations in backward instead of keeping them: less memory, more compute."""

    SECTION: ClassVar[str] = "activation_checkpointing"
    # off | every_other | all | every_nth:N | a list of module-name patterns (fnmatch)
    policy: str | list[str] = "off"

    def __post_init__(self) -> None:
        try:
            parse_policy(self.policy)
        except ValueError as exc:
            fail(self.SECTION, "policy", self.policy, str(exc))


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchConfig:
    """Micro-batch (what fits in memory) and effective batch (what the optimizer sees)."""

    SECTION: ClassVar[str] = "batch"
    # Samples per forward/backward, per process; "auto": the largest that fits on the device
    # (measured at start), the accumulation making up batch.effective.
    micro: int | Literal["auto"] = 16
    effective: int | None = None  # samples per optimizer step, over all processes; default micro
    # How micro-batch losses are weighted: by samples, by tokens (a batch's `loss_mask`, or
    # its labels other than -100, shifted for a causal LM), or auto (tokens when every
    # micro-batch carries a loss_mask or per-token labels, samples otherwise).
    normalize: Literal["auto", "samples", "tokens"] = "auto"
    # With micro = "auto": the share of the device's memory a micro-batch must leave free.
    memory_margin: float = 0.1

    def __post_init__(self) -> None:
        positive(self.SECTION, "effective", self.effective)
        if not 0 <= self.memory_margin < 1:
            fail(self.SECTION, "memory_margin", self.memory_margin, "must be in [0, 1)")
        if self.micro == "auto":
            if self.effective is None:
                fail(
                    self.SECTION,
                    "micro",
                    self.micro,
                    "needs batch.effective, the batch the optimizer sees (the micro-batch is "
                    "chosen to fit and the accumulation makes up the rest)",
                )
            return
        positive(self.SECTION, "micro", self.micro)
        if self.effective is not None and self.effective % self.micro:
            fail(
                self.SECTION,
                "effective",
                self.effective,
                f"must be a multiple of batch.micro = {self.micro} "
                f"(e.g. {self.micro * max(1, round(self.effective / self.micro))})",
            )

    def check_world_size(self, world_size: int) -> None:
        """Refuse a batch.effective that `world_size` processes cannot share evenly: checked by
        a launcher before it starts its ranks, and by each rank."""
        if self.effective is None:  # it follows the process count
            return
        if self.micro == "auto":
            if self.effective % world_size:
                raise ConfigError(
                    f"batch.effective = {self.effective} is invalid: must be a multiple of "
                    f"the world size ({world_size}) with batch.micro = 'auto'"
                )
            return
        self.accumulation_steps(world_size)

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


# What [optimizer] sets only for the optimizer thrifty builds: one of the user's own
# (task.optimizer, or one given in Python) takes none of them. reference_batch and grad_clip
# apply to any.
OPTIMIZER_BUILT_ONLY = ("name", "lr", "weight_decay", "betas", "momentum")


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
        positive(s, "lr", self.lr)
        positive(s, "reference_batch", self.reference_batch)
        non_negative(s, "weight_decay", self.weight_decay)
        non_negative(s, "momentum", self.momentum)
        non_negative(s, "grad_clip", self.grad_clip)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            fail(s, "betas", self.betas, "two numbers in [0, 1), e.g. [0.9, 0.95]")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleConfig:
    """Learning-rate schedule: linear warmup, then cosine decay or constant; and how often a
    user's own scheduler (task.scheduler, Trainer(scheduler=...)) is stepped."""

    SECTION: ClassVar[str] = "schedule"
    warmup_steps: int = 0
    decay: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = 0.1  # cosine ends at lr × min_lr_ratio
    total_steps: int | None = None  # cosine horizon; default run.max_steps
    # A user's scheduler is stepped once per optimizer step ("step": transformers' schedules)
    # or once per epoch of optimizer steps ("epoch": PyTorch's StepLR, MultiStepLR and
    # ExponentialLR as their docs use them). thrifty's own schedule counts steps only.
    interval: Literal["step", "epoch"] = "step"

    def __post_init__(self) -> None:
        non_negative(self.SECTION, "warmup_steps", self.warmup_steps)
        positive(self.SECTION, "total_steps", self.total_steps)
        if not 0 <= self.min_lr_ratio <= 1:
            fail(self.SECTION, "min_lr_ratio", self.min_lr_ratio, "must be between 0 and 1")
        if self.interval not in ("step", "epoch"):  # a TOML file is checked by type; Python not
            fail(self.SECTION, "interval", self.interval, "use 'step' or 'epoch'")


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
            non_negative(self.SECTION, "num_workers", self.num_workers)
        positive(self.SECTION, "prefetch_factor", self.prefetch_factor)


@dataclass(frozen=True, kw_only=True, slots=True)
class CompileConfig:
    """torch.compile. Compile warm-up is excluded from throughput figures."""

    SECTION: ClassVar[str] = "compile"
    # reduce-overhead: CUDA graphs; max-autotune: Triton autotuning and CUDA graphs;
    # max-autotune-no-cudagraphs: autotuning alone (a step CUDA graphs cannot capture)
    mode: Literal[
        "off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    ] = "off"


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalConfig:
    """Validation: how often and on how many batches."""

    SECTION: ClassVar[str] = "eval"
    every: int = 100  # optimizer steps between validations
    batches: int = 0  # validation batches per evaluation; 0 = the whole validation set
    micro: int | None = None  # validation batch size; default batch.micro

    def __post_init__(self) -> None:
        positive(self.SECTION, "every", self.every)
        non_negative(self.SECTION, "batches", self.batches)
        positive(self.SECTION, "micro", self.micro)


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
        non_negative(self.SECTION, "patience", self.patience)
        non_negative(self.SECTION, "min_delta", self.min_delta)
        check_target(self.target, f"{self.SECTION}.target")


# --- activation checkpointing policies ---------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """Which blocks to wrap: every `nth` repeated block, or the modules matching `patterns`."""

    nth: int = 0  # 0: none; 1: all; 2: every other ...
    patterns: tuple[str, ...] = ()


def parse_policy(policy: str | Sequence[str]) -> Policy:
    """`off | every_other | all | every_nth:N | [patterns]` → Policy (ValueError saying what's allowed)."""
    if isinstance(policy, str):
        if policy == "off":
            return Policy()
        if policy == "all":
            return Policy(nth=1)
        if policy == "every_other":
            return Policy(nth=2)
        match = re.fullmatch(r"every_nth:(\d+)", policy)
        if match and int(match.group(1)) > 0:
            return Policy(nth=int(match.group(1)))
        raise ValueError(
            "use off, every_other, all, every_nth:N (N ≥ 1) or a list of module-name patterns"
        )
    patterns = tuple(policy)
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ValueError("a pattern list must hold at least one non-empty module-name pattern")
    return Policy(patterns=patterns)
