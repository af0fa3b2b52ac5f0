"""Job estimate: training FLOPs, wall-clock hours and cost for a model, a data size and hardware.

FLOPs: 6 per parameter per token (2 forward, 4 backward), plus for a known transformer shape the
attention-score term 12*L*h*T per token (nanoGPT `estimate_mfu`, torchtitan), plus the recompute
of activation checkpointing: one extra forward (2 FLOPs per parameter per token, and 4*L*h*T for
attention) for every checkpointed layer. Full recompute therefore costs ~8*N*D instead of 6*N*D.

Time = FLOPs / (GPUs x peak FLOP/s for the dtype x MFU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from thrifty.errors import ConfigError
from thrifty.plan.catalog import GPU, Catalog, Instance, load_catalog
from thrifty.plan.units import fmt_count, fmt_pct, require_fraction, require_positive

DEFAULT_MFU = 0.35
MFU_ASSUMPTION = (
    "MFU {mfu} {how} (default 35%: nanoGPT 124M reaches ~37% of an A100, torchtitan Llama-3.1-8B "
    "on 8xH100 33-39%); it is applied to all executed FLOPs, recompute included, so an MFU "
    "measured with recompute on should be paired with --recompute none"
)
RECOMPUTE = {"none": 0.0, "every-other": 0.5, "full": 1.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelShape:
    """A decoder-only transformer: GPT-style blocks, 4x MLP, tied embeddings."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name} must be a whole number > 0, got {value!r}")
        if self.hidden % self.heads:
            raise ConfigError(
                f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads})"
            )

    @property
    def layer_params(self) -> int:
        """Parameters per block: 4h^2 attention + 8h^2 MLP weights, 13h biases and norms."""
        return 12 * self.hidden**2 + 13 * self.hidden

    @property
    def params(self) -> int:
        """All parameters except position embeddings: blocks, token embedding (tied), final norm."""
        return self.layers * self.layer_params + self.vocab * self.hidden + 2 * self.hidden

    @property
    def attention_flops_per_token(self) -> float:
        """Training FLOPs per token of the attention scores and weighted sum: 12*L*h*T."""
        return 12.0 * self.layers * self.hidden * self.seq


@dataclass(frozen=True, slots=True)
class Flops:
    """Training FLOPs split by where they come from; `total` is what the GPUs execute."""

    dense: float
    attention: float
    recompute: float
    counted: bool = False  # dense is forward and backward counted on the model, not 6*N*D

    @property
    def total(self) -> float:
        return self.dense + self.attention + self.recompute


def recompute_fraction(recompute: str | float) -> float:
    """Fraction of layers recomputed in backward: 'none' 0, 'every-other' 0.5, 'full' 1."""
    if isinstance(recompute, str):
        if recompute not in RECOMPUTE:
            raise ConfigError(
                f"recompute must be one of {', '.join(RECOMPUTE)} or a fraction, got {recompute!r}"
            )
        return RECOMPUTE[recompute]
    return require_fraction(recompute, "recompute", allow_zero=True)


def training_flops(
    model: float | ModelShape,
    tokens: float,
    *,
    recompute: str | float = "none",
    flops_per_token: float | None = None,
) -> Flops:
    """Training FLOPs for `tokens` tokens: 6*N*D, attention if the shape is known, recompute.
    `flops_per_token`: forward and backward FLOPs counted on the model itself, in place of
    6*N and attention (recompute adds a third of them: one extra forward)."""
    shape = model if isinstance(model, ModelShape) else None
    params = require_positive(model.params if isinstance(model, ModelShape) else model, "params")
    tokens = require_positive(tokens, "tokens")
    fraction = recompute_fraction(recompute)
    if flops_per_token is not None:
        total = require_positive(flops_per_token, "FLOPs per token") * tokens
        return Flops(total, 0.0, fraction * total / 3, counted=True)
    dense = 6.0 * params * tokens
    attention = shape.attention_flops_per_token * tokens if shape else 0.0
    # One extra forward per checkpointed layer: 2 FLOPs per layer parameter per token, and a
    # third of the attention term (forward is 1/3 of forward + backward).
    layer_params = shape.layers * shape.layer_params if shape else params
    recompute_flops = fraction * (2.0 * layer_params * tokens + attention / 3)
    return Flops(dense=dense, attention=attention, recompute=recompute_flops)


def tokens_from_steps(steps: float, batch: float, seq: int) -> float:
    """Tokens for `steps` optimizer steps of `batch` sequences of `seq` tokens."""
    steps = require_positive(steps, "steps")
    batch = require_positive(batch, "batch")
    return steps * batch * require_positive(seq, "seq")


@dataclass(frozen=True, slots=True)
class Hardware:
    """What a job runs on: the GPU model, how many, and the instance whose price applies."""

    gpu: GPU
    gpus: int
    instance: Instance | None = None
    count: int = 1

    def price_per_hour(self, pricing: str) -> float | None:
        """USD per hour for all `count` instances, or None without an instance or spot price."""
        if self.instance is None:
            return None
        price = (
            self.instance.on_demand_per_hour
            if pricing == "on-demand"
            else self.instance.spot_per_hour
        )
        return None if price is None else price * self.count


def resolve_hardware(
    *,
    instance: str | Instance | None = None,
    gpu: str | GPU | None = None,
    count: int = 1,
    catalog: Catalog | None = None,
) -> Hardware:
    """`count` instances of `instance`, or `count` GPUs of type `gpu` (no price)."""
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        raise ConfigError(f"count must be a whole number > 0, got {count!r}")
    if (instance is None) == (gpu is None):
        raise ConfigError("give exactly one of instance (e.g. p4d.24xlarge) or gpu (e.g. A100)")
    catalog = catalog or load_catalog()
    if instance is not None:
        found = catalog.instance(instance)
        return Hardware(found.gpu, found.gpu_count * count, found, count)
    assert gpu is not None  # exactly one of instance and gpu was given
    return Hardware(catalog.gpu(gpu), count)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A job's FLOPs, hours and cost. Hours are wall-clock; costs in USD; peak in FLOP/s per GPU."""

    params: float
    tokens: float
    flops: Flops
    gpu: str
    gpus: int
    dtype: str
    mfu: float
    peak_flops_per_gpu: float
    hours: float
    price_per_hour: dict[str, float | None]
    cost: dict[str, float | None]
    instance: str | None
    assumptions: list[str] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.gpus

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["flops"] = {**asdict(self.flops), "total": self.flops.total}
        data["gpu_hours"] = self.gpu_hours
        return data


def estimate(
    model: float | ModelShape,
    tokens: float,
    *,
    instance: str | Instance | None = None,
    gpu: str | GPU | None = None,
    count: int = 1,
    dtype: str = "bf16",
    mfu: float | None = None,
    recompute: str | float = "none",
    catalog: Catalog | None = None,
    flops_per_token: float | None = None,
) -> Estimate:
    """FLOPs, wall-clock hours and USD cost of training `model` on `tokens` tokens.

    `model` is a parameter count or a `ModelShape`. Hardware is `count` instances of `instance`
    (priced on-demand and spot from the catalog) or `count` GPUs of type `gpu` (unpriced).
    `mfu` (0-1] defaults to DEFAULT_MFU; `recompute` is 'none', 'every-other', 'full' or a
    fraction of layers. Eight keywords mirror the independent knobs of the command line;
    `flops_per_token`, FLOPs counted on the model (`thrifty plan CONFIG.toml`), replaces 6*N.
    """
    hardware = resolve_hardware(instance=instance, gpu=gpu, count=count, catalog=catalog)
    assumed = mfu is None
    mfu = require_fraction(DEFAULT_MFU if mfu is None else mfu, "mfu")
    flops = training_flops(model, tokens, recompute=recompute, flops_per_token=flops_per_token)
    peak = hardware.gpu.peak_flops(dtype)
    hours = flops.total / (hardware.gpus * peak * mfu) / 3600
    prices = {p: hardware.price_per_hour(p) for p in ("on-demand", "spot")}
    cost = {p: None if price is None else price * hours for p, price in prices.items()}
    params = model.params if isinstance(model, ModelShape) else float(model)
    assumptions = [
        MFU_ASSUMPTION.format(mfu=fmt_pct(mfu), how="assumed" if assumed else "given"),
        f"peak {peak / 1e12:g} TFLOP/s per GPU for {dtype} ({hardware.gpu.peak_source})",
        _flops_note(model, recompute, flops_per_token),
    ]
    if hardware.instance is not None:
        assumptions.append(_price_note(hardware.instance))
    else:
        assumptions.append("no instance given: cost needs --instance")
    return Estimate(
        params=params,
        tokens=float(tokens),
        flops=flops,
        gpu=hardware.gpu.name,
        gpus=hardware.gpus,
        dtype=dtype,
        mfu=mfu,
        peak_flops_per_gpu=peak,
        hours=hours,
        price_per_hour=prices,
        cost=cost,
        instance=hardware.instance.name if hardware.instance else None,
        assumptions=assumptions,
    )


def _flops_note(
    model: float | ModelShape, recompute: str | float, flops_per_token: float | None = None
) -> str:
    base = "FLOPs = 6*N*D"
    if flops_per_token is not None:
        base = f"FLOPs = {flops_per_token:.4g} per token (counted on the model) x D"
    if isinstance(model, ModelShape):
        base += f" + 12*L*h*T*D attention (N = {fmt_count(model.params)} from the shape)"
    fraction = recompute_fraction(recompute)
    if fraction:
        base += f" + recompute of {fmt_pct(fraction)} of layers (one extra forward each)"
    return base


def _price_note(instance: Instance) -> str:
    note = f"prices for {instance.name}: {instance.dated_source}"
    if instance.spot_range is not None and instance.spot_per_hour is not None:
        low, high = instance.spot_range
        basis = instance.spot_basis or "typical"
        note += f"; spot ${instance.spot_per_hour:.2f}/h ({basis}, ${low:.2f}-${high:.2f}/h)"
    elif instance.spot_per_hour is None:
        note += "; no spot price listed"
    return note


def priced_gpu(gpu: str | GPU, count: int = 1, catalog: Catalog | None = None) -> Hardware:
    """`count` GPUs `gpu` on the cheapest catalog instance that has exactly that many (one
    with a spot price first at an equal price); unpriced when no instance has them."""
    catalog = catalog or load_catalog()
    found = catalog.gpu(gpu)
    rows = [
        i for i in catalog.instances.values() if i.gpu.name == found.name and i.gpu_count == count
    ]
    rows.sort(key=lambda i: (i.on_demand_per_hour, i.spot_per_hour is None, i.name))
    if not rows:
        return Hardware(found, count)
    return Hardware(found, count, rows[0], 1)
