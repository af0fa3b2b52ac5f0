"""What `thrifty tune` prints and writes: the plan it ran and its result (`TunePlan`,
`TuneResult`), and the trials table, the paired comparisons, the winner, what was not run, and
the waterfall, as rich tables or as JSON (the same data)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thrifty.errors import command_line_words, python_words
from thrifty.plan.units import fmt_bytes, fmt_hours, fmt_pct, fmt_usd
from thrifty.search.tune.compare import block_seconds
from thrifty.search.tune.paired import CONFIDENCE, MIN_GAIN
from thrifty.search.tune.pricing import Job, Price, job_usd, usd_per_unit
from thrifty.search.tune.space import Setting, Space

if TYPE_CHECKING:
    from rich.console import Console

    from thrifty.config import TrainConfig
    from thrifty.search.tune.search import Outcome
    from thrifty.search.tune.trials import Trial
    from thrifty.search.tune.waterfall import Waterfall

PER = {"tokens": "$/M tokens", "samples": "$/k samples"}
MEMORY_SOURCES = {
    "cuda": "CUDA peak allocated (the run's summary.json)",
    "rss": "CPU: peak resident set of the worker while the trial ran (VmHWM), not a device memory",
}


# --------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True, slots=True, kw_only=True)
class TunePlan:
    """Everything a tune needs, checked. `given` is the config as given (TOML data: the
    baseline, and where the winner starts from); `started` is when the tune began
    (time.monotonic seconds), from which the budget counts; `key` names the search, so that
    the same command resumes it (outdir.search_key)."""

    name: str
    given: dict[str, Any]
    config: TrainConfig
    out: Path
    budget: str
    budget_seconds: float
    steps: int
    space: Space
    device: str
    price: Price
    instance: str | None
    overwrite: bool
    env: dict[str, str]
    peaks: dict[str, float] | None = None  # TFLOP/s per precision, pinned for every trial
    key: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def baseline(self) -> Setting:
        return Setting.of(self.config)

    @property
    def job(self) -> Job:
        return Job.of(self.config.run)


@dataclass(slots=True, kw_only=True)
class TuneResult:
    """The trials (in the order run), what was skipped, and the winner.

    `winner_config` is the winning configuration (also written to `winner_toml`);
    `failure` is the one-line reason no winner was found, None when one was (`reason` holds
    it with its options marked, `thrifty.errors.fix`, for the command line to word as its
    flags). `state`: running, stopped (by a signal: resumable) or finished.
    """

    plan: TunePlan
    outcome: Outcome
    waterfall: Waterfall | None = None
    winner_config: TrainConfig | None = None
    winner_toml: Path | None = None
    reason: str | None = None
    wall_seconds: float = 0.0
    state: str = "running"

    @property
    def failure(self) -> str | None:
        """Why no winner was found, in Python's words; None when one was."""
        return None if self.reason is None else python_words(self.reason)

    @property
    def trials(self) -> list[Trial]:
        return self.outcome.trials

    @property
    def baseline(self) -> Trial | None:
        return self.outcome.baseline

    @property
    def winner(self) -> Trial | None:
        return self.outcome.winner

    @property
    def speedup(self) -> float | None:
        """The winner's throughput over the baseline's, paired: the final re-measurement's, or
        where it could not tell, the product of the winner's levers' comparisons. None when
        the baseline did not finish."""
        base, best = self.baseline, self.winner
        if base is None or best is None or not base.ok:
            return None
        final = self.outcome.final
        measured = final.estimate if final is not None and best is not base else None
        if measured is not None:
            return measured.ratio
        return math.prod(c.estimate.ratio for c in self.outcome.levers if c.estimate)


def figures(result: TuneResult, trial: Trial) -> dict[str, Any]:
    """A trial's cost figures: $ per million tokens (per thousand samples), and the whole
    configured job's time (seconds) and dollars at its pace."""
    plan, unit = result.plan, result.outcome.unit
    seconds = plan.job.seconds(trial) if trial.ok else None
    return {
        "usd_per_unit": usd_per_unit(plan.price, trial.rate(unit), unit) if trial.ok else None,
        "job_seconds": seconds,
        "job_usd": job_usd(plan.price, seconds),
    }


def result_dict(result: TuneResult) -> dict[str, Any]:
    """Everything the report shows, as data (what --json prints and tune.json holds)."""
    plan, outcome = result.plan, result.outcome
    best = outcome.winner
    return {
        "config": plan.name,
        "out": str(plan.out),
        "device": plan.device,
        "budget_seconds": plan.budget_seconds,
        "steps_per_trial": plan.steps,
        "effective_batch": plan.space.effective,
        "levers": list(plan.space.levers),
        "unit": outcome.unit,
        "per": "million tokens" if outcome.unit == "tokens" else "thousand samples",
        "price": {
            "source": plan.price.source,
            "usd_per_hour": plan.price.usd_per_hour,
            "pricing": plan.price.pricing if plan.price.priced else None,
        },
        "job": plan.job.describe(),
        "trials": [{**t.to_dict(), **figures(result, t)} for t in outcome.trials],
        "pruned": [s.to_dict() for s in outcome.skipped if s.kind == "pruned"],
        "checks": list(outcome.checks),
        "not_reached": [s.to_dict() for s in outcome.not_reached],
        "baseline": outcome.baseline.name if outcome.baseline else None,
        "winner": best.name if best else None,
        "winner_toml": str(result.winner_toml) if result.winner_toml else None,
        "speedup": result.speedup,
        "comparisons": [c.to_dict() for c in outcome.comparisons],
        "waterfall": result.waterfall.to_dict() if result.waterfall else None,
        "stopped_early": outcome.stop,
        # The command line's words: what `thrifty tune --json` prints and `thrifty report` shows.
        "failure": None if result.reason is None else command_line_words(result.reason),
        "wall_seconds": result.wall_seconds,
        "notes": notes(result),
        # What resuming needs (tuning.outdir): whether the tune ended, which search it is, and
        # the CPU peaks its trials were measured against.
        "state": result.state,
        "search_key": plan.key,
        "peaks": plan.peaks,
    }


def notes(result: TuneResult) -> list[str]:
    plan, outcome = result.plan, result.outcome
    lines = list(plan.space.notes)
    sources = {t.peak_memory_source for t in outcome.trials if t.peak_memory_source}
    lines += [f"peak memory: {MEMORY_SOURCES[s]}" for s in sorted(sources)]
    if plan.peaks:
        pinned = ", ".join(
            f"{p} {t * 1e3:,.0f} GFLOP/s" for p, t in plan.peaks.items() if p != "auto"
        )
        lines.append(
            f"MFU: against one CPU peak per precision for every trial, measured once ({pinned})"
        )
    lines.append(f"price: {plan.price.source}")
    if plan.price.instance is not None and plan.price.gpus > 1:
        lines.append(
            f"the trials run one process; the price is for {plan.price.gpus} GPUs "
            f"({plan.price.instance.name} is billed whole)"
        )
    lines.append(f"job: {plan.job.describe()} at each trial's pace, one process")
    lines.append(
        "figures: steady-state steps only (warm-up and compile excluded), "
        f"{plan.steps} steps per trial"
    )
    if outcome.comparisons:
        lines.append(
            "speed-ups: paired, each candidate against the incumbent in alternating runs "
            f"(A B A ... A, about {block_seconds():.0f} s of steps each), each B over the A runs "
            f"around it, with a {CONFIDENCE:.0%} interval; a lever is kept when its interval "
            f"lies above 1 and it gains {MIN_GAIN:.0%} or more"
        )
    base = outcome.baseline
    if base is not None and not base.ok and outcome.winner is not None:
        lines.append(f"no waterfall: the baseline {base.name} did not finish ({base.error})")
    return lines


# --------------------------------------------------------------------------------------------
# Printing


def print_report(result: TuneResult) -> None:
    from rich.markup import escape

    from thrifty.console import console

    out = console()
    plan = result.plan
    out.print(
        escape(
            f"thrifty tune: {plan.name} on {plan.device}, effective batch "
            f"{plan.space.effective}, {len(result.trials)} trial(s) in "
            f"{result.wall_seconds:.0f} s of a {plan.budget} budget"
        ),
        style="bold",
    )
    out.print(trials_table(result))
    _print_failures(out, result)
    _print_skipped(out, result)
    for c in result.outcome.comparisons:
        out.print(escape(f"  paired: {c.line}"), soft_wrap=True)
    _print_winner(out, result)
    if result.waterfall is not None and not result.waterfall.plan.steps:
        out.print("no lever beat the config as given: no waterfall")
    elif result.waterfall is not None:
        out.print(waterfall_table(result.waterfall))
        for note in result.waterfall.plan.assumptions:
            out.print(f"  [dim]assumed:[/dim] {escape(note)}", soft_wrap=True)
    for note in notes(result):
        out.print(f"  [dim]{escape(note)}[/dim]", soft_wrap=True)


def trials_table(result: TuneResult) -> Any:
    """One row per trial: its setting as run ("auto" values resolved), then its figures."""
    from thrifty.console import Table

    unit = result.outcome.unit
    table = Table(title="Trials (* the winner)", pad_edge=False)
    for name in ("trial", "prec.", "ckpt", "micro", "compile", "workers"):
        table.add_column(name, no_wrap=True)
    priced = result.plan.price.priced
    money = [PER[unit], "job $"] if priced else ["job time"]
    for name in (f"{unit}/s", "peak mem", "MFU", *money):
        table.add_column(name, justify="right", no_wrap=True)
    for t in result.trials:
        table.add_row(*_setting_cells(t, t is result.winner), *_figure_cells(result, t))
    return table


def _setting_cells(t: Trial, best: bool) -> list[str]:
    s = t.resolved
    policy = s.checkpointing if isinstance(s.checkpointing, str) else ",".join(s.checkpointing)
    accum = f"x{t.accumulation_steps}" if t.accumulation_steps else ""
    name = f"{t.name} *" if best else t.name
    return [name, s.precision, policy, f"{s.micro}{accum}", s.compile, str(s.num_workers)]


def _figure_cells(result: TuneResult, t: Trial) -> list[str]:
    """Throughput, memory, MFU, then $ per unit and the job's $ (or its time, unpriced)."""
    priced = result.plan.price.priced
    if not t.ok:
        status = t.failure if t.failure in ("hung", "killed") else t.status
        return [str(status), *(["-"] * (4 if priced else 3))]
    f = figures(result, t)
    cells = [
        f"{t.rate(result.outcome.unit) or 0:,.1f}",
        fmt_bytes(t.peak_memory_bytes) if t.peak_memory_bytes else "-",
        fmt_pct(t.mfu) if t.mfu is not None else "-",
    ]
    if priced:
        return [*cells, fmt_usd(f["usd_per_unit"]), fmt_usd(f["job_usd"])]
    job = f["job_seconds"]
    return [*cells, _duration(job / 3600) if job is not None else "-"]


def waterfall_table(w: Waterfall) -> Any:
    from thrifty.plan.tables import levers_table

    money = fmt_usd if w.unit == "USD" else _duration
    title = "From the baseline to the winner, lever by lever"
    # Unpriced, the cells are durations (seconds, minutes or hours as each reads best): the
    # title says time, not hours over a column of seconds.
    unit = w.unit if w.unit == "USD" else "time"
    return levers_table(w.plan, title, unit=unit, money=money, groups=False)


def _print_failures(out: Console, result: TuneResult) -> None:
    from rich.markup import escape

    for t in result.trials:
        if not t.ok:
            line = f"  {t.name} {t.status}: {t.error} (log: {t.run_dir}/train.log)"
            out.print(escape(line), soft_wrap=True)


def _print_skipped(out: Console, result: TuneResult) -> None:
    from rich.markup import escape

    for s in result.outcome.skipped:
        line = f"  {s.kind}: {s.describe()}: {s.reason}"
        out.print(escape(line), style="dim" if s.kind == "pruned" else None, soft_wrap=True)
    for check in result.outcome.checks:
        out.print(escape(f"  parity: {check}"), soft_wrap=True)


def _print_winner(out: Console, result: TuneResult) -> None:
    from rich.markup import escape

    best, base, unit = result.winner, result.baseline, result.outcome.unit
    if best is None:
        return
    text = f"winner: {best.name} ({best.resolved.describe()})"
    final = result.outcome.final
    measured = final.estimate if final is not None else None
    if best is base:
        text += ": the config as given"
    elif measured is not None and final is not None:
        text += (
            f": {measured.describe()} the baseline's {unit}/s, re-measured over "
            f"{measured.rounds} alternating rounds"
        )
    elif len(levers := result.outcome.levers) == 1 and levers[0].estimate is not None:
        est = levers[0].estimate  # one lever: its comparison was against the config as given
        text += (
            f": {est.describe()} the baseline's {unit}/s, paired over {est.rounds} alternating "
            "rounds"
        )
    elif result.speedup is not None:
        text += f": {result.speedup:.2f}x the baseline's {unit}/s, by its levers' comparisons"
    out.print(escape(text), style="bold", soft_wrap=True)
    if result.winner_toml is not None:
        out.print(
            escape(f"  written to {result.winner_toml}: thrifty train {result.winner_toml}"),
            soft_wrap=True,
        )


def _duration(hours: float) -> str:
    """Seconds below a minute, else the planner's minutes and hours."""
    return f"{hours * 3600:.1f} s" if hours < 1 / 60 else fmt_hours(hours)
