"""One trial of a sweep: `thrifty train` in its own process, with the pruner's say after each
evaluation.

The trial's run is `thrifty train CONFIG --out DIR/trials/NNNN --set KEY=VALUE ...` started
through `thrifty.tune_trial`, which receives the config (credentials included) on its stdin,
never from a file, and ties the process's life to the sweep's (`thrifty.children`): if the
sweep is SIGKILLed, so is the trial, and its last checkpoint is what the next sweep resumes.
The run reports each evaluation on a pipe (`thrifty.run.judge`); the sweep reports it to
Optuna and answers whether the run goes on.

How a trial ends, for Optuna:
- the run finished (exit 0): COMPLETE with its last validation loss (its training loss without
  validation data), or PRUNED when the pruner stopped it; a run that diverged is FAILED;
- the run was preempted (exit 75: a SIGTERM, a cloud notice; the sweep passes its own stop
  signals on) or killed while the sweep stopped: back in the queue (WAITING), resumed from its
  own checkpoint by the next worker to ask;
- anything else (the config refused, a crash): FAILED, with the run's first error line.
A worker whose lease lapsed (the study's storage unanswered for a lease's length) and whose
trial another worker then took up stops its run (SIGTERM: it saves) and tells Optuna nothing:
the trial is the other worker's. Each renewal checks the lease is still this worker's first,
so the two run it together for a renewal's interval at most; a renewal that fails is said
once, and so is the renewal that works again.

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
import os
import re
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from thrifty.children import Child, Children, error_in
from thrifty.config import dump_toml, toml_literal
from thrifty.console import say
from thrifty.records.directory import step_records
from thrifty.records.stop_signals import EXIT_PREEMPTED
from thrifty.run.judge import ENV as JUDGE_ENV
from thrifty.run.judge import GO, PAUSE, PRUNE
from thrifty.sweeps import hyperband, pruning
from thrifty.sweeps.study import LEASE_KEY, PAUSED_KEY, lease, storage_trouble

TRIAL_MODULE = "thrifty.tune_trial"
SECONDS_KEY = "thrifty.seconds"  # wall seconds of the trial's processes, all sessions summed
RUN_DIR_KEY = "thrifty.run_dir"
PRUNED_KEY = "thrifty.pruned"  # why it was pruned: step, value, reason, forecast, bound
ERROR_KEY = "thrifty.error"
FACTS_KEY = "thrifty.run"  # steps, step time and price, from the run's own records
POLL_SECONDS = 0.2
IN_USE = " is in use by "  # the run lock's refusal (thrifty.run.lock)
KILLS_KEY = "thrifty.kills"  # sessions of the trial a signal ended (the OOM killer's SIGKILL)
MAX_KILLS = 3  # then it fails: a trial killed each time it runs would be resumed forever
PLACE_KEYS = ("checkpoint.location", "checkpoint.local_dir")  # each trial gets its own


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


class Leases:
    """The leases this process holds (see `thrifty.sweeps.study`), renewed by one thread."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[float, int]] = {}  # trial id -> (session began, number)
        self.lost: set[int] = set()  # trial ids another worker took up: their runs stop
        self.failing: set[int] = set()  # trial ids whose last renewal failed
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()

    def hold(self, storage: Any, trial_id: int, number: int) -> None:
        since = time.time()
        storage.set_trial_user_attr(trial_id, LEASE_KEY, lease(since))
        with self.lock:
            self.held[trial_id] = (since, number)
            if self.thread is None:
                self.thread = threading.Thread(target=self._renew, args=(storage,), daemon=True)
                self.thread.start()

    def holds(self, trial_id: int) -> bool:
        """Whether the trial is still this worker's: no other worker took it up."""
        with self.lock:
            return trial_id not in self.lost

    def release(self, trial_id: int) -> bool:
        """Stop renewing; whether the lease was this worker's to the end."""
        with self.lock:
            self.held.pop(trial_id, None)
            self.failing.discard(trial_id)
            kept = trial_id not in self.lost
            self.lost.discard(trial_id)
            return kept

    def _renew(self, storage: Any) -> None:
        from thrifty.sweeps.study import LEASE_SECONDS

        while not self.stop.wait(LEASE_SECONDS / 6):
            with self.lock:
                held = list(self.held.items())
            for trial_id, (since, number) in held:
                self.renew(storage, trial_id, since, number)

    def renew(self, storage: Any, trial_id: int, since: float, number: int) -> None:
        """Renew one lease, once it is checked to be still this worker's (a trial put back in
        the queue, or leased by another, is lost: its run stops)."""
        from thrifty.sweeps.study import LEASE_SECONDS

        try:
            frozen = storage.get_trial(trial_id)
            mine = _is_mine(frozen.user_attrs.get(LEASE_KEY), since)
            if frozen.state != TrialState.RUNNING or not mine:
                with self.lock:
                    lost = self.held.pop(trial_id, None) is not None  # not released meanwhile
                    if lost:
                        self.lost.add(trial_id)
                if lost:
                    say("sweep", f"trial {number}: another worker took it up after its lease "
                        "lapsed: its run here stops")  # fmt: skip
                return
            storage.set_trial_user_attr(trial_id, LEASE_KEY, lease(since))
        except Exception as exc:  # a storage blip: said once, the next round retries
            with self.lock:
                first = trial_id in self.held and trial_id not in self.failing
                self.failing.add(trial_id)
            if first:
                say("sweep", f"trial {number}: its lease could not be renewed "
                    f"({type(exc).__name__}): the study's storage is not answering; "
                    f"{LEASE_SECONDS:.0f} s after the last renewal another worker may take "
                    "the trial up")  # fmt: skip
            return
        with self.lock:
            recovered = trial_id in self.failing
            self.failing.discard(trial_id)
        if recovered:
            say("sweep", f"trial {number}: its lease renewed again")


def _is_mine(held: Any, since: float) -> bool:
    """Whether `held` is the lease this process wrote for the session that began at `since`."""
    if not isinstance(held, dict):
        return False
    mine = lease(since)
    return all(held.get(key) == mine[key] for key in ("host", "pid", "started", "since"))


@dataclass(frozen=True, slots=True)
class Ended:
    """How one session of a trial ended: `state` is complete, pruned, failed or requeued."""

    number: int
    state: str
    detail: str = ""


def run_dir(out: Path, number: int) -> Path:
    return out / "trials" / f"{number:04d}"


def command(setup: TrialSetup, params: dict[str, Any], out: Path, progress_fd: int) -> list[str]:
    sets = [f"{key}={toml_literal(value)}" for key, value in params.items()]
    args = [sys.executable, "-m", TRIAL_MODULE, str(progress_fd), "train", "--out", str(out)]
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
    children: Children,
    stopping: threading.Event,
    device: dict[str, str] | None = None,
) -> Ended:
    """Run (or resume) `trial` to its end or to the sweep's stop; tell Optuna how it ended.
    `device`: the environment that gives the trial its GPU (CUDA_VISIBLE_DEVICES)."""
    storage, trial_id = setup.storage, trial._trial_id
    out = run_dir(setup.out, trial.number)
    out.mkdir(parents=True, exist_ok=True)
    trial.set_user_attr(RUN_DIR_KEY, str(out))
    setup.leases.hold(storage, trial_id, trial.number)
    child_read, parent_write = os.pipe()  # the sweep's answers
    parent_read, child_write = os.pipe()  # the run's reports
    progress = os.open(os.devnull, os.O_WRONLY)
    child = None
    try:
        env = {**setup.env, **(device or {}), JUDGE_ENV: f"{child_read},{child_write}"}
        child = children.keep(
            Child(
                command(setup, params, out, progress),
                env,
                out / "train.log",
                f"trial {trial.number}",
                tether=trial_config(setup, trial.number),
                pass_fds=(progress, child_read, child_write),
                redact=True,
                append=True,  # each session's lines after the last's: a resume's story kept
            )
        )
        for fd in (child_read, child_write, progress):
            os.close(fd)
        code, paused, stopped = _serve(
            setup, study, trial, child, parent_read, parent_write, stopping
        )
    finally:
        for fd in (parent_read, parent_write):
            os.close(fd)
        if child is None:
            for fd in (child_read, child_write, progress):
                os.close(fd)
        kept = setup.leases.release(trial_id)
    if not kept:  # another worker's now: its seconds, its facts, its outcome
        return Ended(
            trial.number,
            "taken",
            f"another worker took it up after this one's lease lapsed; this run's saves stay in {out}",
        )
    _add_seconds(storage, trial, child.elapsed)
    trial.set_user_attr(FACTS_KEY, run_facts(out))
    return _finish(setup, study, trial, out, child, code, paused, stopped)


def _serve(
    setup: TrialSetup,
    study: optuna.Study,
    trial: optuna.Trial,
    child: Child,
    reports: int,
    answers: int,
    stopping: threading.Event,
) -> tuple[int, int | None, bool]:
    """Answer the run's reports until it ends; pass the sweep's stop on as SIGTERM (the run
    saves and exits 75). Returns its exit code, the step it was paused at (its Hyperband
    bracket behind) or None, and whether the sweep was stopping."""
    buffer = b""
    signalled = False
    paused: int | None = None
    backlog = Backlog(trial.number)
    while True:
        code = child.poll()
        if code is not None:
            child.wait()
            backlog.drain(setup, trial)
            return code, paused, signalled
        if (stopping.is_set() or not setup.leases.holds(trial._trial_id)) and not signalled:
            signalled = True
            try:
                os.killpg(child.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        ready, _, _ = select.select([reports], [], [], POLL_SECONDS)
        if not ready:
            continue
        chunk = os.read(reports, 4096)
        if not chunk:  # the run closed its end: wait for its exit
            child.wait()
            backlog.drain(setup, trial)
            return child.proc.returncode, paused, signalled
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            report = json.loads(line)
            backlog.reports.append(report)
            answer = backlog.report(setup, study, trial)
            if answer == PAUSE:
                paused = int(report["step"])
            try:
                os.write(answers, (answer + "\n").encode())
            except OSError:
                pass


class Backlog:
    """Trial `number`'s evaluations the study's storage has not taken yet, in the order the
    run reported them. While the storage does not answer (a database down for a minute) the
    run goes on unjudged and its evaluations wait here; once it answers, they are reported in
    order, each once, and the newest is judged. One line says the storage is unreachable, one
    how long it was."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.reports: list[dict[str, Any]] = []
        self.down_since: float | None = None  # monotonic seconds

    def report(self, setup: TrialSetup, study: optuna.Study, trial: optuna.Trial) -> str:
        """Report what waits, oldest first, and judge the newest: the pruner's answer, or GO
        while the storage does not answer."""
        try:
            while len(self.reports) > 1:
                _record(setup, trial, self.reports[0])
                self.reports.pop(0)
            answer = _judge(setup, study, trial, self.reports[0]) if self.reports else GO
            self.reports.clear()
        except Exception as exc:
            self._down(exc)
            return GO
        self._back()
        return answer

    def drain(self, setup: TrialSetup, trial: optuna.Trial) -> None:
        """At the run's end: report what waits, trying again while the storage does not
        answer (for as long as the sweep's workers wait for it), so that no evaluation is
        lost before the trial's outcome is told. Raises the storage's error past that."""
        waits = list(DRAIN_RETRIES)
        while True:
            try:
                for report in list(self.reports):
                    _record(setup, trial, report)
                    self.reports.pop(0)
            except Exception as exc:
                self._down(exc)
                if not waits:
                    raise
                time.sleep(waits.pop(0))  # the trial has ended: nothing to stop meanwhile
                continue
            self._back()
            return

    def _down(self, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            say("sweep", f"trial {self.number}: {storage_trouble(exc)}: its evaluations are "
                "kept and reported once it answers; the trial goes on unjudged meanwhile")  # fmt: skip

    def _back(self) -> None:
        if self.down_since is None:
            return
        seconds = time.monotonic() - self.down_since
        self.down_since = None
        say("sweep", f"trial {self.number}: the study's database was unreachable for "
            f"{seconds:.0f} s; the evaluations kept meanwhile are reported")  # fmt: skip


DRAIN_RETRIES = (2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0)  # seconds: 130 s in all


def _record(setup: TrialSetup, trial: optuna.Trial, report: dict[str, Any]) -> None:
    """Report one evaluation to Optuna without asking its pruner (one the storage took
    late: the pruner judges the newest), never a step twice."""
    step, value = int(report["step"]), float(report["value"])
    if not math.isfinite(value):
        return
    if step not in setup.storage.get_trial(trial._trial_id).intermediate_values:
        trial.report(value, step)


def _judge(setup: TrialSetup, study: optuna.Study, trial: optuna.Trial, report: dict) -> str:
    """Report one evaluation to Optuna and ask its pruner. A step reported before (a resumed
    run evaluating again what it had evaluated before its last checkpoint) is not reported
    twice; the pruner decides from the study alone, so it answers as it did."""
    step, value, end = int(report["step"]), float(report["value"]), report.get("end")
    frozen = setup.storage.get_trial(trial._trial_id)
    if isinstance(end, int) and frozen.user_attrs.get(pruning.ForecastPruner.END_KEY) != end:
        trial.set_user_attr(pruning.ForecastPruner.END_KEY, end)
    if not math.isfinite(value):
        return GO  # the run's guard judges a non-finite loss
    if step not in frozen.intermediate_values:
        trial.report(value, step)
    if setup.brackets is not None:
        verdict = bracket_verdict(setup, study, trial.number, step)
        if verdict.action == hyperband.PRUNE:
            _record_pruned(trial, step, value, verdict)
            return PRUNE
        return PAUSE if verdict.action == hyperband.WAIT else GO
    if not trial.should_prune():
        return GO
    frozen = setup.storage.get_trial(trial._trial_id)
    trial.set_user_attr(PRUNED_KEY, pruning.explain(setup.pruner_name, setup.pruner, study, frozen))
    return PRUNE


def bracket_verdict(
    setup: TrialSetup, study: optuna.Study, number: int, step: int
) -> hyperband.Verdict:
    """The Hyperband verdict for trial `number` at `step`, from the study's reports."""
    assert setup.brackets is not None
    trials = study.get_trials(deepcopy=False)
    curves = {t.number: t.intermediate_values for t in trials}
    failed = {t.number for t in trials if t.state == TrialState.FAIL}
    limit = study.user_attrs.get(HYPERBAND_LIMIT_KEY, setup.trials)
    return hyperband.decide(number, step, curves, failed, setup.brackets, limit)


HYPERBAND_LIMIT_KEY = "thrifty.hyperband_limit"  # the trials the budget let start, once it ended


def _record_pruned(trial: Any, step: int, value: float | None, verdict: hyperband.Verdict) -> None:
    why = {"step": step, "value": value, "pruner": "hyperband", "reason": verdict.reason}
    if verdict.bound is not None:
        why["bound"] = verdict.bound
    trial.set_user_attr(PRUNED_KEY, why)


def release_paused(setup: TrialSetup, study: optuna.Study) -> list[tuple[int, str]]:
    """Decide the paused trials whose bracket has caught up: back in the queue (WAITING) to
    go on, or PRUNED. Returns (number, "resumes" | "pruned") for each decided."""
    if setup.brackets is None:
        return []
    decided = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        step = frozen.user_attrs.get(PAUSED_KEY)
        if not isinstance(step, int):
            continue
        verdict = bracket_verdict(setup, study, frozen.number, step)
        if verdict.action == hyperband.WAIT:
            continue
        handle = optuna.Trial(study, frozen._trial_id)
        handle.set_user_attr(PAUSED_KEY, None)
        if verdict.action == hyperband.PRUNE:
            _record_pruned(handle, step, frozen.intermediate_values.get(step), verdict)
            study.tell(frozen.number, state=TrialState.PRUNED)
            decided.append((frozen.number, "pruned"))
        else:
            requeue(setup.storage, frozen._trial_id)
            decided.append((frozen.number, "resumes"))
    return decided


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def requeue(storage: Any, trial_id: int) -> None:
    """Back in the queue (WAITING) to resume from its checkpoint, its lease dropped first: a
    worker that takes it up again is not seen, before it writes its own lease, as running an
    orphan under the old one (which would hand it to a second worker, its seconds counted
    twice)."""
    storage.set_trial_user_attr(trial_id, LEASE_KEY, None)
    storage.set_trial_state_values(trial_id, TrialState.WAITING)


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
    from thrifty.checkpoint.manifest import scan
    from thrifty.checkpoint.storage import LocalStorage, is_remote

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


def _finish(
    setup: TrialSetup,
    study: optuna.Study,
    trial: optuna.Trial,
    out: Path,
    child: Child,
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


def failure_reason(out: Path, child: Child, code: int) -> str:
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
    error = error_in(child.log, child.session_start)
    if error:
        return error
    return f"its run exited with code {code} and no error line (its log: {child.log})"


def wait_for_children(children: Children, seconds: float) -> None:
    """Give the trials `seconds` to save and exit, then kill what is left."""
    deadline = time.monotonic() + seconds
    for child in children.started:
        left = max(0.0, deadline - time.monotonic())
        try:
            child.wait(left)
        except Exception:
            pass
    children.kill_all()
