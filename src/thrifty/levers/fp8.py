"""FP8 training through torchao's float8 linears, and the parity check that decides whether
it may be kept.

FP8 matmuls run at twice bf16's tensor-core peak on Hopper and newer (compute capability 8.9
and up), but they pay only where the matmuls are large enough for the saved time to outweigh
the casts and the scales they add, and they change the numbers. So FP8 is never a default:
it is a candidate, kept only when it is faster (measured) and when its loss over the same
steps on the same data stays within `PARITY_NATS` of bf16's (`parity`).

Cheap to import: torchao and torch's CUDA queries are imported when called.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PARITY_NATS = 0.01  # how far FP8's loss may sit from bf16's over the same steps
PARITY_LAST = 5  # the loss compared is the mean of the last steps: one step's noise is larger
MIN_CAPABILITY = (8, 9)  # Ada and Hopper: the first with FP8 tensor cores
RECIPE = "tensorwise"  # dynamic per-tensor scales, cuBLAS's kernel: torchao's fastest recipe


def fp8_unavailable(device: Any) -> str | None:
    """Why FP8 training cannot run on `device` (a torch.device), or None when it can."""
    if device.type != "cuda":
        return f"FP8 needs a CUDA GPU of compute capability 8.9 or newer, not {device.type}"
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return f"{name} (compute capability {major}.{minor}) has no FP8 tensor cores"
    if importlib.util.find_spec("torchao") is None:
        return "FP8 training needs torchao: pip install torchao"
    return None


def fp8_eligible(module: Any, name: str) -> bool:
    """Whether a linear layer is converted: both its dimensions multiples of 16 (what the FP8
    kernels take), and not the output head, whose logits the loss is most sensitive to."""
    import torch

    if not isinstance(module, torch.nn.Linear):
        return False
    last = name.rsplit(".", 1)[-1]
    if last in ("head", "lm_head", "output"):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert_to_fp8(model: Any) -> int:
    """Swap `model`'s eligible linear layers for torchao's float8 ones, in place; the number
    swapped. Call before torch.compile (FP8 is slow without it) and before the optimizer is
    built (the parameters stay the same tensors)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    before = _linears(model)
    convert_to_float8_training(
        model,
        module_filter_fn=fp8_eligible,
        config=Float8LinearConfig.from_recipe_name(RECIPE),
    )
    return before - _linears(model)


def apply_fp8(model: Any) -> int:
    """`convert_to_fp8`, refusing a model it leaves as it was (ConfigError, one line)."""
    from thrifty.errors import ConfigError

    converted = convert_to_fp8(model)
    if not converted:
        raise ConfigError(
            "precision.mode = 'fp8' found no linear layer to convert (both dimensions multiples "
            "of 16, the output head left out): use bf16"
        )
    return converted


def _linears(model: Any) -> int:
    import torch

    return sum(type(m) is torch.nn.Linear for m in model.modules())


@dataclass(frozen=True, slots=True)
class Parity:
    """FP8's loss against bf16's over the same steps: `delta` (FP8 less bf16, in nats, over
    the last `last` steps) and whether it is within `tolerance`."""

    reference: float
    candidate: float
    tolerance: float
    last: int

    @property
    def delta(self) -> float:
        return self.candidate - self.reference

    @property
    def ok(self) -> bool:
        return math.isfinite(self.delta) and abs(self.delta) <= self.tolerance

    def describe(self) -> str:
        verdict = "within" if self.ok else "outside"
        return (
            f"FP8 loss {self.candidate:.4f} vs bf16 {self.reference:.4f} over the last "
            f"{self.last} steps: {self.delta:+.4f} nats, {verdict} ±{self.tolerance}"
        )


def parity(
    reference: Sequence[float],
    candidate: Sequence[float],
    tolerance: float = PARITY_NATS,
    last: int = PARITY_LAST,
) -> Parity:
    """Compare two runs' per-step losses over the same steps on the same data: the mean of
    the last `last` steps of each. Raises ValueError when the runs differ in length (they
    would not be the same steps) or are empty."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(
            f"the parity check needs the same steps from both runs, got {len(reference)} and "
            f"{len(candidate)}: run both for the same number of steps on the same data"
        )
    k = max(1, min(last, len(reference)))
    return Parity(
        reference=sum(reference[-k:]) / k,
        candidate=sum(candidate[-k:]) / k,
        tolerance=tolerance,
        last=k,
    )
