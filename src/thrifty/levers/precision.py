"""Mixed precision: choose bf16, fp16 or fp32 from the hardware, and the matching loss scaler.

bf16 keeps fp32's exponent range, so it needs no loss scaling; fp16 does (a GradScaler), and is
only chosen on CUDA GPUs without native bf16. On CPU, bf16 pays off only with AMX or AVX512-BF16.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

# fp8: the linears the float8 lever converts run in float8; everything else in bf16.
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None, "fp8": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """The resolved precision: what autocast runs and why it was chosen."""

    name: str  # bf16 | fp16 | fp32 | fp8
    device_type: str  # cuda | cpu | mps
    reason: str

    @property
    def peak_dtype(self) -> str:
        """The dtype whose peak MFU is measured against: bf16 for fp8, whose attention, head
        and norms still run in bf16 (so its MFU compares with a bf16 run's)."""
        return "bf16" if self.name == "fp8" else self.name

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype, or None for plain fp32."""
        return _DTYPES[self.name]

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast context for the forward pass (and the loss), a no-op for fp32."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def make_scaler(self) -> LossScaler:
        """A GradScaler for fp16 (gradients would underflow without one), a no-op otherwise."""
        if self.name == "fp16":
            return torch.amp.GradScaler(self.device_type)
        return NoScaler()


class NoScaler:
    """The GradScaler interface, doing nothing: bf16 and fp32 need no loss scaling."""

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        return None

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def update(self) -> None:
        return None

    def is_enabled(self) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


LossScaler = NoScaler | torch.amp.GradScaler


# The CPU's feature flags, space-separated as /proc/cpuinfo lists them, in place of what it
# says: for a container or VM that hides them, and for tests that pin them.
CPU_FLAGS_ENV = "THRIFTY_CPU_FLAGS"


def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags: THRIFTY_CPU_FLAGS where set (even empty), else /proc/cpuinfo's."""
    given = os.environ.get(CPU_FLAGS_ENV)
    if given is not None:
        return frozenset(given.replace(",", " ").split())
    return _proc_cpu_flags()


@functools.cache
def _proc_cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """True when the CPU has AMX-BF16 or AVX512-BF16 instructions (Linux /proc/cpuinfo, or
    THRIFTY_CPU_FLAGS where set)."""
    return bool({"amx_bf16", "avx512_bf16"} & _cpu_flags())


def native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 matmuls natively (CUDA ≥ 8.0, or AMX/AVX512-BF16 CPUs)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    return device.type == "cpu" and cpu_has_native_bf16()


def resolve_precision(mode: str, device: torch.device) -> Precision:
    """Turn `auto | bf16 | fp16 | fp32 | fp8` into a concrete Precision for `device`, with the
    reason. fp8 where it cannot run is a ConfigError that says why."""
    kind = device.type
    if mode == "fp8":
        from thrifty.errors import ConfigError
        from thrifty.levers.fp8 import RECIPE, fp8_unavailable

        why = fp8_unavailable(device)
        if why is not None:
            raise ConfigError(f"precision.mode = 'fp8' cannot run here: {why}; use bf16")
        return Precision("fp8", kind, f"requested: float8 linears ({RECIPE} scaling), bf16 else")
    if mode != "auto":
        return Precision(mode, kind, "requested")
    if kind == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        if major >= 8:
            return Precision(
                "bf16", kind, f"{name} (compute capability {major}.{minor}) runs bf16 natively"
            )
        return Precision(
            "fp16",
            kind,
            f"{name} (compute capability {major}.{minor}) lacks bf16: fp16 with a GradScaler",
        )
    if kind == "cpu":
        return _cpu_precision()
    return Precision("fp32", kind, f"no native mixed precision chosen for {kind}")


def _cpu_precision() -> Precision:
    """bf16 where the CPU has the instructions that make it pay off, else fp32."""
    source = f" (as {CPU_FLAGS_ENV} says)" if CPU_FLAGS_ENV in os.environ else ""
    found = sorted({"amx_bf16", "avx512_bf16"} & _cpu_flags())
    if found:
        return Precision("bf16", "cpu", f"CPU has {', '.join(found)}{source}")
    return Precision(
        "fp32", "cpu", f"CPU has no AMX or AVX512-BF16{source}: bf16 would be emulated"
    )
