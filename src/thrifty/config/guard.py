"""`[guard]`: when a run has diverged, spiked or cannot reach its target (thrifty.measure.guard
acts on it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from thrifty.config.checks import fail, is_int, is_number


@dataclass(frozen=True, kw_only=True, slots=True)
class GuardConfig:
    """Stop wasting money on a run that diverged, spiked or cannot reach its target.

    - `max_skipped`: consecutive non-finite steps (NaN/inf loss or gradients) skipped before
      the run stops as diverged. 10: a lone overflow is common and harmless, ten in a row
      means the weights are gone. 0 stops at the first one.
    - `spike_sigma`: a loss more than this many standard deviations above the running mean of
      the last `spike_window` good losses is a spike candidate. 6: per-step noise almost never
      reaches it, a real blow-up (loss jumping by multiples) always does.
    - `spike_ratio`: instead of sigma, a loss above ratio × the running mean is a candidate
      (e.g. 1.5). Useful when the loss is so smooth that its standard deviation says little.
    - `spike_steps`: candidates in a row that confirm a spike. 3: one bad batch is a blip the
      optimizer shrugs off; three in a row means the model itself moved.
    - `spike_window`: good losses in the running statistics, and steps of warm-up before any
      decision. 50: enough for a stable standard deviation, short enough to follow the
      falling loss.
    - `max_rollbacks`: rollbacks per run before the run stops as diverged. 2: a spike that
      comes back twice after skipping its data will come back again. 0: the first confirmed
      spike stops the run.
    - `rollback_lr_factor`: multiplies the learning rate at each rollback, in (0, 1]. 1.0:
      skipping the data that caused a spike is usually enough, and the schedule stays the one
      chosen.
    - `forecast_min_evals`: evaluations before the first forecast (at least 4: the curve has
      three parameters). 5; a stop also needs three forecasts in a row, so it comes at the
      seventh evaluation at the earliest.
    - `forecast_confidence`: two-sided coverage of the forecast band. 0.99: the run stops only
      when even the band's optimistic edge misses the target.
    - `forecast_margin`: how far (fraction of the target) that optimistic edge must miss it.
      0.25: a power law in steps does not see the extra drop a decaying learning rate (cosine)
      gives late in a run, and forecasts made early under one were seen to miss the end by
      more than their band; with a constant learning rate 0.05 is enough.
    """

    SECTION: ClassVar[str] = "guard"
    enabled: bool = True  # false: no skipping, no spike detection, no forecast
    max_skipped: int = 10
    spike_sigma: float = 6.0
    spike_ratio: float | None = None
    spike_steps: int = 3
    spike_window: int = 50
    max_rollbacks: int = 2
    rollback_lr_factor: float = 1.0
    forecast_min_evals: int = 5
    forecast_confidence: float = 0.99
    forecast_margin: float = 0.25

    def __post_init__(self) -> None:
        self._check_counts()
        if not (is_number(self.spike_sigma) and self.spike_sigma >= 2):
            fail("guard", "spike_sigma", self.spike_sigma, "must be a number, 2 or more (e.g. 6)")
        if self.spike_ratio is not None and not (
            is_number(self.spike_ratio) and self.spike_ratio > 1
        ):
            fail(
                "guard",
                "spike_ratio",
                self.spike_ratio,
                "must be greater than 1 (e.g. 1.5: a loss 50% above its running mean)",
            )
        if not (is_number(self.rollback_lr_factor) and 0 < self.rollback_lr_factor <= 1):
            fail(
                "guard",
                "rollback_lr_factor",
                self.rollback_lr_factor,
                "must be in (0, 1]: 1 keeps the learning rate, 0.5 halves it",
            )
        if not (is_number(self.forecast_confidence) and 0.5 <= self.forecast_confidence < 1):
            fail(
                "guard",
                "forecast_confidence",
                self.forecast_confidence,
                "must be in [0.5, 1), e.g. 0.99",
            )
        if not (is_number(self.forecast_margin) and 0 <= self.forecast_margin < 1):
            fail("guard", "forecast_margin", self.forecast_margin, "must be in [0, 1), e.g. 0.05")

    def _check_counts(self) -> None:
        minimums = {
            "max_skipped": (0, ""),
            "spike_steps": (1, ""),
            "spike_window": (10, ": fewer good losses give too noisy a standard deviation"),
            "max_rollbacks": (0, ""),
            "forecast_min_evals": (4, ": the forecast curve has three parameters"),
        }
        for key, (least, why) in minimums.items():
            value = getattr(self, key)
            if not (is_int(value) and value >= least):
                fail("guard", key, value, f"must be a whole number, {least} or more{why}")
