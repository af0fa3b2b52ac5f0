"""A tune from start to end: check everything up front, prepare --out, run the search, and
write what it found.

--out holds trial.toml (what every trial starts from), trials/NN-NAME/ (each trial's run and
its train.log; a paired comparison's runs are trials/NN-NAME.a0, .b1, ... and final.a0, ...),
tune.json (written first, then after every trial and comparison run, so the finished ones are
kept whatever happens next: an unfinished tune is resumed by the same command, see outdir.py)
and, when a trial finished, winner.toml. Nothing there holds a credential: trial.toml and
winner.toml are redacted as a run's config.toml is, and the trials receive the config as given
through a pipe (thrifty.tune_trial).
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.config import (
    TrainConfig,
    apply_overrides,
    dump_toml,
    load_config,
    parse_duration,
    read_config_file,
)
from thrifty.console import say
from thrifty.errors import ConfigError, ThriftyError
from thrifty.records.directory import write_json
from thrifty.redact import redact_value
from thrifty.tuning import outdir
from thrifty.tuning.compare import Comparison
from thrifty.tuning.configs import trial_config, winner_config
from thrifty.tuning.pricing import Job, Price, price_for
from thrifty.tuning.search import Outcome, Search
from thrifty.tuning.space import (
    Setting,
    Space,
    build_space,
    hardware_precisions,
    parse_levers,
    parse_micro,
)
from thrifty.tuning.stopping import StopSignals, TuneStopped, stopped_line
from thrifty.tuning.trials import Candidate, ChildTrials, Interrupted, Runner, Trial, cpu_peaks
from thrifty.tuning.waterfall import Waterfall, waterfall

DEFAULT_BUDGET = "10m"
DEFAULT_STEPS = 20
FINISH_SECONDS = 1.0  # kept from the budget to write the report once the last trial ends


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
    interface: str = "cli"  # "cli" or "api": which names messages use
    peaks: dict[str, float] | None = None  # TFLOP/s per precision, pinned for every trial
    key: str = ""
    started: float = field(default_factory=time.monotonic)

    @property
    def baseline(self) -> Setting:
        return Setting.of(self.config)

    @property
    def job(self) -> Job:
        return Job.of(self.config.run)

    def option(self, flag: str) -> str:
        return option(flag, self.interface)

    @property
    def again(self) -> str:
        """How to resume it."""
        if self.interface == "cli":
            return "run the same command again"
        return "call tune() again with the same arguments"


@dataclass(slots=True, kw_only=True)
class TuneResult:
    """The trials (in the order run), what was skipped, and the winner.

    `winner_config` is the winning configuration (also written to `winner_toml`);
    `failure` is the one-line reason no winner was found, None when one was. `state`:
    running, stopped (by a signal: resumable) or finished.
    """

    plan: TunePlan
    outcome: Outcome
    waterfall: Waterfall | None = None
    winner_config: TrainConfig | None = None
    winner_toml: Path | None = None
    failure: str | None = None
    wall_seconds: float = 0.0
    state: str = "running"

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


def option(flag: str, interface: str) -> str:
    """How a message names an option: "--budget" on the command line, "budget" in Python."""
    return flag if interface == "cli" else flag.removeprefix("--").replace("-", "_")


def read_given(
    path: str | os.PathLike[str], overrides: Iterable[tuple[str, Any]] = ()
) -> dict[str, Any]:
    """A config file's own TOML data with `section.key` overrides: the config as given.
    (`load_config` reads it the same way, defaults filled in; the winner keeps only what the
    file says.)"""
    return apply_overrides(read_config_file(path), overrides)


def make_plan(
    given: dict[str, Any],
    name: str,
    *,
    out: str | os.PathLike[str] | None = None,
    budget: str | float = DEFAULT_BUDGET,
    steps: int = DEFAULT_STEPS,
    levers: str | Sequence[str] | None = None,
    micro: str | Sequence[int] | None = None,
    instance: str | None = None,
    overwrite: bool = False,
    env: Mapping[str, str] | None = None,
    interface: str = "cli",
) -> TunePlan:
    """Check every input before any trial runs; the budget counts from here. `name` is what
    the report calls the config (its path); the other arguments are the command's options."""
    started = time.monotonic()
    opt = functools.partial(option, interface=interface)
    seconds = parse_duration(budget, opt("--budget"))
    if steps < 2:
        raise ConfigError(
            f"{opt('--steps')} {steps} is invalid: the first step is warm-up and not measured; "
            f"give 2 or more (e.g. {opt('--steps')} {DEFAULT_STEPS})"
        )
    config = TrainConfig.from_dict(given)
    chosen = parse_levers(levers, opt("--levers"))
    sizes = parse_micro(micro, opt("--micro"))
    if sizes is not None and "micro" not in chosen:
        raise ConfigError(
            f"{opt('--micro')} gives micro-batch sizes but {opt('--levers')} leaves out micro: "
            "add it to the levers"
        )
    price = price_for(config.cost, instance, opt("--instance"))
    device, precisions, left_out = hardware_precisions(config.run.device)
    space = build_space(
        config,
        levers=chosen,
        precisions=precisions,
        micro_sizes=sizes,
        device=device,
    )
    if left_out and "precision" in chosen:
        space.notes.append(left_out)
    out_dir = Path(out) if out else Path("runs") / f"tune-{Path(name).stem}"
    key = outdir.search_key(given, steps, space, device)
    earlier = outdir.inspect(out_dir, key, overwrite, opt)  # refused here, before any work
    from thrifty.measure.peak import PEAK_ENV  # here: the module loads torch

    peaks = None
    if earlier is not None and earlier.peaks:
        peaks = earlier.peaks  # the trials kept were measured against these
    elif device == "cpu" and config.measure.peak_tflops is None and not os.environ.get(PEAK_ENV):
        peaks = cpu_peaks(space.precisions, config.precision.mode)
    return TunePlan(
        name=name,
        given=given,
        config=config,
        out=out_dir,
        budget=str(budget),
        budget_seconds=seconds,
        steps=steps,
        space=space,
        device=device,
        price=price,
        instance=instance,
        overwrite=overwrite,
        env=dict(os.environ if env is None else env),
        interface=interface,
        peaks=peaks,
        key=key,
        started=started,
    )


def run_tune(
    plan: TunePlan,
    runner: Runner | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TuneResult:
    """Search, then write winner.toml and tune.json. `runner` and `clock` replace the trial
    processes and the time (tests); the budget then counts from the first call to `clock`.
    Raises TuneStopped after SIGTERM or SIGINT, OutOfSpace when the disk fills."""
    opt = plan.option
    with outdir.held(plan.out, opt), StopSignals() as stop:
        with outdir.writing(plan.out, opt, plan.again):
            earlier = outdir.inspect(plan.out, plan.key, plan.overwrite, opt)
            outdir.replace_earlier(plan.out, opt, plan.overwrite and earlier is None)
            return _search(plan, earlier, stop, runner, clock)


def _search(
    plan: TunePlan,
    earlier: outdir.Earlier | None,
    stop: StopSignals,
    runner: Runner | None,
    clock: Callable[[], float],
) -> TuneResult:
    from thrifty.tuning.report import result_dict

    result = TuneResult(plan=plan, outcome=Outcome())
    record = plan.out / "tune.json"
    if earlier is None:
        write_json(record, result_dict(result))  # first: what a resume starts from
    else:
        say("tune", f"resuming the tune in {plan.out}: {earlier.describe()} kept")
    data = trial_config(plan.given, plan.steps, plan.space.effective)
    (plan.out / "trial.toml").write_text(dump_toml(redact_value(data)))
    if runner is None:
        runner = ChildTrials(
            data,
            plan.out,
            plan.steps,
            plan.baseline,
            plan.env,
            plan.peaks,
            should_stop=stop.requested,
        )
        start = plan.started
    else:
        start = clock()
    trials = _Trials(runner, earlier, stop)

    def written(trial: Trial) -> None:
        _announce(trial, result.outcome.unit, trial.name in trials.kept)
        write_json(record, result_dict(result))

    def decided(comparison: Comparison) -> None:
        say("tune", comparison.line)
        write_json(record, result_dict(result))

    search = Search(
        plan.space,
        plan.baseline,
        trials,
        deadline=start + plan.budget_seconds - FINISH_SECONDS,
        clock=lambda: clock() + trials.offset,
        on_trial=written,
        on_comparison=decided,
    )
    result.outcome = search.outcome
    try:
        search.run()
    except Interrupted as exc:
        result.state = "stopped"
        write_json(record, result_dict(result))
        runs = sum(len(c.blocks) for c in result.outcome.comparisons)
        line = stopped_line(stop.received, exc.name, len(result.trials), plan.out, plan.again, runs)
        raise TuneStopped(line) from None
    result.waterfall = waterfall(
        result.outcome, plan.job, plan.price, plan.config.checkpoint.interruption_rate
    )
    _write_winner(result)
    result.failure = failure(result)
    result.wall_seconds = clock() - start
    result.state = "finished"
    write_json(record, result_dict(result))
    return result


class _Trials:
    """The search's runner: a trial the earlier tune finished, as it was (its time counts on
    the search's clock: `offset` seconds), else the trial run, announced. None starts once a
    stop was asked for."""

    def __init__(self, run: Runner, earlier: outdir.Earlier | None, stop: StopSignals) -> None:
        self.run, self.earlier, self.stop = run, earlier, stop
        self.offset = 0.0
        self.kept: set[str] = set()

    def __call__(self, candidate: Candidate, deadline: float) -> Trial:
        kept = self.earlier.kept(candidate) if self.earlier is not None else None
        if kept is not None:
            self.offset += kept.wall_seconds
            self.kept.add(kept.name)
            return kept
        if self.stop.requested():
            raise Interrupted(None)
        say("tune", f"{candidate.name}: {candidate.setting.describe()} ...")
        return self.run(candidate, deadline - self.offset)


def _announce(trial: Trial, unit: str, kept: bool) -> None:
    if trial.ok:
        figure = f"{trial.rate(unit) or 0:,.1f} {unit}/s at micro-batch {trial.micro_batch}"
    elif trial.failure == "hung":
        figure = str(trial.error)
    else:
        figure = f"{trial.status}: {trial.error}"
    where = "kept from the earlier run" if kept else f"{trial.wall_seconds:.0f} s"
    say("tune", f"{trial.name}: {figure} ({where})")


def _write_winner(result: TuneResult) -> None:
    plan, best = result.plan, result.winner
    if best is None:
        return
    cost = None
    if plan.instance is not None and plan.price.cost is not None:
        c = plan.price.cost
        cost = {"instance": c.instance, "pricing": c.pricing, "gpus": c.gpus, "catalog": c.catalog}
    data = winner_config(plan.given, best.resolved, plan.space.effective, cost)
    path = plan.out / "winner.toml"
    path.write_text(_HEADER.format(name=best.name) + dump_toml(redact_value(data)))
    try:
        load_config(path)
        result.winner_config = TrainConfig.from_dict(data)  # credentials as given, in memory
    except ConfigError as exc:  # the values came from runs that took them: a bug if not
        raise ThriftyError(f"the winner's config {path} does not load: {exc}") from None
    result.winner_toml = path


_HEADER = (
    "# Written by thrifty tune: the config as given with the settings of trial {name}.\n"
    "# Credentials are left out, as in a run's config.toml: storage keys come from the\n"
    "# environment; give a value shown as <redacted> with --set.\n"
)


def _progress(trial: Trial) -> str:
    """How far a trial the budget stopped had come (one that was ready to train and completed
    no step is hung, not stopped, unless it was compiling)."""
    if trial.steps_completed is None:
        return ""
    if trial.failure == "compiling":
        return ", still compiling (torch.compile's first step)"
    if trial.steps_completed == 0:
        return ", before it started training"
    return f", {trial.steps_completed} step(s) in"


def failure(result: TuneResult) -> str | None:
    """One line saying why there is no winner, None when there is one."""
    outcome, plan = result.outcome, result.plan
    if outcome.winner is not None:
        return None
    trials = outcome.trials
    base = trials[0]  # the search always runs the baseline
    if all(t.status == "stopped" for t in trials):
        return (
            f"{plan.option('--budget')} {plan.budget} is too small for even one trial: the "
            f"baseline was stopped after {base.wall_seconds:.0f} s{_progress(base)}; give more "
            f"time (e.g. {plan.option('--budget')} {DEFAULT_BUDGET})"
        )
    if base.failure == "hung":
        return (
            f"the baseline (the config as given) {base.error} (log: {base.run_dir}/train.log): "
            "find what it waits for (its data, a network file system, a lock) or, if its first "
            f"step takes that long, give more time ({plan.option('--budget')})"
        )
    at_one = next((t for t in trials if t.out_of_memory_at_one), None)
    if at_one is not None and all(t.failure in ("oom", "budget", "compiling") for t in trials):
        return (
            f"every trial ran out of memory, even at micro-batch 1: {at_one.error} (logs in "
            f"{plan.out / 'trials'})"
        )
    if outcome.stop is not None:
        return (
            f"the baseline (the config as given) failed: {base.error} (log: "
            f"{base.run_dir}/train.log); no other trial was started: each would fail alike"
        )
    first = next(t for t in trials if t.status == "failed")
    return (
        f"every trial failed; the first, {first.name}: {first.error} "
        f"(log: {first.run_dir}/train.log)"
    )
