"""Training memory per GPU: weights, gradients, optimizer states, activations; does it fit?

Per parameter (EleutherAI cookbook `calc_transformer_mem.py`, "Transformer Math 101"), in one of
two layouts for mixed precision (bf16 / fp16 / fp8 compute):
- "autocast", what PyTorch users run: parameters and gradients stay fp32 (4 + 4 bytes) and
  torch.autocast casts to 16 bits inside each op; DDP, and FSDP with an fp32 reduce, keep them
  so. The fp32 parameters are what the optimizer updates: there is no separate master copy.
- "16-bit", the ZeRO paper's (Rajbhandari et al. 2020): 16-bit weights 2 and gradients 2, plus a
  4-byte fp32 master copy that the optimizer updates.
fp32 / tf32 training keeps weights 4 and gradients 4 in either. Optimizer states: AdamW 8 (two fp32
moments), SGD with momentum 4, plain SGD 0. So mixed-precision AdamW is 16 bytes per parameter in
both layouts (4 + 4 + 8 or 2 + 2 + 4 + 8); they differ once states are sharded.
ZeRO / FSDP sharding over `shards` data-parallel GPUs: stage 1 divides the optimizer states (master
copy included), stage 2 also the gradients, stage 3 also the weights. For 7B on 8 GPUs with
ZeRO-1: autocast 4 + 4 + 8/8 = 9 bytes/param (58.7 GiB), 16-bit 2 + 2 + 12/8 = 5.5 (35.9 GiB).

Activations per transformer layer with 16-bit activations (Korthikanti et al. 2022):
s*b*h*(34 + 5*a*s/h) bytes with eager attention, which stores the s x s score matrices;
fused/flash attention (PyTorch scaled_dot_product_attention) never stores them, leaving 34*s*b*h.
A layer under full recomputation keeps only its input, 2*s*b*h, and during backward one layer's
full activations exist at a time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from thrifty.errors import ConfigError
from thrifty.plan.catalog import GPU, Catalog, load_catalog
from thrifty.plan.estimate import ModelShape, recompute_fraction
from thrifty.plan.units import fmt_bytes, fmt_pct, require_fraction, require_positive

OPTIMIZER_BYTES = {"adamw": 8.0, "sgd-momentum": 4.0, "sgd": 0.0}
ATTENTION = ("flash", "eager")
MIXED = ("bf16", "fp16", "fp8")
LAYOUTS = ("autocast", "16-bit")
LAYOUT_NAMES = {
    "autocast": "autocast layout (fp32 parameters and gradients)",
    "16-bit": "16-bit layout (ZeRO paper: 16-bit weights and gradients, fp32 master copy)",
    "fp32": "fp32 layout (fp32 weights and gradients)",
}
LAYOUT_WHY = {
    "autocast": ": torch.autocast computes in 16 bits but keeps them fp32, as DDP and FSDP with an "
    "fp32 reduce do; the optimizer updates them, so there is no master copy",
    "16-bit": ": what DeepSpeed's ZeRO and Megatron keep; torch.autocast does not",
    "fp32": "",
}
DEFAULT_USABLE = 0.9


@dataclass(frozen=True, slots=True)
class BytesPerParam:
    """Bytes per parameter before sharding."""

    weights: float
    gradients: float
    master: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.master + self.optimizer


def resolve_layout(dtype: str, layout: str = "autocast") -> str:
    """The layout `dtype` runs in: `layout` for mixed precision, "fp32" for fp32 / tf32 (which
    have no 16-bit copy to lay out)."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if dtype in MIXED:
        return layout
    if dtype in ("fp32", "tf32"):
        return "fp32"
    raise ConfigError(f"dtype must be one of fp32, tf32, bf16, fp16, fp8, got {dtype!r}")


def bytes_per_param(
    dtype: str = "bf16", optimizer: str = "adamw", layout: str = "autocast"
) -> BytesPerParam:
    """Bytes per parameter for weights, gradients, fp32 master copy and optimizer states in
    `layout` ("autocast" or "16-bit"; see the module docstring)."""
    if optimizer not in OPTIMIZER_BYTES:
        raise ConfigError(
            f"optimizer must be one of {', '.join(OPTIMIZER_BYTES)}, got {optimizer!r}"
        )
    if resolve_layout(dtype, layout) == "16-bit":
        return BytesPerParam(2.0, 2.0, 4.0, OPTIMIZER_BYTES[optimizer])
    return BytesPerParam(4.0, 4.0, 0.0, OPTIMIZER_BYTES[optimizer])


def state_bytes(
    params: float, per: BytesPerParam, zero_stage: int, shards: int
) -> tuple[float, float, float]:
    """Bytes per GPU of (weights, gradients, optimizer states with the master copy) once ZeRO
    stage `zero_stage` shards them over `shards` GPUs."""
    split = {stage: shards if zero_stage >= stage else 1 for stage in (1, 2, 3)}
    return (
        params * per.weights / split[3],
        params * per.gradients / split[2],
        params * (per.master + per.optimizer) / split[1],
    )


def layer_activation_bytes(
    shape: ModelShape, micro_batch: int, *, attention: str = "flash", recomputed: bool = False
) -> float:
    """Activation bytes one transformer layer keeps for backward (16-bit activations)."""
    if attention not in ATTENTION:
        raise ConfigError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    s, b, h, a = shape.seq, micro_batch, shape.hidden, shape.heads
    if recomputed:
        return 2.0 * s * b * h
    scores = 5.0 * a * s / h if attention == "eager" else 0.0
    return s * b * h * (34.0 + scores)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryPlan:
    """Bytes per GPU by category, the GPU's capacity and the largest micro-batch that fits."""

    params: float
    dtype: str
    layout: str
    optimizer: str
    zero_stage: int
    shards: int
    per_param: BytesPerParam
    weights: float
    gradients: float
    optimizer_states: float
    activations: float | None
    logits: float | None
    micro_batch: int
    layer_activations: dict[str, float] | None
    gpu: str | None
    capacity: float | None
    usable: float | None
    fits: bool | None
    max_micro_batch: int | None
    max_micro_batch_full_recompute: int | None
    layout_totals: dict[str, float] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)

    @property
    def states(self) -> float:
        return self.weights + self.gradients + self.optimizer_states

    @property
    def total(self) -> float:
        return self.states + (self.activations or 0.0) + (self.logits or 0.0)

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.update(states=self.states, total=self.total, per_param_total=self.per_param.total)
        return data


def memory(
    model: float | ModelShape,
    *,
    gpu: str | GPU | None = None,
    dtype: str = "bf16",
    layout: str = "autocast",
    optimizer: str = "adamw",
    zero_stage: int = 0,
    shards: int = 1,
    micro_batch: int = 1,
    recompute: str | float = "none",
    attention: str = "flash",
    usable_fraction: float = DEFAULT_USABLE,
    catalog: Catalog | None = None,
) -> MemoryPlan:
    """Training memory per GPU in bytes, and whether it fits `gpu`.

    Activations need a `ModelShape`; with a bare parameter count only the states are counted.
    `layout` is "autocast" (fp32 parameters and gradients) or "16-bit" (the ZeRO paper's); the
    total under every layout that applies to `dtype` is kept in `layout_totals` for comparison.
    `zero_stage` 0-3 shards states over `shards` GPUs. The job fits when the total is at most
    `usable_fraction` of the GPU's memory (the rest goes to the CUDA context, allocator
    fragmentation and temporary buffers). One keyword per independent knob of the command line.
    """
    shape = model if isinstance(model, ModelShape) else None
    params = require_positive(
        float(model.params if isinstance(model, ModelShape) else model), "params"
    )
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    if not isinstance(shards, int) or shards <= 0:
        raise ConfigError(f"shards must be a whole number > 0, got {shards!r}")
    if not isinstance(micro_batch, int) or micro_batch <= 0:
        raise ConfigError(f"micro_batch must be a whole number > 0, got {micro_batch!r}")
    usable_fraction = require_fraction(usable_fraction, "usable_fraction")
    per = bytes_per_param(dtype, optimizer, layout)
    layout = resolve_layout(dtype, layout)
    weights, gradients, optimizer_states = state_bytes(params, per, zero_stage, shards)
    states = weights + gradients + optimizer_states

    fraction = recompute_fraction(recompute)
    act = _activations(shape, micro_batch, fraction, attention, dtype) if shape else None
    layer = _layer_table(shape, micro_batch, attention, dtype) if shape else None
    logits = 4.0 * shape.seq * micro_batch * shape.vocab if shape else None

    device = (catalog or load_catalog()).gpu(gpu) if gpu is not None else None
    capacity = device.memory_bytes if device else None
    usable = capacity * usable_fraction if capacity else None
    others = (act or 0.0) + (logits or 0.0)
    fits = None if usable is None else states + others <= usable
    totals = {
        name: states_in + others
        for name, states_in in _states_by_layout(params, dtype, optimizer, zero_stage, shards)
    }
    largest = _largest(shape, usable, states, fraction, attention, dtype) if usable else None
    largest_full = _largest(shape, usable, states, 1.0, attention, dtype) if usable else None
    return MemoryPlan(
        params=params,
        dtype=dtype,
        layout=layout,
        optimizer=optimizer,
        zero_stage=zero_stage,
        shards=shards,
        per_param=per,
        weights=weights,
        gradients=gradients,
        optimizer_states=optimizer_states,
        activations=act,
        logits=logits,
        micro_batch=micro_batch,
        layer_activations=layer,
        gpu=device.name if device else None,
        capacity=capacity,
        usable=usable,
        fits=fits,
        max_micro_batch=largest,
        max_micro_batch_full_recompute=largest_full,
        layout_totals=totals,
        assumptions=_layout_notes(layout, totals)
        + _assumptions(shape, attention, dtype, usable_fraction, per, zero_stage, shards),
    )


def _states_by_layout(
    params: float, dtype: str, optimizer: str, zero_stage: int, shards: int
) -> list[tuple[str, float]]:
    """Weights, gradients and optimizer states per GPU, in bytes, under each layout `dtype` can
    run in (one for fp32 / tf32)."""
    rows = {}
    for name in LAYOUTS:
        per = bytes_per_param(dtype, optimizer, name)
        rows[resolve_layout(dtype, name)] = sum(state_bytes(params, per, zero_stage, shards))
    return list(rows.items())


def _layout_notes(layout: str, totals: dict[str, float]) -> list[str]:
    """Which layout the figures assume, and the total under each other layout."""
    notes = [f"{LAYOUT_NAMES[layout]} for the figures above{LAYOUT_WHY[layout]}"]
    notes += [
        f"the {LAYOUT_NAMES[name]} would need {fmt_bytes(total)} per GPU"
        for name, total in totals.items()
        if name != layout
    ]
    return notes


def _dtype_scale(dtype: str) -> float:
    # Korthikanti's counts assume 16-bit activations; fp32 activations take about twice as much.
    return 2.0 if dtype in ("fp32", "tf32") else 1.0


def _activations(
    shape: ModelShape, micro_batch: int, fraction: float, attention: str, dtype: str
) -> float:
    """Activation bytes for all layers with a `fraction` of them recomputed."""
    full = layer_activation_bytes(shape, micro_batch, attention=attention)
    kept = layer_activation_bytes(shape, micro_batch, attention=attention, recomputed=True)
    recomputed_layers = round(fraction * shape.layers)
    stored = (shape.layers - recomputed_layers) * full + recomputed_layers * kept
    # While backward runs through a recomputed layer its full activations exist once more.
    working = full if recomputed_layers else 0.0
    return (stored + working) * _dtype_scale(dtype)


def _layer_table(
    shape: ModelShape, micro_batch: int, attention: str, dtype: str
) -> dict[str, float]:
    scale = _dtype_scale(dtype)
    return {
        "stored": layer_activation_bytes(shape, micro_batch, attention=attention) * scale,
        "recomputed": layer_activation_bytes(
            shape, micro_batch, attention=attention, recomputed=True
        )
        * scale,
        "eager_attention": layer_activation_bytes(shape, micro_batch, attention="eager") * scale,
        "flash_attention": layer_activation_bytes(shape, micro_batch, attention="flash") * scale,
    }


def _largest(
    shape: ModelShape | None,
    usable: float,
    states: float,
    fraction: float,
    attention: str,
    dtype: str,
) -> int | None:
    """Largest micro-batch whose activations and logits fit beside the states (all linear in b)."""
    if shape is None:
        return None
    per_sample = _activations(shape, 1, fraction, attention, dtype) + 4.0 * shape.seq * shape.vocab
    return max(0, math.floor((usable - states) / per_sample))


def _assumptions(
    shape: ModelShape | None,
    attention: str,
    dtype: str,
    usable_fraction: float,
    per: BytesPerParam,
    zero_stage: int,
    shards: int,
) -> list[str]:
    notes = [
        f"{per.total:g} bytes/param before sharding (weights {per.weights:g}, gradients "
        f"{per.gradients:g}, fp32 master {per.master:g}, optimizer {per.optimizer:g})",
        f"fits if the total is at most {fmt_pct(usable_fraction)} of GPU memory (CUDA context, "
        "fragmentation and temporary buffers take the rest)",
    ]
    if zero_stage:
        notes.append(f"ZeRO/FSDP stage {zero_stage} over {shards} data-parallel GPUs")
    if shape is None:
        notes.append("activations not counted: give the transformer shape to include them")
        return notes
    attn = (
        "flash/fused attention assumed (no s x s score matrices stored: 34*s*b*h per layer)"
        if attention == "flash"
        else "eager attention assumed (s*b*h*(34 + 5*a*s/h) per layer)"
    )
    notes.append(f"activations per Korthikanti et al. 2022; {attn}")
    notes.append("logits: one fp32 copy, 4*s*b*V bytes, for the loss")
    if dtype in ("fp32", "tf32"):
        notes.append("fp32 activations counted at twice the 16-bit figure")
    return notes


def describe(plan: MemoryPlan) -> str:
    """One line: total per GPU against capacity."""
    if plan.capacity is None:
        return f"{fmt_bytes(plan.total)} per GPU"
    verdict = "fits" if plan.fits else "does NOT fit"
    return f"{fmt_bytes(plan.total)} per GPU {verdict} in {plan.gpu} ({fmt_bytes(plan.capacity)})"
