"""One trial of a sweep: `thrifty train` in a warm worker (`thrifty.search.engine`), with the
pruner's say after each evaluation.

The trial's run is `thrifty train CONFIG --out DIR/trials/NNNN --set KEY=VALUE ...` in the
worker of its device, which receives the config (credentials included) through a pipe, never
from a file; the worker's life is tied to the sweep's (`thrifty.children`): if the sweep is
SIGKILLed, so is the worker, and the trial's last checkpoint is what the next sweep resumes.
The run reports each evaluation on its pipe (`thrifty.callbacks.trial_report`); the sweep
reports it to Optuna and answers whether the run goes on (`thrifty.search.sweep.verdicts`).
A Hyperband pause saves a checkpoint and ends the run; the same worker (or any other) resumes
it from there, with no process started.

How a trial ends, for Optuna:
- the run finished (exit 0): COMPLETE with its last validation loss (its training loss without
  validation data), or PRUNED when the pruner stopped it; a run that diverged is FAILED;
- the run was preempted (exit 75: a SIGTERM, a cloud notice; the sweep passes its own stop
  signals on) or killed while the sweep stopped: back in the queue (WAITING), resumed from its
  own checkpoint by the next worker to ask;
- a trial that ends its worker: SIGKILLed (the out-of-memory killer) it is requeued and resumed
  from its checkpoint by a new worker, up to MAX_KILLS times; a crash in native code (SIGSEGV,
  SIGABRT) or a hang (no step or evaluation for `hang_seconds`: the sweep ends its worker) is
  FAILED at once, with its reason;
- anything else (the config refused, an out-of-memory error, a crash): FAILED, with the run's
  first error line.
A worker whose lease lapsed and whose trial another worker then took up
(`thrifty.search.sweep.leases`) stops its run (SIGTERM: it saves) and tells Optuna nothing.

Where the config names its checkpoints' place (checkpoint.location, checkpoint.local_dir), each
trial saves under it in a folder of its own, `PLACE/STUDY/trials/NNNN`: the study's name keeps
two sweeps of one config apart, and every worker of one sweep finds a trial's saves where
another left them. The trial's config then carries it, on its stdin as ever; a shared place
would hand each trial the last one's checkpoint to resume.
"""

from __future__ import annotations

import copy
import json
import math
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from thrifty.callbacks.trial_pipe import Evaluation, TrialPipe
from thrifty.callbacks.trial_report import PAUSE
from thrifty.config import dump_toml, toml_literal
from thrifty.records.stop_signals import EXIT_PREEMPTED
from thrifty.rundir.files import step_records
from thrifty.search.engine import Engine, TrialSession
from thrifty.search.sweep import hyperband
from thrifty.search.sweep.leases import Leases, requeue
from thrifty.search.sweep.study import PAUSED_KEY
from thrifty.search.sweep.verdicts import PRUNED_KEY, Backlog

SECONDS_KEY = "thrifty.seconds"  # wall seconds of the trial's processes, all sessions summed
SESSIONS_KEY = "thrifty.sessions"  # each session's clock, one `session_record` each
RUN_DIR_KEY = "thrifty.run_dir"
ERROR_KEY = "thrifty.error"
FACTS_KEY = "thrifty.run"  # steps, step time and price, from the run's own records
IN_USE = " is in use by "  # the run lock's refusal (thrifty.rundir.lock)
KILLS_KEY = "thrifty.kills"  # sessions of the trial a signal ended (the OOM killer's SIGKILL)
MAX_KILLS = 3  # then it fails: a trial killed each time it runs would be resumed forever
PLACE_KEYS = ("checkpoint.location", "checkpoint.local_dir")  # each trial gets its own
HANG_SECONDS = 1800.0  # a trial that reports nothing for this long is hung (a compile included)


@dataclass
class TrialSetup:
    """What every trial of one sweep shares."""

    config_text: bytes  # the base config file as given
    overrides: list[str]  # the sweep's --set, passed to every trial
    out: Path
    env: dict[str, str]
    pruner_name: str
    pruner: Any
    storage: Any
    brackets: list[hyperband.Bracket] | None = None  # with --pruner hyperband
    trials: int | None = None  # --trials: where the last Hyperband bracket is cut short
    leases: Leases = field(default_factory=lambda: Leases())
    # The config with --set applied, and the checkpoint places it sets (PLACE_KEYS: the
    # value): each trial's own are written into it.
    given: dict[str, Any] = field(default_factory=dict)
    places: dict[str, str] = field(default_factory=dict)
    study: str = ""  # the study's name: its folder under each place
    hang_seconds: float = HANG_SECONDS
    engine: Engine | None = None  # the warm workers; made from `out` and `env` on first use

    def workers(self) -> Engine:
        if self.engine is None:
            self.engine = Engine(self.out / "workers", self.env)
        return self.engine


@dataclass(frozen=True, slots=True)
class Ended:
    """How one session of a trial ended: `state` is complete, pruned, failed or requeued."""

    number: int
    state: str
    detail: str = ""


def run_dir(out: Path, number: int) -> Path:
    return out / "trials" / f"{number:04d}"


def command(setup: TrialSetup, params: dict[str, Any], out: Path) -> list[str]:
    """The trial's `thrifty train` options after its config."""
    sets = [f"{key}={toml_literal(value)}" for key, value in params.items()]
    args = ["--out", str(out)]
    overrides = setup.overrides
    if setup.places:  # in the trial's config, each trial's own
        overrides = [o for o in overrides if o.partition("=")[0].strip() not in PLACE_KEYS]
    for item in [*overrides, *sets]:
        args += ["--set", item]
    return args


def trial_config(setup: TrialSetup, number: int) -> bytes:
    """The config trial `number` reads: the sweep's as given, or, with a checkpoint place
    set, the config (--set applied) with the trial's own places under it."""
    if not setup.places:
        return setup.config_text
    config = copy.deepcopy(setup.given)
    section = config.setdefault("checkpoint", {})
    for key, place in setup.places.items():
        section[key.partition(".")[2]] = trial_place(place, setup.study, number)
    return dump_toml(config).encode()


def trial_place(place: str, study: str, number: int) -> str:
    """Trial `number`'s folder under a checkpoint place, `PLACE/STUDY/trials/NNNN`: a path or a
    URL, whose query (if any) stays at its end. The study's name is one folder's, whatever its
    characters ("runs/a" is `runs_a`, ".." is `_`)."""
    folder = re.sub(r"[^A-Za-z0-9._-]", "_", study).strip(".") or "_"
    base, mark, query = place.partition("?")
    return f"{base.rstrip('/')}/{folder}/trials/{number:04d}{mark}{query}"


def run_trial(
    setup: TrialSetup,
    study: optuna.Study,
    trial: optuna.Trial,
    params: dict[str, Any],
    stopping: threading.Event,
    slot: int = 0,
    device: dict[str, str] | None = None,
) -> Ended:
    """Run (or resume) `trial` to its end or to the sweep's stop in the warm worker at `slot`;
    tell Optuna how it ended. `device`: the environment that gives the worker its GPU
    (CUDA_VISIBLE_DEVICES)."""
    storage, trial_id = setup.storage, trial._trial_id
    out = run_dir(setup.out, trial.number)
    out.mkdir(parents=True, exist_ok=True)
    trial.set_user_attr(RUN_DIR_KEY, str(out))
    setup.leases.hold(storage, trial_id, trial.number)
    clock = SessionClock()
    try:
        child = setup.workers().start(
            command(setup, params, out),
            trial_config(setup, trial.number),
            out / "train.log",
            f"trial {trial.number}",
            slot=slot,
            device=device,
            append=True,  # each session's lines after the last's: a resume's story kept
        )
        clock.child = child
        code, paused, stopped = _serve(setup, study, trial, child, stopping, clock)
    finally:
        kept = setup.leases.release(trial_id)
    if not kept:  # another worker's now: its seconds, its facts, its outcome
        return Ended(
            trial.number,
            "taken",
            f"another worker took it up after this one's lease lapsed; this run's saves stay in {out}",
        )
    elapsed = child.elapsed
    _add_seconds(storage, trial, elapsed)
    facts = run_facts(out)
    trial.set_user_attr(FACTS_KEY, facts)
    _add_session(storage, trial, session_record(clock, elapsed, facts["step_seconds"]))
    return _finish(setup, study, trial, out, child, code, paused, stopped)


def _serve(
    setup: TrialSetup,
    study: optuna.Study,
    trial: optuna.Trial,
    child: TrialSession,
    stopping: threading.Event,
    clock: SessionClock,
) -> tuple[int, int | None, bool]:
    """Answer the run's evaluations until it ends; pass the sweep's stop on as SIGTERM (the
    run saves and exits 75); end a run silent for `setup.hang_seconds` with its worker.
    Returns its exit code, the step it was paused at (its Hyperband bracket behind) or None,
    and whether the sweep was stopping."""
    signalled = False
    paused: int | None = None
    backlog = Backlog(trial.number)
    pipe = child.pipe
    heard = [pipe.steps, time.monotonic()]  # the step lines read, when they last changed

    def turn() -> bool:
        nonlocal signalled
        clock.heard(pipe)
        now = time.monotonic()
        if pipe.steps != heard[0] or pipe.ready is None:  # a worker's start is not a hang
            heard[:] = [pipe.steps, now]
        elif now - heard[1] > setup.hang_seconds and child.ended_by is None:
            child.ended_by = "hung"
            child.kill()
        if (stopping.is_set() or not setup.leases.holds(trial._trial_id)) and not signalled:
            signalled = True
            child.terminate()
        return False  # the run ends itself: it saves first

    def judge(evaluation: Evaluation) -> str:
        nonlocal paused
        clock.heard(pipe)
        heard[1] = time.monotonic()
        clock.evaluated()
        answer = backlog.report(setup, study, trial, evaluation)
        if answer == PAUSE:
            paused = evaluation.step
        return answer

    code = pipe.serve(child, turn, judge)
    assert code is not None  # `turn` never ends the serving
    clock.heard(pipe)  # steps read after the process ended (a run of a step or two)
    backlog.drain(setup, trial)
    return code, paused, signalled


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def run_facts(run_dir: Path) -> dict[str, Any]:
    """What a trial's run recorded so far (metrics.jsonl): `steps` (its last step),
    `step_seconds` (the median of its logged step times) and `usd_per_second` (its price, from
    its cost meter; None without [cost]). A damaged line is skipped."""
    steps, times, price = 0, [], None
    try:
        lines = (run_dir / "metrics.jsonl").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for record in step_records(lines):
        steps = max(steps, record["step"])
        if isinstance(record.get("step_seconds"), (int, float)):
            times.append(float(record["step_seconds"]))
        cost = record.get("cost")
        if isinstance(cost, dict):
            # The dollars of the seconds billed besides thrown-away work (which the snapshot
            # prices apart): the training clock and the time outside it (set-up).
            usd, elapsed = cost.get("usd"), cost.get("elapsed_seconds")
            outside = cost.get("overhead_seconds")
            billed = (elapsed or 0.0) + (outside if isinstance(outside, (int, float)) else 0.0)
            if isinstance(usd, (int, float)) and isinstance(elapsed, (int, float)) and billed > 0:
                price = (usd - float(cost.get("wasted_usd") or 0.0)) / billed
    times.sort()
    return {
        "steps": steps,
        "step_seconds": times[len(times) // 2] if times else None,
        "usd_per_second": price,
    }


def resumes_from(setup: TrialSetup, out: Path, number: int) -> str:
    """Where the trial's next session starts, as this machine sees its saves: its newest
    published checkpoint, or step 0 where it saved none. Checkpoints at a URL are not
    listed here: their step is the next session's to find."""
    from thrifty.checkpointing.store.manifest import scan
    from thrifty.checkpointing.store.storage import LocalStorage, is_remote

    location = setup.places.get("checkpoint.location")
    if location is not None and is_remote(location):
        return "it resumes from its newest checkpoint"
    folder = trial_place(location, setup.study, number) if location else str(out / "checkpoints")
    try:
        steps = scan(LocalStorage(folder)).published
    except OSError:
        steps = {}
    if not steps:
        return "it starts again from step 0: it had published no checkpoint yet"
    return f"it resumes from its checkpoint at step {max(steps)}"


def _add_seconds(storage: Any, trial: optuna.Trial, seconds: float) -> None:
    before = storage.get_trial(trial._trial_id).user_attrs.get(SECONDS_KEY, 0.0)
    trial.set_user_attr(SECONDS_KEY, float(before) + seconds)


class SessionClock:
    """When one session's process reported its steps and evaluations, in seconds since it
    started: `first_at` when its first step line was read (`heard_first` step lines read by
    then, the last of them step `first_step`), `last_at` when its last step or evaluation was,
    `last_step` its last step. None before a step was heard."""

    def __init__(self) -> None:
        self.child: TrialSession | None = None
        self.first_at: float | None = None
        self.first_step = self.heard_first = 0
        self.last_at: float | None = None
        self.last_step = 0
        self._lines = 0

    def heard(self, pipe: TrialPipe) -> None:
        """Note the steps `pipe` read since the last call (called between its reads)."""
        if self.child is None or pipe.step is None or pipe.steps == self._lines:
            return
        now = self.child.elapsed
        if self.first_at is None:
            self.first_at, self.first_step, self.heard_first = now, pipe.step, pipe.steps
        self.last_at, self.last_step, self._lines = now, pipe.step, pipe.steps

    def evaluated(self) -> None:
        """An evaluation was read: the run's last report so far."""
        if self.child is not None and self.first_at is not None:
            self.last_at = self.child.elapsed


def session_record(
    clock: SessionClock, seconds: float, step_seconds: float | None
) -> dict[str, Any]:
    """One session as the trial keeps it (SESSIONS_KEY), its `seconds` in three parts:
    `startup_seconds` before its first step (the process's start, imports, the model and data
    built, a checkpoint loaded, less the ordinary time of the steps read with the first: the
    run's median `step_seconds`), then `steps` steps with the evaluations and saves between them
    until its last report, then `tail_seconds` (its last save and its exit). A session that
    reported no step is start-up only."""
    if clock.first_at is None or clock.last_at is None:
        return {"seconds": seconds, "startup_seconds": seconds, "steps": 0, "tail_seconds": 0.0}
    step = step_seconds or 0.0
    startup = max(0.0, clock.first_at - clock.heard_first * step)
    tail = max(0.0, seconds - clock.last_at)
    return {
        "seconds": seconds,
        "startup_seconds": startup,
        "steps": max(1, clock.last_step - clock.first_step + clock.heard_first),
        "tail_seconds": tail,
    }


def _add_session(storage: Any, trial: optuna.Trial, session: dict[str, Any]) -> None:
    before = storage.get_trial(trial._trial_id).user_attrs.get(SESSIONS_KEY)
    trial.set_user_attr(SESSIONS_KEY, [*(before if isinstance(before, list) else []), session])


def _finish(
    setup: TrialSetup,
    study: optuna.Study,
    trial: optuna.Trial,
    out: Path,
    child: TrialSession,
    code: int,
    paused: int | None,
    stopped: bool,
) -> Ended:
    storage, number = setup.storage, trial.number
    if code == EXIT_PREEMPTED and paused is not None:
        trial.set_user_attr(PAUSED_KEY, paused)  # stays RUNNING: not an orphan, not queued
        return Ended(number, "paused", f"at step {paused}, until its bracket catches up")
    if code == EXIT_PREEMPTED or (stopped and code != 0):
        requeue(storage, trial._trial_id)
        return Ended(number, "requeued", f"preempted: {resumes_from(setup, out, number)}")
    if child.ended_by == "hung":
        error = (
            f"hung: it reported no step for {setup.hang_seconds:.0f} s, so the sweep ended its "
            f"worker; its last: {child.error_line()}"
        )
        trial.set_user_attr(ERROR_KEY, error)
        study.tell(trial, state=TrialState.FAIL)
        return Ended(number, "failed", error)
    if child.crashed():  # in native code: it would crash again
        error = f"its worker died of {child.signal_name()}: {child.error_line()}"
        trial.set_user_attr(ERROR_KEY, error)
        study.tell(trial, state=TrialState.FAIL)
        return Ended(number, "failed", error)
    if code < 0:  # a signal from outside the sweep (the OOM killer, an operator): work saved
        name = _signal_name(-code)
        kills = int(storage.get_trial(trial._trial_id).user_attrs.get(KILLS_KEY, 0)) + 1
        trial.set_user_attr(KILLS_KEY, kills)
        if kills < MAX_KILLS:
            requeue(storage, trial._trial_id)
            resumes = resumes_from(setup, out, number)
            return Ended(number, "requeued", f"killed by {name}: {resumes}")
        error = f"killed by {name} {kills} times (out of memory?); its last: {child.error_line()}"
        trial.set_user_attr(ERROR_KEY, error)
        study.tell(trial, state=TrialState.FAIL)
        return Ended(number, "failed", error)
    if code != 0:
        error = failure_reason(out, child, code)
        if IN_USE in error:  # another worker took this trial up first: its run, its outcome
            return Ended(number, "busy", error)
        trial.set_user_attr(ERROR_KEY, error)
        study.tell(trial, state=TrialState.FAIL)
        return Ended(number, "failed", error)
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        error = f"its run left no readable summary.json ({exc})"
        trial.set_user_attr(ERROR_KEY, error)
        study.tell(trial, state=TrialState.FAIL)
        return Ended(number, "failed", error)
    reason = summary.get("stop_reason")
    if reason == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
        why = storage.get_trial(trial._trial_id).user_attrs.get(PRUNED_KEY, {})
        return Ended(number, "pruned", str(why.get("reason", "")))
    if reason == "diverged":
        trial.set_user_attr(ERROR_KEY, "the run diverged")
        study.tell(trial, state=TrialState.FAIL)
        return Ended(number, "failed", "the run diverged")
    value = summary.get("final_val_loss")
    if value is None:
        value = summary.get("train_loss")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        trial.set_user_attr(ERROR_KEY, f"no finite loss to rank it by ({value!r})")
        study.tell(trial, state=TrialState.FAIL)
        return Ended(number, "failed", f"no finite loss ({value!r})")
    study.tell(trial, float(value))
    return Ended(number, "complete", f"{value:.4g}")


def failure_reason(out: Path, child: TrialSession, code: int) -> str:
    """Why the trial's run failed, in the run's own words: "the run diverged" when the summary
    this session wrote says so (a diverged run exits 1), else the first error its log shows
    in this session (an out-of-memory error says so), else its exit code. Never the log's last
    line: on a busy machine that is the run's warning that the machine was busy."""
    try:
        summary_file = out / "summary.json"
        fresh = summary_file.stat().st_mtime >= child.started_wall - 1.0
        summary = json.loads(summary_file.read_text()) if fresh else {}
    except (OSError, ValueError):
        summary = {}
    if isinstance(summary, dict) and summary.get("stop_reason") == "diverged":
        return "the run diverged"
    error = child.error()
    if error:
        return error
    return f"its run exited with code {code} and no error line (its log: {child.log})"
