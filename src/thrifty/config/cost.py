"""`[cost]`: what the run costs per hour (thrifty.measure.cost meters it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from thrifty.config.checks import fail, is_number, is_text

PRICINGS = ("on-demand", "spot")


@dataclass(frozen=True, kw_only=True, slots=True)
class CostConfig:
    """What the run costs per hour: a catalog instance, or a price per GPU-hour.

    Neither set: no cost meter. `pricing` picks the instance's on-demand or spot price; with
    `usd_per_gpu_hour` it labels the price given, and `on_demand_usd_per_gpu_hour` may say what
    on-demand would cost for comparison. `catalog`: a user catalog file (same layout as the
    built-in one) with newer prices or more instances. `gpus`: GPUs billed; None means one per
    process of the job (its world size).
    """

    SECTION: ClassVar[str] = "cost"
    instance: str | None = None
    usd_per_gpu_hour: float | None = None
    gpus: int | None = None  # None: the world size
    pricing: Literal["on-demand", "spot"] = "on-demand"
    on_demand_usd_per_gpu_hour: float | None = None
    catalog: str | None = None

    def __post_init__(self) -> None:
        if self.instance is not None and self.usd_per_gpu_hour is not None:
            fail(
                "cost",
                "usd_per_gpu_hour",
                self.usd_per_gpu_hour,
                f"give cost.instance ({self.instance!r}) or cost.usd_per_gpu_hour, not both",
            )
        if self.instance is not None and not is_text(self.instance):
            fail("cost", "instance", self.instance, "must be an instance name from the catalog")
        for key in ("usd_per_gpu_hour", "on_demand_usd_per_gpu_hour"):
            value = getattr(self, key)
            if value is not None and not (is_number(value) and math.isfinite(value) and value > 0):
                fail("cost", key, value, "must be a price in USD per GPU-hour, greater than 0")
        if self.gpus is not None and not (
            isinstance(self.gpus, int) and not isinstance(self.gpus, bool) and self.gpus >= 1
        ):
            fail(
                "cost",
                "gpus",
                self.gpus,
                "must be a whole number of GPUs, 1 or more (unset: one per process)",
            )
        if self.pricing not in PRICINGS:
            fail("cost", "pricing", self.pricing, f"use {' or '.join(PRICINGS)}")
        if self.on_demand_usd_per_gpu_hour is not None and (
            self.usd_per_gpu_hour is None or self.pricing != "spot"
        ):
            fail(
                "cost",
                "on_demand_usd_per_gpu_hour",
                self.on_demand_usd_per_gpu_hour,
                "only compares with a spot price: set cost.usd_per_gpu_hour and "
                "cost.pricing = 'spot' (an instance's on-demand price comes from the catalog)",
            )
        if self.catalog is not None and not is_text(self.catalog):
            fail("cost", "catalog", self.catalog, "must be the path of a catalog TOML file")

    @property
    def enabled(self) -> bool:
        """True when a price is configured (the run gets a cost meter)."""
        return self.instance is not None or self.usd_per_gpu_hour is not None
