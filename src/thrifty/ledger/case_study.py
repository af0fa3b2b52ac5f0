"""The seeds' case study, laid out from the team's own runs.

The article's table is runs a year x hours per run x price per hour, then each lever's share
of the saving: spot, the hours levers (precision, a larger micro-batch, compile), early
stopping. The same table here comes from the runs given:

- runs a year: the runs counted, over the months they span (at least one), times 12;
- hours per run: the hours a run would take to its budget (hours kept, plus the hours a stop
  before the budget did not spend), at the pace before any tuned lever;
- price per hour: the on-demand rate of the runs' own prices, and the rate they paid;
- the hours levers: the speed-ups a tune measured (paired) for the config a run ran,
  weighted by hours over every run (a run no tune measured counts as 1x);
- early stopping: the runs stopped before their budget, at the share of it they ran.

Each lever says what it rests on: quoted prices on the runs' own hours, a tune's paired
measurement, or an estimate (the steps a stop did not run, at the measured step time). The
work preemptions threw away is added apart: the article has no such line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from thrifty.ledger.jobs import Job
from thrifty.plan.levers import LeverInputs, LeverPlan, LeverStep, apply_levers

DAYS_A_MONTH = 365.25 / 12
# The tune's lever names (thrifty.search.tune.waterfall) the planner has its own inputs for.
_PLANNER_LEVERS = {
    "precision": "precision_speedup",
    "larger micro-batch": "microbatch_speedup",
    "torch.compile": "compile_speedup",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseStudy:
    """The runs laid out per year: the inputs, the lever plan, and what each lever rests on
    (`basis`, by lever); `actual_usd` and `wasted_usd` are what the runs paid, per year."""

    runs: int
    months: float
    runs_per_year: float
    hours_per_run: float
    on_demand_per_hour: float
    paid_per_hour: float
    plan: LeverPlan
    basis: dict[str, str]
    actual_usd: float
    wasted_usd: float
    notes: list[str] = field(default_factory=list)

    def shares(self) -> dict[str, float]:
        """Each lever's saving as a share of the whole saving."""
        saving = self.plan.saving or 1.0
        return {s.lever: s.saving / saving for s in self.plan.steps}

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "months": self.months,
            "runs_per_year": self.runs_per_year,
            "hours_per_run": self.hours_per_run,
            "on_demand_per_hour": self.on_demand_per_hour,
            "paid_per_hour": self.paid_per_hour,
            "levers": self.plan.as_dict(),
            "basis": self.basis,
            "shares": self.shares(),
            "actual_usd_per_year": self.actual_usd,
            "wasted_usd_per_year": self.wasted_usd,
            "notes": self.notes,
        }


def case_study(jobs: Sequence[Job]) -> CaseStudy | None:
    """The table of the priced runs among `jobs`; None when none has a price."""
    priced = [j for j in jobs if j.usd is not None and j.seconds > 0]
    if not priced:
        return None
    span = (max(j.ended for j in priced) - min(j.started for j in priced)).days
    months = max(1.0, span / DAYS_A_MONTH)
    per_year = 12 / months
    kept_hours = sum(j.seconds - j.wasted_seconds for j in priced) / 3600
    saved_hours = sum(j.saved.seconds for j in priced if j.saved is not None) / 3600
    paid = sum(j.usd or 0.0 for j in priced)
    on_demand = sum(j.on_demand_usd or j.usd or 0.0 for j in priced)
    hours = sum(j.seconds for j in priced) / 3600
    speedups, measured = _speedups(priced)
    pace = 1.0
    for ratio in speedups.values():
        pace *= ratio
    stopped = [j for j in priced if j.saved is not None]
    inputs = LeverInputs(
        hours_per_run=(kept_hours + saved_hours) * pace / len(priced),
        on_demand_per_hour=on_demand / hours,
        runs=len(priced) * per_year,
        spot_per_hour=paid / hours if paid < on_demand else None,
        early_stopped_runs=len(stopped) * per_year,
        early_stop_fraction=_fraction_run(stopped),
        period="year",
        **{_PLANNER_LEVERS[n]: r for n, r in speedups.items() if n in _PLANNER_LEVERS},
    )
    plan = _with_other_levers(apply_levers(inputs), speedups)
    return CaseStudy(
        runs=len(priced),
        months=months,
        runs_per_year=len(priced) * per_year,
        hours_per_run=inputs.hours_per_run,
        on_demand_per_hour=inputs.on_demand_per_hour,
        paid_per_hour=paid / hours,
        plan=plan,
        basis=_basis(plan, measured, len(priced), len(stopped)),
        actual_usd=paid * per_year,
        wasted_usd=sum(j.wasted_usd or 0.0 for j in priced) * per_year,
        notes=_notes(span, months, measured, len(priced)),
    )


def _speedups(jobs: Sequence[Job]) -> tuple[dict[str, float], int]:
    """Each measured lever's speed-up over all `jobs`, weighted by hours (1x where no tune
    measured it), and how many jobs had a measurement."""
    hours = sum(j.seconds for j in jobs) or 1.0
    measured = [j for j in jobs if j.levers]
    names = [n for j in measured for n in j.levers]
    ratios = [_ratios(job) for job in jobs]
    speedups = {
        name: sum(job.seconds * r.get(name, 1.0) for job, r in zip(jobs, ratios, strict=True))
        / hours
        for name in dict.fromkeys(names)
    }
    return speedups, len(measured)


def _ratios(job: Job) -> dict[str, float]:
    """The speed-up of each lever a job's dollars were saved by, undone in reverse order
    (each lever's saving is against the cost after the levers before it)."""
    ratios, after = {}, job.usd or 0.0
    for name, saved in reversed(list(job.levers.items())):
        before = after + saved
        ratios[name] = before / after if after else 1.0
        after = before
    return ratios


def _fraction_run(stopped: Sequence[Job]) -> float:
    """The mean share of its budget a run stopped early ran (0.6: the article's)."""
    if not stopped:
        return 0.6
    shares = []
    for job in stopped:
        left = job.saved.steps_not_run if job.saved is not None else 0
        shares.append(job.steps / (job.steps + left) if job.steps + left else 1.0)
    return sum(shares) / len(shares)


def _with_other_levers(plan: LeverPlan, speedups: dict[str, float]) -> LeverPlan:
    """Levers the planner has no input for (data loading) multiply in at the end, as the
    tune's own waterfall does."""
    steps = list(plan.steps)
    for name, ratio in speedups.items():
        if name in _PLANNER_LEVERS:
            continue
        before = steps[-1].after if steps else plan.baseline
        steps.append(
            LeverStep(name, "hours per run", f"{ratio:.3g}x (measured)", before, before / ratio)
        )
    return LeverPlan(
        period=plan.period, baseline=plan.baseline, steps=steps, assumptions=plan.assumptions
    )


def _basis(plan: LeverPlan, measured: int, runs: int, stopped: int) -> dict[str, str]:
    basis = {}
    for step in plan.steps:
        if step.lever == "spot instances":
            basis[step.lever] = "quoted prices on the runs' own hours"
        elif step.lever == "early stopping":
            basis[step.lever] = (
                f"estimate: {stopped} run(s) stopped early, the steps not run at the measured step time"
            )
        else:
            basis[step.lever] = (
                f"measured: a tune's paired speed-up, on {measured} of {runs} run(s)"
            )
    return basis


def _notes(span: int, months: float, measured: int, runs: int) -> list[str]:
    notes = [f"per year: {runs} run(s) over {months:.1f} month(s) (they span {span} day(s)) x 12"]
    if span < DAYS_A_MONTH:
        notes.append("the runs span less than a month: counted as one month")
    if measured == 0:
        notes.append(
            "no run ran a tune's winner: the hours levers have no measured baseline and are "
            "left out (thrifty tune measures them)"
        )
    return notes
