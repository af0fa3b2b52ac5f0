"""The GPU and cloud-instance catalog: peak FLOP/s, memory, links and dated prices.

The catalog ships as `catalog.toml` next to this module. A user file with the same layout, given
as `load_catalog(path)`, `--catalog FILE` or the THRIFTY_CATALOG environment variable, adds rows
or replaces rows of the same name, so prices can be brought up to date without a release.
A malformed file is reported with its path, line and field (see `catalog_file`).
"""

from __future__ import annotations

import difflib
import os
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.errors import ConfigError, ThriftyError
from thrifty.plan.catalog_file import (
    DTYPES,
    KINDS,
    PRICE_FIELDS,
    CatalogError,
    Row,
    Where,
    read_rows,
)

BUILTIN_PATH = Path(__file__).with_name("catalog.toml")
ENV_VAR = "THRIFTY_CATALOG"
PRICINGS = ("on-demand", "spot")
TERMS = ("1-year", "3-year")
__all__ = [
    "DTYPES",
    "GPU",
    "Catalog",
    "CatalogError",
    "Instance",
    "StoragePrice",
    "UnknownNameError",
    "load_catalog",
]


class UnknownNameError(ThriftyError, LookupError):
    """A GPU or instance name is not in the catalog: the message suggests the closest names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GPU:
    """One GPU model. Throughput in FLOP/s, memory in bytes, links in GB/s per direction."""

    name: str
    aliases: tuple[str, ...] = ()
    peak_tflops: Mapping[str, float]
    peak_source: str
    memory_gib: float
    memory_bandwidth_gbs: float
    memory_source: str
    interconnect: str
    interconnect_gbs_per_direction: float
    interconnect_note: str = ""
    bus_gbs: float | None = None
    bus_source: str = ""
    nvlink_domain: int = 1
    nvlink_domain_source: str = ""
    uncertain: tuple[str, ...] = ()
    untraced: tuple[str, ...] = ()

    def peak_flops(self, dtype: str) -> float:
        """Peak dense FLOP/s per GPU for `dtype` (one of fp32, tf32, bf16, fp16, fp8)."""
        if dtype not in self.peak_tflops:
            have = ", ".join(self.peak_tflops)
            raise ConfigError(
                f"dtype {dtype!r}: the catalog has no {dtype} peak for {self.name} "
                f"(it has {have}); choose --dtype from those"
            )
        return self.peak_tflops[dtype] * 1e12

    @property
    def memory_bytes(self) -> float:
        """Memory size in bytes (GiB x 2**30)."""
        return self.memory_gib * 2**30

    @property
    def usable_bus_gbs(self) -> float:
        """All-reduce bus bandwidth, GB/s per direction: measured if known, else datasheet."""
        return self.bus_gbs if self.bus_gbs is not None else self.interconnect_gbs_per_direction


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    """One cloud instance type. Prices in USD per hour for the whole instance."""

    name: str
    provider: str
    region: str
    gpu: GPU
    gpu_count: int
    on_demand_per_hour: float
    spot_per_hour: float | None
    spot_range: tuple[float, float] | None
    price_source: str
    price_date: str
    snapshot: str = ""
    spot_zones: Mapping[str, float] = field(default_factory=dict)
    spot_basis: str = ""
    price_note: str = ""
    network_gbits: float | None = None
    network_source: str = ""
    commit_1y_per_hour: float | None = None
    commit_3y_per_hour: float | None = None
    commit_source: str = ""
    commit_date: str = ""
    uncertain: tuple[str, ...] = ()
    untraced: tuple[str, ...] = ()

    def commitments(self) -> dict[str, float]:
        """Committed USD per hour of the term by term ('1-year', '3-year'), the ones listed."""
        terms = {"1-year": self.commit_1y_per_hour, "3-year": self.commit_3y_per_hour}
        return {term: price for term, price in terms.items() if price is not None}

    def price_per_hour(self, pricing: str = "on-demand") -> float:
        """USD per hour for the instance at `pricing` ('on-demand' or 'spot')."""
        if pricing == "on-demand":
            return self.on_demand_per_hour
        if pricing != "spot":
            raise ConfigError(f"pricing must be one of {', '.join(PRICINGS)}, got {pricing!r}")
        if self.spot_per_hour is None:
            raise ConfigError(
                f"pricing 'spot': {self.name} has no spot price in the catalog; "
                "use --pricing on-demand or add a spot price in a --catalog file"
            )
        return self.spot_per_hour

    @property
    def network_gbs(self) -> float | None:
        """Instance network bandwidth in GB/s per direction (catalog figure in Gbit/s / 8)."""
        return None if self.network_gbits is None else self.network_gbits / 8

    @property
    def dated_source(self) -> str:
        return f"{self.price_source}, {self.price_date}"

    @property
    def price_traced(self) -> bool:
        """False when a price of this row cannot be traced to a primary source."""
        return not any(key in PRICE_FIELDS for key in self.untraced)

    @property
    def nvlink_domain(self) -> int:
        """GPUs of this instance on one scale-up fabric (NVLink/NVSwitch, Infinity Fabric)."""
        return min(self.gpu.nvlink_domain, self.gpu_count)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoragePrice:
    """What an object store charges to keep data: USD per GiB (2**30 bytes) per month, at the
    first tier of `storage_class` in `region`. `protocols` are the URL schemes it serves
    (s3, gs), which is how a checkpoint location finds its price."""

    name: str
    provider: str
    region: str
    storage_class: str
    protocols: tuple[str, ...]
    usd_per_gib_month: float
    price_source: str
    price_date: str
    tier_note: str = ""
    price_note: str = ""
    uncertain: tuple[str, ...] = ()

    def usd_per_month(self, size_bytes: float) -> float:
        """USD per month to keep `size_bytes` bytes (first-tier price)."""
        return size_bytes / 2**30 * self.usd_per_gib_month

    @property
    def dated_source(self) -> str:
        return f"{self.price_source}, {self.price_date}"


@dataclass(frozen=True, slots=True)
class Catalog:
    """GPUs and instances by name; lookups ignore case and accept GPU aliases."""

    gpus: dict[str, GPU]
    instances: dict[str, Instance]
    files: tuple[str, ...] = field(default=())
    storage: dict[str, StoragePrice] = field(default_factory=dict)

    def storage_price(self, protocol: str) -> StoragePrice | None:
        """The first storage row serving URLs of `protocol` (s3, gs, ...); None where none
        does (a local disk, memory://)."""
        key = protocol.casefold()
        return next((s for s in self.storage.values() if key in s.protocols), None)

    def gpu(self, name: str | GPU) -> GPU:
        """The GPU called `name` (or one of its aliases); raises with suggestions if unknown."""
        if isinstance(name, GPU):
            return name
        key = name.casefold()
        for gpu in self.gpus.values():
            if key == gpu.name.casefold() or key in (a.casefold() for a in gpu.aliases):
                return gpu
        names = [g.name for g in self.gpus.values()] + [
            a for g in self.gpus.values() for a in g.aliases
        ]
        raise UnknownNameError(_unknown("GPU", name, names, "thrifty prices --gpus"))

    def instance(self, name: str | Instance) -> Instance:
        """The instance called `name`; raises with suggestions if unknown."""
        if isinstance(name, Instance):
            return name
        key = name.casefold()
        for instance in self.instances.values():
            if key == instance.name.casefold():
                return instance
        raise UnknownNameError(
            _unknown("instance", name, list(self.instances), "thrifty prices --instances")
        )

    def find(self, name: str) -> GPU | Instance:
        """An instance or GPU called `name`, for commands that accept either."""
        try:
            return self.instance(name)
        except UnknownNameError:
            pass
        try:
            return self.gpu(name)
        except UnknownNameError:
            names = list(self.instances) + [g.name for g in self.gpus.values()]
            raise UnknownNameError(
                _unknown("GPU or instance", name, names, "thrifty prices")
            ) from None


def _unknown(kind: str, name: str, names: list[str], listing: str) -> str:
    by_key = {n.casefold(): n for n in names}
    key = name.casefold()
    close = [k for k in by_key if key in k]
    close += [
        k for k in difflib.get_close_matches(key, list(by_key), n=3, cutoff=0.4) if k not in close
    ]
    suggestions = [by_key[k] for k in close][:4]
    hint = f"did you mean {', '.join(suggestions)}? " if suggestions else ""
    return f"unknown {kind} {name!r}: {hint}(see '{listing}')"


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    """The built-in catalog, extended or overridden by a user file.

    `path` (or, when it is None, the THRIFTY_CATALOG environment variable) names a TOML file with
    the layout of the built-in `catalog.toml`; its rows add to or replace built-in rows by name.
    """
    rows = dict(read_rows(str(BUILTIN_PATH)))
    files = [str(BUILTIN_PATH)]
    user = path if path is not None else os.environ.get(ENV_VAR) or None
    if user is not None:
        user_rows = read_rows(os.fspath(user))
        for kind in KINDS:
            rows[kind] = {**rows[kind], **user_rows[kind]}
        files.append(os.fspath(user))
    return _build(rows, files)


# --- building objects -------------------------------------------------------------------------


def _build(rows: dict[str, dict[str, Row]], files: list[str]) -> Catalog:
    gpus = {row.values["name"]: _gpu(row.values) for row in rows["gpu"].values()}
    storage = {row.values["name"]: _storage(row.values) for row in rows["storage"].values()}
    catalog = Catalog(gpus=gpus, instances={}, files=tuple(files), storage=storage)
    for row in rows["instance"].values():
        instance = _instance(row, catalog)
        catalog.instances[instance.name] = instance
    return catalog


def _storage(values: dict[str, Any]) -> StoragePrice:
    return StoragePrice(
        name=values["name"],
        provider=values["provider"],
        region=values["region"],
        storage_class=values["storage_class"],
        protocols=tuple(p.casefold() for p in values["protocols"]),
        usd_per_gib_month=float(values["usd_per_gib_month"]),
        price_source=values["price_source"],
        price_date=values["price_date"],
        tier_note=values.get("tier_note", ""),
        price_note=values.get("price_note", ""),
        uncertain=tuple(values.get("uncertain", ())),
    )


def _gpu(values: dict[str, Any]) -> GPU:
    return GPU(
        name=values["name"],
        aliases=tuple(values.get("aliases", ())),
        peak_tflops={k: float(v) for k, v in values["peak_tflops"].items()},
        peak_source=values["peak_source"],
        memory_gib=float(values["memory_gib"]),
        memory_bandwidth_gbs=float(values["memory_bandwidth_gbs"]),
        memory_source=values["memory_source"],
        interconnect=values["interconnect"],
        interconnect_gbs_per_direction=float(values["interconnect_gbs_per_direction"]),
        interconnect_note=values.get("interconnect_note", ""),
        bus_gbs=values.get("bus_gbs"),
        bus_source=values.get("bus_source", ""),
        nvlink_domain=values.get("nvlink_domain", 1),
        nvlink_domain_source=values.get("nvlink_domain_source", ""),
        uncertain=tuple(values.get("uncertain", ())),
        untraced=tuple(values.get("untraced", ())),
    )


def _instance(row: Row, catalog: Catalog) -> Instance:
    values, where, name = row.values, row.where, row.values["name"]
    try:
        gpu = catalog.gpu(values["gpu"])
    except UnknownNameError as exc:
        raise where.error(name, "gpu", f"names {exc}") from None
    count = values["gpu_count"]
    if ("on_demand" in values) == ("on_demand_per_gpu" in values):
        raise where.error(
            name, "on_demand", "needs exactly one of on_demand (per instance) or on_demand_per_gpu"
        )
    on_demand = values.get("on_demand") or values["on_demand_per_gpu"] * count
    _commitments(values, where)
    spot, spot_range, basis = _spot(values, where)
    return Instance(
        name=name,
        provider=values["provider"],
        region=values["region"],
        gpu=gpu,
        gpu_count=count,
        on_demand_per_hour=float(on_demand),
        spot_per_hour=spot,
        spot_range=spot_range,
        price_source=values["price_source"],
        price_date=values["price_date"],
        snapshot=values.get("snapshot", ""),
        spot_zones={zone: float(price) for zone, price in values.get("spot_zones", {}).items()},
        spot_basis=basis,
        price_note=values.get("price_note", ""),
        network_gbits=values.get("network_gbits"),
        network_source=values.get("network_source", ""),
        commit_1y_per_hour=_optional_float(values.get("commit_1y")),
        commit_3y_per_hour=_optional_float(values.get("commit_3y")),
        commit_source=values.get("commit_source", ""),
        commit_date=values.get("commit_date", ""),
        uncertain=tuple(values.get("uncertain", ())),
        untraced=tuple(values.get("untraced", ())),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _commitments(values: dict[str, Any], where: Where) -> None:
    """A committed price needs its source and date, and is below the on-demand price."""
    name = values["name"]
    given = [key for key in ("commit_1y", "commit_3y") if key in values]
    if not given:
        return
    for key in ("commit_source", "commit_date"):
        if key not in values:
            raise where.error(name, key, f"is missing: {given[0]} needs its source and date")
    on_demand = values.get("on_demand") or values["on_demand_per_gpu"] * values["gpu_count"]
    for key in given:
        if values[key] >= on_demand:
            raise where.error(
                name, key, f"({values[key]}) is not below the on-demand price ({on_demand})"
            )


_SpotTerms = tuple[float | None, tuple[float, float] | None, str]


def _spot(values: dict[str, Any], where: Where) -> _SpotTerms:
    """Typical spot price, the range across zones, and how the typical price was reached.

    The median across zones, not the midpoint of their range: one cheap outlying zone (p4d's
    2.47 beside 7.88-8.19) would pull a midpoint far from what most zones charge.
    """
    name = values["name"]
    zones = values.get("spot_zones")
    low, high = values.get("spot_low"), values.get("spot_high")
    if zones is not None and (low is not None or high is not None):
        raise where.error(
            name, "spot_zones", "and spot_low/spot_high both given; give the zones alone"
        )
    if zones is not None:
        prices = sorted(float(p) for p in zones.values())
        basis = f"median of {len(prices)} zone{'s' if len(prices) > 1 else ''}"
        typical = values.get("spot", round(statistics.median(prices), 6))
        return float(typical), (prices[0], prices[-1]), "quoted" if "spot" in values else basis
    if (low is None) != (high is None):
        raise where.error(
            name,
            "spot_low" if low is None else "spot_high",
            "is missing; give both spot_low and spot_high",
        )
    if low is not None and high is not None and low > high:
        raise where.error(name, "spot_low", f"({low}) is above spot_high ({high})")
    spot_range = (float(low), float(high)) if low is not None and high is not None else None
    if "spot" in values:
        return float(values["spot"]), spot_range, "quoted"
    if spot_range is not None:
        midpoint = round((spot_range[0] + spot_range[1]) / 2, 6)
        return midpoint, spot_range, "midpoint of the range (zones not listed)"
    return None, None, ""
