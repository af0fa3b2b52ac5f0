"""The waterfall from the baseline (the config as given) to the winner, lever by lever: the
seeds' case study for the user's own job, measured.

Each lever's speed-up is measured: the paired comparison that kept it (its candidate against
the incumbent in alternating runs, `thrifty.search.tune.compare`), with its 90% interval; a
lever no comparison kept is not in it, and none is when the winner's re-measurement against
the config as given reverted to it. The planner's `apply_levers` turns them into cost (cost = hours x price, so
the levers multiply), with the spot lever from `thrifty.plan.spot` for the job's catalog
instance. Without a price the waterfall is in hours. When the job's length is not known
(no run.max_steps or run.max_tokens), it is per million tokens (per thousand samples).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from thrifty.plan.levers import LeverInputs, LeverPlan, LeverStep, apply_levers
from thrifty.plan.spot import SpotPlan
from thrifty.search.tune.compare import Comparison
from thrifty.search.tune.pricing import Job, Price, spot_plan
from thrifty.search.tune.search import Outcome, lever_of
from thrifty.search.tune.trials import Trial

# The planner's name for each lever (`lever_of` a stage).
LEVER_NAMES = {
    "precision": "precision",
    "micro": "larger micro-batch",
    "compile": "torch.compile",
    "workers": "data loading",
}
PER_UNIT = {"tokens": (1e6, "million tokens"), "samples": (1e3, "thousand samples")}


@dataclass(frozen=True, slots=True)
class Waterfall:
    """The levers in sequence; figures in `unit` ("USD" or "hours") per `plan.period`.
    `measured` holds each measured lever's paired speed-up by the planner's name for it
    (ratio, low, high, rounds, confidence, and the comparison's name)."""

    plan: LeverPlan
    unit: str
    spot: SpotPlan | None
    measured: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "unit": self.unit,
            **self.plan.as_dict(),
            "spot": self.spot.as_dict() if self.spot else None,
        }
        for step in data["steps"]:
            step["measured"] = self.measured.get(step["lever"])
        return data


def waterfall(
    outcome: Outcome, job: Job, price: Price, interruption_rate: float | str
) -> Waterfall | None:
    """The waterfall of `outcome`, None when the baseline did not finish."""
    base = outcome.baseline
    if base is None or not base.ok or outcome.winner is None:
        return None
    unit = outcome.unit
    speedups, details, measured = _measured(outcome.levers, unit)
    hours, period = _hours(base, job, unit)
    rate_per_hour = 1.0
    notes = []
    spot = None
    if price.priced:
        rate_per_hour = price.on_demand_usd_per_hour or price.usd_per_hour or 1.0
        spot, note = spot_plan(price, hours, interruption_rate)
        notes.append(note)
        if price.on_demand_usd_per_hour is None:
            notes.append(f"on-demand price unknown: the baseline is at the {price.pricing} price")
    else:
        notes.append("no price: figures are hours; give [cost] or --instance for dollars")
    planned = apply_levers(
        LeverInputs(
            hours_per_run=hours,
            on_demand_per_hour=rate_per_hour,
            spot_per_hour=spot.spot_per_hour if spot else None,
            spot_overhead=spot.overhead_factor if spot else 1.0,
            precision_speedup=speedups.get("precision", 1.0),
            microbatch_speedup=speedups.get("micro", 1.0),
            compile_speedup=speedups.get("compile", 1.0),
            period=period,
        )
    )
    steps = [_with_detail(s, details) for s in planned.steps]
    if "workers" in speedups:
        # The planner has no data-loading lever: it multiplies in like the others.
        before = steps[-1].after if steps else planned.baseline
        after = before / speedups["workers"]
        name = LEVER_NAMES["workers"]
        steps.append(LeverStep(name, "hours per run", details[name], before, after))
    notes.insert(0, _baseline_note(base, unit, hours, period, price))
    plan = LeverPlan(period=period, baseline=planned.baseline, steps=steps, assumptions=notes)
    return Waterfall(plan, "USD" if price.priced else "hours", spot, measured)


def _measured(
    levers: list[Comparison], unit: str
) -> tuple[dict[str, float], dict[str, str], dict[str, dict[str, Any]]]:
    """Each kept lever's paired speed-up by stage, what it changed (by the planner's name),
    and its figures."""
    speedups: dict[str, float] = {}
    details: dict[str, str] = {}
    figures: dict[str, dict[str, Any]] = {}
    for c in levers:
        est = c.estimate
        if est is None:  # a kept comparison always has one
            continue
        lever = lever_of(c.stage)
        name = LEVER_NAMES[lever]
        speedups[lever] = speedups.get(lever, 1.0) * est.ratio
        detail = (
            f"{change(c.incumbent, c.candidate)}: {est.describe()} {unit}/s "
            f"(paired, {est.rounds} rounds)"
        )
        # A precision kept twice (fp32 -> bf16, then bf16 -> fp8): both details, the ratios'
        # product, the figures of the last.
        details[name] = f"{details[name]}; {detail}" if name in details else detail
        figures[name] = {**est.to_dict(), "comparison": c.name}
    return speedups, details, figures


def change(before: Trial, after: Trial) -> str:
    """What a stage changed, in the values the runs used: "fp32 -> bf16"."""
    a, b = before.resolved, after.resolved
    if after.stage == "workers":
        return f"num_workers {a.num_workers} -> {b.num_workers}"
    if lever_of(after.stage) == "precision":
        return f"{a.precision} -> {b.precision}"
    if after.stage == "compile":
        return f"compile {a.compile} -> {b.compile}"
    text = (
        f"micro-batch {a.micro} x {before.accumulation_steps} -> "
        f"{b.micro} x {after.accumulation_steps}"
    )
    if a.checkpointing != b.checkpointing:
        text += f", checkpointing {a.checkpointing} -> {b.checkpointing}"
    return text


def _hours(base: Trial, job: Job, unit: str) -> tuple[float, str]:
    """Hours of the job at the baseline's pace, or of a million tokens when its length is
    unknown; and the period the figures are per."""
    seconds = job.seconds(base)
    if seconds is not None:
        return seconds / 3600, "run"
    count, name = PER_UNIT[unit]
    return count / (base.rate(unit) or 1.0) / 3600, name


def _with_detail(step: LeverStep, details: dict[str, str]) -> LeverStep:
    detail = details.get(step.lever)
    return dataclasses.replace(step, detail=detail) if detail else step


def _baseline_note(base: Trial, unit: str, hours: float, period: str, price: Price) -> str:
    rate = base.rate(unit) or 0.0
    where = (
        f"at ${price.on_demand_usd_per_hour or price.usd_per_hour:,.2f}/h" if price.priced else ""
    )
    return (
        f"baseline: the config as given, {rate:,.0f} {unit}/s measured: {hours:,.3g} h per "
        f"{period} {where}".rstrip()
    )
