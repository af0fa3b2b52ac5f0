"""Compute-optimal model size and tokens for a compute budget (Chinchilla).

Parametric loss fit (Hoffmann et al. 2022): L(N, D) = E + A/N^alpha + B/D^beta. Minimising it
under C = 6*N*D gives the closed form

    G = (alpha*A / (beta*B))^(1/(alpha+beta)),   N* = G * (C/6)^(beta/(alpha+beta)),
    D* = C / (6*N*),

so N*·D*·6 = C holds exactly by construction, for every fit.

Fits:
- "epoch" (default): Epoch AI's replication (Besiroglu et al. 2024, arXiv 2404.10102). It
  reproduces Chinchilla's own allocation (70B parameters, 1.4T tokens at 5.88e23 FLOPs).
  Its coefficients are read from secondary copies of the paper and are marked uncertain.
- "hoffmann": the paper's rounded published coefficients. At 5.88e23 FLOPs they give ~33B
  parameters, far from the 70B the paper trained: the rounding moves the optimum a lot.
- "tokens-per-param": the ~20 tokens per parameter rule: N* = sqrt(C/120), D* = 20*N*.

The formula N = 0.2536*C^0.4995, D = 1.7424*C^0.5005 that circulates in blog posts is not in the
paper and breaks C = 6*N*D (it gives N*D ~ 0.44*C); it is not used here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from thrifty.errors import ConfigError
from thrifty.plan.catalog import GPU, Catalog, Instance, load_catalog
from thrifty.plan.units import require_fraction, require_positive


@dataclass(frozen=True, slots=True)
class LossFit:
    """Coefficients of L(N, D) = E + A/N^alpha + B/D^beta and where they come from."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str
    uncertain: bool = False

    def loss(self, params: float, tokens: float) -> float:
        return self.E + self.A / params**self.alpha + self.B / tokens**self.beta


FITS = {
    "epoch": LossFit(
        1.8172,
        482.01,
        2085.43,
        0.3478,
        0.3658,
        "Epoch AI replication, Besiroglu et al. 2024 (arXiv 2404.10102); coefficients from "
        "secondary copies [uncertain]",
        uncertain=True,
    ),
    "hoffmann": LossFit(
        1.69,
        406.4,
        410.7,
        0.34,
        0.28,
        "Hoffmann et al. 2022, published rounded coefficients",
    ),
}
TOKENS_PER_PARAM = 20.0
FIT_NAMES = (*FITS, "tokens-per-param")
DEFAULT_FIT = "epoch"


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """A compute-optimal split of `flops` FLOPs into parameters and training tokens."""

    flops: float
    params: float
    tokens: float
    fit: str
    source: str
    loss: float | None
    assumptions: list[str] = field(default_factory=list)

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "tokens_per_param": self.tokens_per_param}


def chinchilla(flops: float, *, fit: str = DEFAULT_FIT) -> Allocation:
    """Compute-optimal parameters and tokens for a budget of `flops` FLOPs (C = 6*N*D).

    `fit` is 'epoch' (default), 'hoffmann' or 'tokens-per-param'. See the module docstring.
    """
    flops = require_positive(flops, "compute budget (FLOPs)")
    if fit == "tokens-per-param":
        params = math.sqrt(flops / (6.0 * TOKENS_PER_PARAM))
        source = "rule of thumb: ~20 tokens per parameter (Chinchilla: 70B params, 1.4T tokens)"
    elif fit in FITS:
        params = optimal_params(flops, FITS[fit])
        source = FITS[fit].source
    else:
        raise ConfigError(f"fit must be one of {', '.join(FIT_NAMES)}, got {fit!r}")
    tokens = flops / (6.0 * params)
    loss = FITS[fit].loss(params, tokens) if fit in FITS else None
    return Allocation(
        flops=flops,
        params=params,
        tokens=tokens,
        fit=fit,
        source=source,
        loss=loss,
        assumptions=[
            f"fit: {fit} ({source})",
            "C = 6*N*D holds exactly: D* = C / (6*N*)",
            "not used: N = 0.2536*C^0.4995, D = 1.7424*C^0.5005 (not in the paper; N*D*6 != C)",
        ],
    )


def optimal_params(flops: float, c: LossFit) -> float:
    """N* (parameters) minimising `c`'s loss under C = 6*N*D for `flops` FLOPs: the closed form
    of the module docstring. Needs alpha > 0 and beta > 0 (a loss that falls with both)."""
    g = (c.alpha * c.A / (c.beta * c.B)) ** (1.0 / (c.alpha + c.beta))
    return float(g * (flops / 6.0) ** (c.beta / (c.alpha + c.beta)))


def flops_from_gpu_hours(gpu_hours: float, gpu: GPU, *, dtype: str = "bf16", mfu: float) -> float:
    """Useful training FLOPs bought by `gpu_hours` GPU-hours at `mfu` of the dtype's peak FLOP/s."""
    hours = require_positive(gpu_hours, "budget (GPU-hours)")
    return hours * 3600.0 * gpu.peak_flops(dtype) * require_fraction(mfu, "mfu")


def gpu_hours_from_dollars(
    dollars: float, instance: Instance, *, pricing: str = "on-demand"
) -> float:
    """GPU-hours that `dollars` USD buy on `instance` at `pricing` ('on-demand' or 'spot')."""
    dollars = require_positive(dollars, "budget (dollars)")
    return dollars / instance.price_per_hour(pricing) * instance.gpu_count


def budget_flops(
    *,
    flops: float | None = None,
    gpu_hours: float | None = None,
    dollars: float | None = None,
    instance: str | Instance | None = None,
    gpu: str | GPU | None = None,
    dtype: str = "bf16",
    mfu: float,
    pricing: str = "on-demand",
    catalog: Catalog | None = None,
) -> tuple[float, list[str]]:
    """A budget in FLOPs from exactly one of FLOPs, GPU-hours (on `gpu` or `instance`'s GPU) or
    USD (on `instance`), with notes on how it was converted. Keywords mirror the CLI options."""
    if sum(x is not None for x in (flops, gpu_hours, dollars)) != 1:
        raise ConfigError("give exactly one budget: FLOPs, GPU-hours or dollars")
    if flops is not None:
        return require_positive(flops, "compute budget (FLOPs)"), []
    catalog = catalog or load_catalog()
    notes: list[str] = []
    if dollars is not None:
        if instance is None:
            raise ConfigError("a budget in dollars needs an instance to price it (--instance)")
        found = catalog.instance(instance)
        gpu_hours = gpu_hours_from_dollars(dollars, found, pricing=pricing)
        notes.append(
            f"${dollars:,.0f} at {pricing} ${found.price_per_hour(pricing):.2f}/h for "
            f"{found.gpu_count} GPUs ({found.name}; {found.dated_source}) "
            f"= {gpu_hours:,.0f} GPU-hours"
        )
        device = found.gpu
    elif instance is not None:
        device = catalog.instance(instance).gpu
    elif gpu is not None:
        device = catalog.gpu(gpu)
    else:
        raise ConfigError("a budget in GPU-hours needs a GPU (--gpu) or an instance (--instance)")
    assert gpu_hours is not None  # given, or bought with the dollars: one budget was given
    total = flops_from_gpu_hours(gpu_hours, device, dtype=dtype, mfu=mfu)
    notes.append(
        f"{gpu_hours:,.0f} GPU-hours x {device.peak_flops(dtype) / 1e12:g} TFLOP/s ({device.name}, "
        f"{dtype}) x MFU {mfu:.0%} = {total:.3g} FLOPs"
    )
    return total, notes
