"""The ledger printed: one row a job, totals at the bottom, groups, the case study, storage.

Dollars have three significant figures below $10 (a short run costs fractions of a cent);
"-" is a figure that is not known (a run with no [cost], a location not read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from thrifty.console import Table, dash
from thrifty.ledger.book import Ledger
from thrifty.ledger.case_study import CaseStudy
from thrifty.ledger.groups import Total, total
from thrifty.ledger.jobs import Job
from thrifty.plan.levers import LeverPlan
from thrifty.plan.units import fmt_dollars, fmt_pct
from thrifty.plan.units import fmt_usd as _small_usd

if TYPE_CHECKING:
    from rich.table import Table as RichTable

COLUMNS = (
    "run", "start", "state", "steps", "wall", "GPU-h", "paid", "USD", "thrown away", "saved",
    "levers", "kept", "$/month",
)  # fmt: skip
_RIGHT = {"steps", "wall", "GPU-h", "USD", "thrown away", "saved", "levers", "kept", "$/month"}
WIDTH = 160  # the table's width off a terminal (a pipe, a file)


def fmt_usd(usd: float | None) -> str:
    """Three significant figures below $10, whole dollars from $1,000."""
    return _small_usd(usd) if usd is None or abs(usd) < 10 else fmt_dollars(usd)


def fmt_bytes(size: int | None) -> str:
    """Bytes in decimal units (what a listing shows): 1.2 GB."""
    if size is None:
        return "-"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"


def fmt_seconds(seconds: float) -> str:
    """Hours, minutes or seconds, whichever the figure is at least one of."""
    size, unit = next(((s, u) for s, u in ((3600, "h"), (60, "min")) if seconds >= s), (1, "s"))
    return f"{seconds / size:.1f} {unit}"


def state_text(job: Job) -> str:
    """finished, stopped and why, preempted and resumable (from which step), running."""
    if job.state == "stopped":
        return f"stopped: {job.reason}"
    if job.state == "preempted":
        newest = max(job.checkpoints, default=None)
        return "preempted, resumable" if newest is None else f"preempted, resumes at {newest}"
    if job.machines > 1:
        return f"{job.state} ({job.machines} machines)"
    return job.state


def display_name(job: Job, names: Sequence[str]) -> str:
    """The run's name; a sweep's trial by its sweep and folder; a name two rows share with
    its folder beside it."""
    if job.sweep:
        return f"{job.sweep.split(' ', 1)[-1]}/{job.last.path.name}"
    if names.count(job.name) > 1:
        return f"{job.name} ({job.last.path.name})"
    return job.name


def _row(job: Job, names: Sequence[str]) -> list[str]:
    wasted = job.wasted_usd
    return [
        dash(display_name(job, names)),
        job.started.strftime("%Y-%m-%d"),
        state_text(job),
        f"{job.steps:,}",
        fmt_seconds(job.seconds),
        f"{job.gpu_hours:.3g}",
        job.pricing,
        fmt_usd(job.usd),
        fmt_usd(wasted) if wasted else "-",
        fmt_usd(job.saved.usd) if job.saved is not None else "-",
        fmt_usd(sum(job.levers.values())) if job.levers else "-",
        fmt_bytes(job.bytes),
        fmt_usd(job.storage_usd_month) if job.storage_usd_month is not None else "-",
    ]


def _total_row(t: Total) -> list[str]:
    return [
        t.label,
        "",
        f"{t.runs} run(s)" + (f", {t.unpriced} unpriced" if t.unpriced else ""),
        "",
        fmt_seconds(t.seconds),
        f"{t.gpu_hours:.3g}",
        "",
        fmt_usd(t.usd),
        fmt_usd(t.wasted_usd) if t.wasted_usd else "-",
        fmt_usd(t.saved_usd) if t.saved_usd else "-",
        fmt_usd(t.levers_usd) if t.levers_usd else "-",
        fmt_bytes(t.storage_bytes),
        fmt_usd(t.storage_usd_month) if t.storage_usd_month else "-",
    ]


def runs_table(jobs: Sequence[Job], groups: Sequence[Total] = ()) -> RichTable:
    """One row a job (sweeps' trials together), then each group's total and the total."""
    table = Table(title=f"thrifty runs: {len(jobs)} run(s)")
    for column in COLUMNS:
        table.add_column(
            column, justify="right" if column in _RIGHT else "left", no_wrap=column != "run"
        )
    names = [j.name for j in jobs]
    for job in sorted(jobs, key=lambda j: (j.sweep or "", j.started)):
        table.add_row(*_row(job, names))
    table.add_section()
    for group in groups:
        table.add_row(*_total_row(group), style="dim")
    table.add_row(*_total_row(total("total", jobs)), style="bold")
    return table


def case_table(study: CaseStudy, article: LeverPlan | None) -> RichTable:
    """The seeds' table from the runs: each lever's saving, its share of the saving, what it
    rests on, and the article's share beside it."""
    table = Table(title="The case study from these runs (USD per year)")
    for column in (
        "lever: change",
        "before",
        "after",
        "saved",
        "share",
        "article's share",
        "basis",
    ):
        table.add_column(
            column, justify="left" if column in ("lever: change", "basis") else "right"
        )
    theirs = _article_shares(article)
    shares = study.shares()
    for step in study.plan.steps:
        table.add_row(
            f"{step.lever}\n  {step.detail}",
            fmt_usd(step.before),
            fmt_usd(step.after),
            fmt_usd(step.saving),
            fmt_pct(shares[step.lever]),
            fmt_pct(theirs[step.lever]) if step.lever in theirs else "-",
            study.basis.get(step.lever, ""),
        )
    table.add_row("total", fmt_usd(study.plan.baseline), fmt_usd(study.plan.final),
                  fmt_usd(study.plan.saving), "100.0%", "100.0%" if theirs else "-", "",
                  style="bold")  # fmt: skip
    return table


def _article_shares(article: LeverPlan | None) -> dict[str, float]:
    if article is None or not article.saving:
        return {}
    return {s.lever: s.saving / article.saving for s in article.steps}


def case_lines(study: CaseStudy, article: LeverPlan | None) -> list[str]:
    """The inputs laid out as the article lays them out, and the comparison."""
    lines = [
        f"runs: {study.runs} over {study.months:.1f} month(s) = {study.runs_per_year:,.1f} a year; "
        f"{study.hours_per_run:.3g} h per run to the budget at the untuned pace; "
        f"${study.on_demand_per_hour:,.4g}/h on-demand, ${study.paid_per_hour:,.4g}/h paid",
        f"these runs: {fmt_usd(study.plan.baseline)} -> {fmt_usd(study.plan.final)} a year "
        f"(-{fmt_pct(study.plan.saving_pct)}); they paid {fmt_usd(study.actual_usd)} a year, "
        f"{fmt_usd(study.wasted_usd)} of it on work preemptions threw away",
    ]
    if article is not None:
        lines.append(
            f"the article, recomputed from its own figures: {fmt_usd(article.baseline)} -> "
            f"{fmt_usd(article.final)} a year (-{fmt_pct(article.saving_pct)})"
        )
    return lines + study.notes


def storage_lines(ledger: Ledger) -> list[str]:
    """Where each storage price comes from, dated."""
    return [
        f"storage: {p.storage_class} {p.region} ${p.usd_per_gib_month:g}/GiB-month "
        f"({p.tier_note}; {p.dated_source})"
        for p in ledger.storage_prices.values()
    ]
