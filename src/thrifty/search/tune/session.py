"""A tune from start to end: check everything up front, prepare --out, run the search, and
write what it found.

--out holds trial.toml (what every trial starts from), trials/NN-NAME/ (each trial's run and
its train.log; a paired comparison's runs are trials/NN-NAME.a0, .b1, ... and final.a0, ...),
tune.json (written first, then after every trial and comparison run, so the finished ones are
kept whatever happens next: an unfinished tune is resumed by the same command, see outdir.py)
and, when a trial finished, winner.toml. Nothing there holds a credential: trial.toml and
winner.toml are redacted as a run's config.toml is, and the trials receive the config as given
through a pipe, in the tune's warm worker (thrifty.search.engine), whose own output is in
workers/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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
from thrifty.errors import ConfigError, ThriftyError, fix
from thrifty.redact import redact_value
from thrifty.rundir.files import write_json
from thrifty.search.tune import outdir
from thrifty.search.tune.compare import Comparison
from thrifty.search.tune.configs import trial_config, winner_config
from thrifty.search.tune.pricing import price_for
from thrifty.search.tune.report import TunePlan, TuneResult, result_dict
from thrifty.search.tune.search import Outcome, Search
from thrifty.search.tune.space import (
    build_space,
    hardware_precisions,
    parse_levers,
    parse_micro,
)
from thrifty.search.tune.stopping import StopSignals, TuneStopped, stopped_line
from thrifty.search.tune.trials import (
    Candidate,
    Interrupted,
    Runner,
    Trial,
    WorkerTrials,
    cpu_peaks,
)
from thrifty.search.tune.waterfall import waterfall

DEFAULT_BUDGET = "10m"
DEFAULT_STEPS = 20
FINISH_SECONDS = 1.0  # kept from the budget to write the report once the last trial ends


def option(flag: str) -> str:
    """A message's marker for one of the tune's options (`thrifty.errors.fix`): "--budget"
    on the command line, "budget" in Python."""
    return fix("tune." + flag.removeprefix("--").replace("-", "_"))


AGAIN = fix("tune", phrase="again")  # how the same tune is resumed


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
) -> TunePlan:
    """Check every input before any trial runs; the budget counts from here. `name` is what
    the report calls the config (its path); the other arguments are the command's options."""
    started = time.monotonic()
    seconds = parse_duration(budget, option("--budget"))
    if steps < 2:
        raise ConfigError(
            f"{option('--steps')} {steps} is invalid: the first step is warm-up and not measured; "
            f"give 2 or more (e.g. {option('--steps')} {DEFAULT_STEPS})"
        )
    config = TrainConfig.from_dict(given)
    chosen = parse_levers(levers, option("--levers"))
    sizes = parse_micro(micro, option("--micro"))
    if sizes is not None and "micro" not in chosen:
        raise ConfigError(
            f"{option('--micro')} gives micro-batch sizes but {option('--levers')} leaves out "
            "micro: add it to the levers"
        )
    price = price_for(config.cost, instance, option("--instance"))
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
    earlier = outdir.inspect(out_dir, key, overwrite, option)  # refused here, before any work
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
    with outdir.held(plan.out, option), StopSignals() as stop:
        with outdir.writing(plan.out, option, AGAIN):
            earlier = outdir.inspect(plan.out, plan.key, plan.overwrite, option)
            outdir.replace_earlier(plan.out, option, plan.overwrite and earlier is None)
            return _search(plan, earlier, stop, runner, clock)


def _search(
    plan: TunePlan,
    earlier: outdir.Earlier | None,
    stop: StopSignals,
    runner: Runner | None,
    clock: Callable[[], float],
) -> TuneResult:
    result = TuneResult(plan=plan, outcome=Outcome())
    record = plan.out / "tune.json"
    if earlier is None:
        write_json(record, result_dict(result))  # first: what a resume starts from
    else:
        say("tune", f"resuming the tune in {plan.out}: {earlier.describe()} kept")
    data = trial_config(plan.given, plan.steps, plan.space.effective)
    (plan.out / "trial.toml").write_text(dump_toml(redact_value(data)))
    if runner is None:
        runner = WorkerTrials(
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
        line = stopped_line(stop.received, exc.name, len(result.trials), plan.out, AGAIN, runs)
        raise TuneStopped(line) from None
    finally:
        _close(runner)
    result.waterfall = waterfall(
        result.outcome, plan.job, plan.price, plan.config.checkpoint.interruption_rate
    )
    _write_winner(result)
    result.reason = failure(result)
    result.wall_seconds = clock() - start
    result.state = "finished"
    write_json(record, result_dict(result))
    return result


def _close(runner: Runner) -> None:
    """End the runner's worker, if it has one."""
    close = getattr(runner, "close", None)
    if callable(close):
        close()


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
    """One line saying why there is no winner (its options marked: `option`), None when
    there is one."""
    outcome, plan = result.outcome, result.plan
    if outcome.winner is not None:
        return None
    trials = outcome.trials
    base = trials[0]  # the search always runs the baseline
    if all(t.status == "stopped" for t in trials):
        return (
            f"{option('--budget')} {plan.budget} is too small for even one trial: the "
            f"baseline was stopped after {base.wall_seconds:.0f} s{_progress(base)}; give more "
            f"time (e.g. {option('--budget')} {DEFAULT_BUDGET})"
        )
    if base.failure == "hung":
        return (
            f"the baseline (the config as given) {base.error} (log: {base.run_dir}/train.log): "
            "find what it waits for (its data, a network file system, a lock) or, if its first "
            f"step takes that long, give more time ({option('--budget')})"
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
