"""The lever space `thrifty tune` searches: what a trial sets, and which values each lever has.

A `Setting` is the five values a trial changes (precision, activation checkpointing,
micro-batch, compile mode, data-loader workers); everything else stays as the config gives it,
the effective batch included, so every trial runs the same optimization. A `Space` holds the
values worth trying on this hardware, in the order the search tries them.

Cheap to import: nothing here needs torch (`hardware_precisions` imports it when called).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thrifty.errors import ConfigError

if TYPE_CHECKING:
    from thrifty.config import TrainConfig

# The levers, in the order the search visits them. Workers come first: a step that waits for
# data hides what every other lever does. Then the seeds' order of impact: precision, the
# larger micro-batch activation checkpointing makes room for, torch.compile.
LEVERS = ("workers", "precision", "micro", "checkpointing", "compile")
# Lightest first: each one recomputes more in backward to keep fewer activations.
POLICIES = ("off", "every_other", "all")
COMPILE_MODES = ("off", "default", "max-autotune")
# On a CUDA GPU: autotuning without and with CUDA graphs, then CUDA graphs alone (which a step
# with host syncs or changing shapes cannot capture: measured like the rest).
CUDA_COMPILE_MODES = (
    "off",
    "default",
    "max-autotune-no-cudagraphs",
    "max-autotune",
    "reduce-overhead",
)
AUTOTUNE_MODES = ("max-autotune-no-cudagraphs", "max-autotune")
AUTO = "auto"  # a micro-batch the Trainer finds (the largest that fits), or workers it measures

Policy = str | tuple[str, ...]  # a named policy, or module-name patterns


@dataclass(frozen=True, slots=True)
class Setting:
    """What one trial sets. `micro` and `num_workers` may be "auto": the Trainer finds the
    largest micro-batch that fits, or measures the workers; a finished trial reports the value
    it used. `precision` is "auto" only in a config as given."""

    precision: str
    checkpointing: Policy
    micro: int | str
    compile: str
    num_workers: int | str

    @classmethod
    def of(cls, config: TrainConfig) -> Setting:
        """The setting a config runs as given."""
        policy = config.activation_checkpointing.policy
        return cls(
            precision=config.precision.mode,
            checkpointing=tuple(policy) if isinstance(policy, list) else policy,
            micro=config.batch.micro,
            compile=config.compile.mode,
            num_workers=config.data.num_workers,
        )

    def with_(self, **changes: Any) -> Setting:
        return dataclasses.replace(self, **changes)

    def config_values(self) -> dict[str, Any]:
        """The config keys it sets, as TOML values."""
        policy = self.checkpointing
        policy_value = list(policy) if isinstance(policy, tuple) else policy
        return {
            "precision.mode": self.precision,
            "activation_checkpointing.policy": policy_value,
            "batch.micro": self.micro,
            "compile.mode": self.compile,
            "data.num_workers": self.num_workers,
        }

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Setting:
        """The setting `config_values` gave (as tune.json keeps it)."""
        policy = values["activation_checkpointing.policy"]
        return cls(
            precision=values["precision.mode"],
            checkpointing=tuple(policy) if isinstance(policy, list) else policy,
            micro=values["batch.micro"],
            compile=values["compile.mode"],
            num_workers=values["data.num_workers"],
        )

    def describe(self) -> str:
        """One line: "bf16, checkpointing every_other, micro 32, compile default, workers 2"."""
        policy = self.checkpointing
        shown = ",".join(policy) if isinstance(policy, tuple) else policy
        return (
            f"{self.precision}, checkpointing {shown}, micro {self.micro}, "
            f"compile {self.compile}, workers {self.num_workers}"
        )


def policy_rank(policy: Policy) -> int | None:
    """How much a policy recomputes (off 0, every_other 1, all 2); None for a custom one,
    which compares with nothing but itself."""
    return POLICIES.index(policy) if isinstance(policy, str) and policy in POLICIES else None


@dataclass(frozen=True, slots=True)
class Space:
    """The values each lever is tried at, in the order the search tries them.

    A lever left out of `levers` keeps the config's value. `micros` holds "auto" (the
    Trainer's largest that fits) or sizes largest first; `effective` is the batch every trial
    keeps, in samples per optimizer step. `notes` say what was left out and why.
    """

    levers: tuple[str, ...]
    precisions: tuple[str, ...]
    policies: tuple[Policy, ...]
    micros: tuple[int | str, ...]
    compile_modes: tuple[str, ...]
    effective: int
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"  # the device type trained on: "cuda" has tensor cores to reason about

    def searches(self, lever: str) -> bool:
        return lever in self.levers


def parse_levers(text: str | Sequence[str] | None, flag: str = "--levers") -> tuple[str, ...]:
    """`"precision,micro"` -> ("precision", "micro") in search order; None or "all": all."""
    if text is None:
        return LEVERS
    items = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    if items == ["all"]:
        return LEVERS
    unknown = [item for item in items if item not in LEVERS]
    if unknown or not items:
        shown = unknown[0] if unknown else ""
        raise ConfigError(
            f"{flag} {text!r} is invalid: {shown!r} is not a lever; give some of "
            f"{', '.join(LEVERS)} separated by commas (or all)"
        )
    return tuple(lever for lever in LEVERS if lever in items)


def parse_micro(text: str | Sequence[int] | None, flag: str = "--micro") -> tuple[int, ...] | None:
    """`"8,16,32"` -> (32, 16, 8), largest first; None or "auto": the largest that fits."""
    if text is None or text == AUTO:
        return None
    parts = text.split(",") if isinstance(text, str) else list(text)
    sizes = []
    for part in parts:
        value = part.strip() if isinstance(part, str) else part
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(
                f"{flag} {text!r} is invalid: {value!r} is not a micro-batch size; give auto or "
                "whole numbers above 0 separated by commas, e.g. 8,16,32"
            )
        sizes.append(value)
    return tuple(sorted(set(sizes), reverse=True))


def build_space(
    config: TrainConfig,
    *,
    levers: Iterable[str],
    precisions: Sequence[str],
    micro_sizes: Sequence[int] | None,
    device: str = "cpu",
) -> Space:
    """The space for `config` on hardware that runs `precisions` (most impact first).
    `micro_sizes` replace "the largest that fits" (which the Trainer finds) with given sizes."""
    chosen = tuple(levers)
    effective = effective_batch(config)
    notes = []
    micros: tuple[int | str, ...] = (AUTO,)
    if micro_sizes is not None:
        micros = tuple(m for m in micro_sizes if m <= effective and effective % m == 0)
        dropped = [m for m in micro_sizes if m not in micros]
        if dropped:
            notes.append(
                f"micro-batch {', '.join(map(str, dropped))} left out: not a divisor of the "
                f"effective batch {effective}"
            )
    return Space(
        levers=chosen,
        precisions=tuple(precisions) if "precision" in chosen else (),
        policies=POLICIES if "checkpointing" in chosen else (),
        micros=micros if "micro" in chosen else (),
        compile_modes=(CUDA_COMPILE_MODES if device == "cuda" else COMPILE_MODES)
        if "compile" in chosen
        else (),
        effective=effective,
        notes=notes,
        device=device,
    )


def effective_batch(config: TrainConfig) -> int:
    """Samples per optimizer step every trial keeps: batch.effective, or the micro-batch when
    it is unset (one process, no accumulation)."""
    return config.batch.effective or config.batch.fixed_micro  # "auto" comes with effective


def hardware_precisions(device_name: str) -> tuple[str, tuple[str, ...], str]:
    """(device type, the precisions it runs natively, most impact first, a note on what was
    left out) for `run.device`: bf16 and fp16 run at the tensor cores' peak, fp32 below it.

    A CUDA GPU runs fp16 and fp32, and bf16 natively from compute capability 8.0, and fp8
    (bf16 with float8 linears, right after bf16: its parity check needs a bf16 trial) from 8.9
    with torchao installed; a CPU runs fp32, and bf16 only with AMX or AVX512-BF16 (otherwise
    it is emulated, and slower).
    """
    from thrifty.levers.fp8 import fp8_unavailable
    from thrifty.levers.precision import native_bf16
    from thrifty.strategies.device import resolve_device

    device = resolve_device(device_name)
    bf16 = native_bf16(device)
    runs: tuple[str, ...]
    if device.type == "cuda":
        no_fp8 = fp8_unavailable(device)
        runs = ("bf16", "fp16", "fp32") if bf16 else ("fp16", "fp32")
        if bf16 and no_fp8 is None:
            runs = ("bf16", "fp8", "fp16", "fp32")
        why = "" if bf16 else "bf16 left out: this GPU has no native bf16"
        if bf16 and no_fp8 is not None:
            why = f"fp8 left out: {no_fp8}"
    else:
        runs = ("bf16", "fp32") if bf16 else ("fp32",)
        why = "" if bf16 else f"bf16 left out: this {device.type} has no native bf16"
    return device.type, runs, why
