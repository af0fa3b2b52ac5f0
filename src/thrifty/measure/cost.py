"""The cost meter: dollars spent so far, dollars per million tokens, projected dollars to finish.

The price comes from a catalog instance (`cost.instance = "p5.48xlarge"`, on-demand or spot) or
from a price per GPU-hour (`cost.usd_per_gpu_hour = 2.5`, `cost.gpus = 8`). The on-demand rate
is kept beside the one paid, so a spot run's summary can say what it would have cost
on-demand.

Billing follows the price's unit: a catalog instance bills whole instances (a job using 1 GPU of
an 8-GPU instance pays for 8; 16 GPUs of 8-GPU instances take 2), a per-GPU price bills `gpus`,
which defaults to the job's world size (64 processes are 64 GPUs, not one).

What a run is billed for: the wall time of every attempt, from the start of `fit()` (opening
the run directory, loading the checkpoint, the first evaluation) to its end (the last
evaluation, the final checkpoint and its upload), at the price for the whole job (every GPU).
The meter keeps it in three parts, so that each attempt and each machine can add its own:

- `elapsed_seconds`: the training clock kept in the run (the checkpoint carries it across
  restarts and machines): the steps, and the evaluations and saves between them;
- `wasted_seconds`: training a preemption threw away (done again since): when a run resumes
  at step S after an attempt had reached step R > S, the seconds spent on steps S+1..R;
  `lost_work_before_resume` (thrifty.measure.resume_loss) reads them from metrics.jsonl
  before the resume truncates it;
- `overhead_seconds`: each attempt's wall time outside the training clock: set-up before the
  first step and everything after the last (the meter measures it from when it is built, and
  the summary from the attempt's own wall time), earlier attempts' carried by `LostWork`.

Their sum is `billed_seconds`; the summary reports it (`seconds`), and `wasted_usd` and
`redone_steps` apart. Every cost snapshot written to metrics.jsonl and every checkpoint's
cost record carry the three parts, which is what `thrifty runs` adds up.

Units: seconds, US dollars, dollars per hour for the whole job.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from thrifty.config.checks import fail, is_number
from thrifty.config.cost import PRICINGS, CostConfig
from thrifty.errors import ConfigError
from thrifty.measure.resume_loss import LostWork

# Lent to the modules that import them from here (a run's opening).
from thrifty.measure.resume_loss import finished_cost as finished_cost
from thrifty.measure.resume_loss import lost_work as lost_work

if TYPE_CHECKING:
    from thrifty.plan.catalog import Catalog


@dataclass(frozen=True, slots=True)
class CostSnapshot:
    """Spend so far. Rates are None until there is something to divide by.

    `elapsed_seconds`: training seconds kept in the run; `usd` also counts `wasted_usd`, the
    work preemptions threw away (done again since), and `overhead_seconds`, every attempt's
    wall time outside the training clock (set-up, the evaluations and saves around the steps).
    """

    elapsed_seconds: float
    usd: float
    usd_per_million_tokens: float | None
    usd_per_thousand_samples: float | None
    wasted_usd: float = 0.0
    overhead_seconds: float = 0.0

    def describe(self) -> str:
        """For a progress bar: "$12.34 · $0.56/M tokens" (or "/k samples" with no tokens)."""
        text = f"${self.usd:,.2f}"
        if self.usd_per_million_tokens is not None:
            return f"{text} · ${self.usd_per_million_tokens:,.3g}/M tokens"
        if self.usd_per_thousand_samples is not None:
            return f"{text} · ${self.usd_per_thousand_samples:,.3g}/k samples"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CostProjection:
    """Time and dollars still to go to finish the budget, and the totals at the end."""

    remaining_seconds: float
    remaining_usd: float
    total_seconds: float
    total_usd: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CostSummary:
    """What the run cost: GPU-hours billed, dollars paid, and the on-demand equivalent.

    `seconds` are all the seconds billed (the wall time of every attempt), `wasted_seconds`
    of them (`wasted_usd`) on the `redone_steps` steps a preemption threw away and
    `overhead_seconds` outside the training clock (set-up, and what follows the last step).
    """

    seconds: float
    gpus: int
    gpu_hours: float
    usd: float
    pricing: str
    usd_per_hour: float
    on_demand_usd: float | None  # None when the on-demand price is unknown
    source: str
    usd_per_million_tokens: float | None
    usd_per_thousand_samples: float | None
    wasted_seconds: float = 0.0
    wasted_usd: float = 0.0
    redone_steps: int = 0
    overhead_seconds: float = 0.0

    def describe(self) -> str:
        text = f"{self.gpu_hours:,.2f} GPU-hours, ${self.usd:,.2f} ({self.pricing})"
        if self.pricing != "on-demand" and self.on_demand_usd is not None:
            saved = 1 - self.usd / self.on_demand_usd if self.on_demand_usd else 0.0
            text += f"; on-demand would have cost ${self.on_demand_usd:,.2f} ({saved:.0%} saved)"
        if self.redone_steps or self.wasted_seconds:
            text += (
                f"; ${self.wasted_usd:,.2f} of it paid for {self.redone_steps} steps "
                "a preemption threw away"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CostMeter:
    """Dollars spent as the run goes, from a price per hour for the whole job.

    `usd_per_hour`: what the job pays per hour at `pricing`; `on_demand_usd_per_hour`: the
    on-demand rate for comparison (None when unknown); `gpus`: GPUs billed, for GPU-hours.
    Build one with `from_config`, `from_instance` or `from_price`.
    """

    def __init__(
        self,
        *,
        usd_per_hour: float,
        gpus: int,
        pricing: str = "on-demand",
        on_demand_usd_per_hour: float | None = None,
        source: str = "given",
    ) -> None:
        if not (is_number(usd_per_hour) and usd_per_hour > 0):
            raise ConfigError(
                f"cost: price {usd_per_hour!r} USD/hour is invalid: must be greater than 0"
            )
        if not (isinstance(gpus, int) and gpus >= 1):
            fail("cost", "gpus", gpus, "must be a whole number of GPUs, 1 or more")
        if pricing not in PRICINGS:
            fail("cost", "pricing", pricing, f"use {' or '.join(PRICINGS)}")
        if pricing == "on-demand" and on_demand_usd_per_hour is None:
            on_demand_usd_per_hour = usd_per_hour
        self.usd_per_hour = float(usd_per_hour)
        self.on_demand_usd_per_hour = on_demand_usd_per_hour
        self.gpus = gpus
        self.pricing = pricing
        self.source = source
        self.elapsed_seconds = 0.0
        self.tokens = 0
        self.samples = 0
        self.wasted_seconds = 0.0  # billed on work a preemption threw away
        self.redone_steps = 0
        self.overhead_before = 0.0  # earlier attempts' wall time outside the training clock
        self.overhead_now = 0.0  # this attempt's, as of the last update (or its end)
        self._attempt: tuple[float, float] | None = None  # (perf_counter, clock) at its start

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def from_config(
        cls, config: CostConfig, catalog: Catalog | None = None, *, world_size: int = 1
    ) -> CostMeter:
        """The meter `config` describes for a job of `world_size` processes (one GPU each, the
        GPUs billed unless `cost.gpus` says otherwise); `catalog` overrides `config.catalog`."""
        gpus = config.gpus if config.gpus is not None else world_size
        if config.instance is not None:
            if catalog is None and config.catalog is not None:
                from thrifty.plan.catalog import load_catalog

                catalog = load_catalog(config.catalog)
            return cls.from_instance(
                config.instance, pricing=config.pricing, gpus=gpus, catalog=catalog
            )
        if config.usd_per_gpu_hour is None:
            raise ConfigError(
                "cost has no price: set cost.instance (a catalog name) or cost.usd_per_gpu_hour"
            )
        on_demand = config.on_demand_usd_per_gpu_hour
        return cls(
            usd_per_hour=config.usd_per_gpu_hour * gpus,
            gpus=gpus,
            pricing=config.pricing,
            on_demand_usd_per_hour=None if on_demand is None else on_demand * gpus,
            source=f"given: ${config.usd_per_gpu_hour:g}/GPU-hour × {gpus} GPU(s)",
        )

    @classmethod
    def from_price(
        cls,
        usd_per_gpu_hour: float,
        *,
        gpus: int = 1,
        pricing: Literal["on-demand", "spot"] = "on-demand",
        on_demand_usd_per_gpu_hour: float | None = None,
    ) -> CostMeter:
        """A meter for `gpus` GPUs at `usd_per_gpu_hour` each (validated like `cost.*`)."""
        return cls.from_config(
            CostConfig(
                usd_per_gpu_hour=usd_per_gpu_hour,
                gpus=gpus,
                pricing=pricing,
                on_demand_usd_per_gpu_hour=on_demand_usd_per_gpu_hour,
            )
        )

    @classmethod
    def from_instance(
        cls,
        name: str,
        *,
        pricing: Literal["on-demand", "spot"] = "on-demand",
        gpus: int = 1,
        catalog: Catalog | None = None,
    ) -> CostMeter:
        """A meter for whole catalog instances: enough of `name` to hold `gpus` GPUs.

        An unknown name raises a one-line error suggesting the closest catalog names.
        """
        from thrifty.plan.catalog import UnknownNameError, load_catalog

        CostConfig(instance=name, gpus=gpus, pricing=pricing)  # validates the arguments
        catalog = catalog or load_catalog()
        try:
            instance = catalog.instance(name)
        except UnknownNameError as exc:
            raise ConfigError(f"cost.instance = {name!r} is invalid: {exc}") from None
        count = math.ceil(gpus / instance.gpu_count)
        try:
            rate = instance.price_per_hour(pricing)
        except ConfigError as exc:
            raise ConfigError(f"cost.pricing = {pricing!r} is invalid: {exc}") from None
        plural = f"{count} × " if count > 1 else ""
        return cls(
            usd_per_hour=rate * count,
            gpus=count * instance.gpu_count,
            pricing=pricing,
            on_demand_usd_per_hour=instance.on_demand_per_hour * count,
            source=f"{plural}{instance.name} {pricing} ${rate:g}/hour ({instance.dated_source})",
        )

    # --- metering ----------------------------------------------------------------------------

    def add_wasted(self, lost: LostWork) -> None:
        """Bill what earlier attempts paid that the checkpoint's clock does not hold: the work
        preemptions threw away (`lost.seconds` paid, `lost.steps` redone) and their wall time
        outside the training clock; and start this attempt's wall clock, at the training
        clock the checkpoint holds (`lost.resumed_seconds`)."""
        if min(lost.seconds, lost.steps, lost.overhead_seconds, lost.resumed_seconds) < 0:
            raise ValueError(f"CostMeter.add_wasted needs values >= 0, got {lost}")
        self.wasted_seconds += lost.seconds
        self.redone_steps += lost.steps
        self.overhead_before += lost.overhead_seconds
        self._attempt = (time.perf_counter(), lost.resumed_seconds)

    def begin(self, started: float) -> None:
        """Bill this attempt from `started` (a `time.perf_counter()` reading: the start of
        `fit()`, before the run directory is opened and the checkpoint loaded)."""
        resumed = self._attempt[1] if self._attempt is not None else 0.0
        self._attempt = (min(started, time.perf_counter()), resumed)

    def _outside_clock(self, wall_seconds: float) -> float:
        """This attempt's seconds outside the training clock, after `wall_seconds` of it."""
        if self._attempt is None:
            return 0.0
        return max(0.0, wall_seconds - (self.elapsed_seconds - self._attempt[1]))

    def update(self, elapsed_seconds: float, tokens: int = 0, samples: int = 0) -> CostSnapshot:
        """Record the run's totals so far (wall seconds paid for, tokens, samples) and return
        the spend: dollars, dollars per million tokens and per thousand samples."""
        if elapsed_seconds < 0 or tokens < 0 or samples < 0:
            raise ValueError(
                f"CostMeter.update needs totals >= 0, got {elapsed_seconds} s, {tokens} tokens, "
                f"{samples} samples"
            )
        self.elapsed_seconds, self.tokens, self.samples = float(elapsed_seconds), tokens, samples
        if self._attempt is not None:
            self.overhead_now = self._outside_clock(time.perf_counter() - self._attempt[0])
        return self.snapshot()

    def snapshot(self) -> CostSnapshot:
        usd = self.usd
        return CostSnapshot(
            elapsed_seconds=self.elapsed_seconds,
            usd=usd,
            usd_per_million_tokens=usd / self.tokens * 1e6 if self.tokens else None,
            usd_per_thousand_samples=usd / self.samples * 1e3 if self.samples else None,
            wasted_usd=self.wasted_usd,
            overhead_seconds=self.overhead_seconds,
        )

    @property
    def overhead_seconds(self) -> float:
        """Every attempt's wall time outside the training clock, so far."""
        return self.overhead_before + self.overhead_now

    @property
    def billed_seconds(self) -> float:
        """Seconds paid for: training kept in the run, work thrown away, and every attempt's
        wall time outside the training clock (set-up, what follows the last step)."""
        return self.elapsed_seconds + self.wasted_seconds + self.overhead_seconds

    @property
    def usd(self) -> float:
        """Dollars spent so far, thrown-away work included."""
        return self.usd_per_hour * self.billed_seconds / 3600

    @property
    def wasted_usd(self) -> float:
        """Dollars spent on work a preemption threw away."""
        return self.usd_per_hour * self.wasted_seconds / 3600

    def project(
        self, fraction_done: float | None = None, *, remaining_seconds: float | None = None
    ) -> CostProjection:
        """Seconds and dollars to finish, from the fraction of the budget done so far (the pace
        so far continues) or from the seconds still to go."""
        if (fraction_done is None) == (remaining_seconds is None):
            raise ValueError("CostMeter.project needs fraction_done or remaining_seconds, not both")
        if fraction_done is not None:
            if not 0 < fraction_done <= 1:
                raise ValueError(f"fraction_done = {fraction_done!r}: must be in (0, 1]")
            remaining_seconds = self.elapsed_seconds * (1 - fraction_done) / fraction_done
        assert remaining_seconds is not None
        if remaining_seconds < 0:
            raise ValueError(f"remaining_seconds = {remaining_seconds!r}: must be 0 or greater")
        remaining_usd = self.usd_per_hour * remaining_seconds / 3600
        return CostProjection(
            remaining_seconds=remaining_seconds,
            remaining_usd=remaining_usd,
            total_seconds=self.elapsed_seconds + remaining_seconds,
            total_usd=self.usd + remaining_usd,
        )

    def record(self, elapsed_seconds: float) -> dict[str, Any]:
        """What the run had paid after `elapsed_seconds` of training kept (a checkpoint's), in
        plain values: the record a checkpoint's manifest carries for `thrifty runs`."""
        return {
            "seconds": float(elapsed_seconds),
            "wasted_seconds": self.wasted_seconds,
            "redone_steps": self.redone_steps,
            "overhead_seconds": self.overhead_seconds,
            "usd_per_hour": self.usd_per_hour,
            "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
            "pricing": self.pricing,
            "source": self.source,
            "gpus": self.gpus,
        }

    def summary(self, wall_seconds: float | None = None) -> CostSummary:
        """GPU-hours billed, dollars paid and what on-demand would have cost; `wall_seconds`:
        this attempt's wall time to its end (from the start of `fit()`), billed whole."""
        if wall_seconds is not None and self._attempt is not None:
            self.overhead_now = self._outside_clock(wall_seconds)
        hours = self.billed_seconds / 3600
        snap = self.snapshot()
        return CostSummary(
            seconds=self.billed_seconds,
            gpus=self.gpus,
            gpu_hours=self.gpus * hours,
            usd=snap.usd,
            pricing=self.pricing,
            usd_per_hour=self.usd_per_hour,
            on_demand_usd=(
                None if self.on_demand_usd_per_hour is None else self.on_demand_usd_per_hour * hours
            ),
            source=self.source,
            usd_per_million_tokens=snap.usd_per_million_tokens,
            usd_per_thousand_samples=snap.usd_per_thousand_samples,
            wasted_seconds=self.wasted_seconds,
            wasted_usd=self.wasted_usd,
            redone_steps=self.redone_steps,
            overhead_seconds=self.overhead_seconds,
        )
