"""One trial: `thrifty train` for a few steps in its own process, and what it measured.

A trial runs `thrifty train TRIAL-CONFIG --out DIR/trials/NAME --steps N --set ...` (through
`thrifty.tune_trial`, which receives the config from the tune, credentials included,
without a file) with its output in train.log there, redacted, so an out-of-memory error or a
compile crash ends that trial only. Its figures are the run's own steady-state ones from
summary.json: the Trainer leaves the warm-up steps (and with torch.compile, the compiling ones)
out of them. Peak memory is the CUDA peak allocated the run reports or, on a CPU, the peak
resident set of the trial's main process (VmHWM in /proc/PID/status, read while it runs).

A trial the budget ends is "stopped"; one that was ready to train (torch and the Trainer
imported: a budget too small ends a trial before) and completed no step by then is "hung",
unless it compiles: torch.compile's first step is its compiling, which an autotuning mode
spends minutes on, so that trial was stopped while compiling. A trial ends with the tune: a
signal to the tune ends it (`Interrupted`), and so does the tune's death (the tether of
`thrifty.children`).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.children import Child, Children, error_in
from thrifty.config import toml_literal
from thrifty.tuning.space import Setting

POLL_SECONDS = 0.1
# With torch.compile the Trainer leaves the first 3 steps out of its figures (1 without).
COMPILE_WARMUP_STEPS = 3
TRIAL_MODULE = "thrifty.tune_trial"
READY, STEP = b"+", b"."  # what a trial's process reports: ready to train, a step completed
# A trial ready to train that completes no step is hung once it has waited HUNG_SECONDS and
# HUNG_STEPS times the slowest step the tune has measured: on a loaded machine whose steps take
# seconds, a first step still running when the budget ends it is not a hang.
HUNG_SECONDS = 30.0
HUNG_STEPS = 5
_OOM = re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE)
_NO_SPACE = re.compile(r"no space left|disk quota exceeded|\[Errno (28|122)\]", re.IGNORECASE)


class Interrupted(Exception):
    """The tune was asked to stop (SIGTERM, SIGINT): the trial `name` was ended (None: none
    was running). Not a result: the trial runs again when the tune is resumed."""

    def __init__(self, name: str | None) -> None:
        super().__init__(name)
        self.name = name


@dataclass(frozen=True, slots=True)
class Candidate:
    """A setting to try: `name` is its folder under trials/, `stage` the lever it changes;
    `steps` the optimizer steps it runs, when not the tune's --steps (a paired comparison's
    runs, `thrifty.tuning.compare`)."""

    name: str
    stage: str
    setting: Setting
    steps: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """What one trial measured, or how it failed.

    `status`: ok, failed, or stopped (by the budget). `failure`: oom, bad_input (the run
    refused its config), crash, killed (by a signal not from the tune), hung (no step
    completed), budget, or compiling (the budget ended it in its first, compiling, step).
    `steps_completed`: the optimizer steps it completed. Rates are per second over the
    steady-state steps;
    `peak_memory_bytes` comes from `peak_memory_source`: "cuda" (peak allocated) or "rss"
    (the process's peak resident set). `last_losses`: the training loss of the last steps
    (what the FP8 parity check compares). `micro_batch`, `num_workers` and `precision` are the
    values the run used (an "auto" setting resolved). With micro "auto", `next_micro` is the
    size the run found too large, and on a GPU `checkpointing_fits` the largest micro-batch
    each heavier checkpointing policy would fit, predicted from the run's measured memory.
    """

    name: str
    stage: str
    setting: Setting
    status: str
    wall_seconds: float
    run_dir: str
    exit_code: int | None = None
    error: str | None = None
    failure: str | None = None
    tokens_per_second: float | None = None
    samples_per_second: float | None = None
    step_seconds: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None
    peak_memory_source: str | None = None
    micro_batch: int | None = None
    accumulation_steps: int | None = None
    num_workers: int | None = None
    precision: str | None = None
    steps_completed: int | None = None
    last_losses: list[float] | None = None  # the training loss of its last steps, in order
    next_micro: int | None = None  # the size "auto" found too large, the next after its own
    checkpointing_fits: dict[str, int] | None = None  # a heavier policy's micro-batch, predicted

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        """A trial as `to_dict` wrote it (tune.json); keys it does not know are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["setting"] = Setting.from_values(data["setting"])
        return cls(**values)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def resolved(self) -> Setting:
        """The setting with what the run chose for its "auto" values."""
        s = self.setting
        return s.with_(
            precision=self.precision or s.precision,
            micro=self.micro_batch or s.micro,
            num_workers=s.num_workers if self.num_workers is None else self.num_workers,
        )

    @property
    def out_of_memory_at_one(self) -> bool:
        """It ran out of memory at micro-batch 1, the smallest there is: the Trainer halves
        the micro-batch after an out-of-memory error and ends with exit code 2 only at 1."""
        at_one = self.exit_code == 2 or self.setting.micro in ("auto", 1)
        return self.failure == "oom" and at_one

    def rate(self, unit: str) -> float | None:
        """Tokens or samples per second (`unit` "tokens" or "samples")."""
        return self.tokens_per_second if unit == "tokens" else self.samples_per_second

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["setting"] = self.setting.config_values()
        return data


def warmup_steps(setting: Setting) -> int:
    """The first steps a run leaves out of its figures (torch.compile compiles in them)."""
    return COMPILE_WARMUP_STEPS if setting.compile != "off" else 1


def classify(exit_code: int, error: str) -> str:
    """Why a run failed, from its exit code and first error line."""
    if _OOM.search(error):
        return "oom"
    return "bad_input" if exit_code == 2 else "crash"


def from_summary(
    candidate: Candidate,
    summary: Mapping[str, Any],
    wall_seconds: float,
    run_dir: Path,
    peak_rss: float | None,
) -> Trial:
    """A finished trial from its summary.json; one that measured no step counts as failed."""
    base = _base(candidate, wall_seconds, run_dir)
    step = summary.get("step_seconds")
    if not (isinstance(step, int | float) and step > 0):
        return Trial(
            **base,
            status="failed",
            exit_code=0,
            failure="crash",
            error="it measured no step after the warm-up: give more --steps",
        )
    cuda_peak = summary.get("peak_memory_bytes")
    losses = last_losses(run_dir)
    micro = summary.get("micro_batch") or None  # older runs report none: the size given
    if micro is None and isinstance(candidate.setting.micro, int):
        micro = candidate.setting.micro
    return Trial(
        **base,
        status="ok",
        last_losses=losses,
        exit_code=0,
        tokens_per_second=summary.get("tokens_per_second"),
        samples_per_second=summary.get("samples_per_second"),
        step_seconds=float(step),
        mfu=summary.get("mfu"),
        peak_memory_bytes=cuda_peak if cuda_peak is not None else peak_rss,
        peak_memory_source="cuda" if cuda_peak is not None else ("rss" if peak_rss else None),
        micro_batch=micro,
        accumulation_steps=summary.get("accumulation_steps"),
        num_workers=summary.get("num_workers"),
        precision=summary.get("precision"),
        next_micro=_too_large(summary.get("micro_batch_search")),
        checkpointing_fits=summary.get("activation_checkpointing_fits") or None,
    )


def _too_large(search: Any) -> int | None:
    """The size a micro-batch search found not to fit (None: it found none)."""
    tried = search.get("tried") if isinstance(search, Mapping) else None
    return next((t["micro"] for t in tried or () if not t.get("fits")), None)


def failed(
    candidate: Candidate, wall_seconds: float, run_dir: Path, exit_code: int, error: str
) -> Trial:
    return Trial(
        **_base(candidate, wall_seconds, run_dir),
        status="failed",
        exit_code=exit_code,
        error=error,
        failure=classify(exit_code, error),
    )


def last_losses(run_dir: Path, count: int = 5) -> list[float] | None:
    """The training loss of the run's last `count` steps, from its metrics.jsonl (None
    without one)."""
    from thrifty.records.directory import step_records

    try:
        with open(run_dir / "metrics.jsonl", "rb") as f:
            losses = [r["loss"] for r in step_records(f) if isinstance(r.get("loss"), float)]
    except OSError:
        return None
    return losses[-count:] or None


def stopped(
    candidate: Candidate, wall_seconds: float, run_dir: Path, steps: int | None = None
) -> Trial:
    """A trial the budget ended before it finished."""
    return Trial(
        **_base(candidate, wall_seconds, run_dir),
        status="stopped",
        failure="budget",
        error=f"stopped by the budget after {wall_seconds:.0f} s",
        steps_completed=steps,
    )


def no_step(
    candidate: Candidate,
    wall_seconds: float,
    run_dir: Path,
    ready: float,
    slowest_step: float = 0.0,
) -> Trial:
    """A trial that was ready to train `ready` seconds before the budget ended it and
    completed no step in that time: stopped while compiling where it compiles (its first
    step is torch.compile's compiling), hung once it waited longer than a step can take
    (HUNG_SECONDS, and HUNG_STEPS times `slowest_step`, the slowest step in seconds the tune
    has measured), else stopped in its first step."""
    mode = candidate.setting.compile
    if mode != "off":
        status, failure = "stopped", "compiling"
        error = f"the budget ended it while compiling: {mode} mode had completed no step"
    elif ready < max(HUNG_SECONDS, HUNG_STEPS * slowest_step):
        measured = f"; the slowest step measured took {slowest_step:.1f} s" if slowest_step else ""
        return dataclasses.replace(
            stopped(candidate, wall_seconds, run_dir, 0),
            error=f"stopped by the budget in its first step, {ready:.0f} s after it was ready"
            f"{measured}",
        )
    else:
        status, failure, error = "failed", "hung", "hung: no step completed in"
    return Trial(
        **_base(candidate, wall_seconds, run_dir),
        status=status,
        failure=failure,
        error=f"{error} {ready:.0f} s after it started",
        steps_completed=0,
    )


def killed(
    candidate: Candidate, wall_seconds: float, run_dir: Path, signum: int, error: str | None
) -> Trial:
    """A trial ended by a signal the tune did not send (the out-of-memory killer's SIGKILL)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    why = f"killed by {name}"
    if signum == signal.SIGKILL:
        why += " (not by the tune: often the system's out-of-memory killer)"
    if error is not None:
        why += f"; its log shows: {error}"
    return Trial(
        **_base(candidate, wall_seconds, run_dir),
        status="failed",
        exit_code=-signum,
        error=why,
        failure="killed",
    )


def _base(candidate: Candidate, wall_seconds: float, run_dir: Path) -> dict[str, Any]:
    return {
        "name": candidate.name,
        "stage": candidate.stage,
        "setting": candidate.setting,
        "wall_seconds": wall_seconds,
        "run_dir": str(run_dir),
    }


# (candidate, deadline on the runner's clock) -> the trial
Runner = Callable[[Candidate, float], Trial]


class ChildTrials:
    """Runs each candidate as `thrifty train` in its own process, under `out/trials/<name>`,
    and ends it at the deadline (time.monotonic seconds) or when `should_stop()` says the tune
    was asked to stop (then raises `Interrupted`).

    `config` is the TOML data every trial starts from (credentials included: it reaches the
    trial through a pipe, never a file); a trial's --set items are the values of its setting
    that differ from `base` (the config's own), and its precision's peak from `peaks` (TFLOP/s,
    see `cpu_peaks`) when given. `env` is the children's environment.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        out: Path,
        steps: int,
        base: Setting,
        env: Mapping[str, str],
        peaks: Mapping[str, float] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        from thrifty.config import dump_toml

        self.toml = dump_toml(dict(config)).encode()
        self.out, self.steps, self.base = out, steps, base
        self.env = dict(env)
        self.peaks = dict(peaks or {})
        self.should_stop = should_stop
        self.children = Children()
        self.slowest_step = 0.0  # seconds: the slowest step of a finished trial, for no_step

    def run_dir(self, candidate: Candidate) -> Path:
        return self.out / "trials" / candidate.name

    def command(self, candidate: Candidate) -> list[str]:
        """The `thrifty train` arguments after the config."""
        setting = candidate.setting
        steps = max(candidate.steps or self.steps, warmup_steps(setting) + 1)
        command = ["train", "--out", str(self.run_dir(candidate)), "--steps", str(steps)]
        base = self.base.config_values()
        for key, value in setting.config_values().items():
            if value != base[key]:
                command += ["--set", f"{key}={toml_literal(value)}"]
        if setting.precision in self.peaks:
            command += ["--set", f"measure.peak_tflops={self.peaks[setting.precision]!r}"]
        return command

    def __call__(self, candidate: Candidate, deadline: float) -> Trial:
        run_dir = self.run_dir(candidate)
        if run_dir.exists():  # the unfinished trial of a stopped tune: this one replaces it
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        child, steps = self._start(candidate, run_dir)
        try:
            code, peak_rss = _wait(child, deadline, steps, self.should_stop)
        finally:
            steps.close()
            self.children.kill_all()  # an error here: no trial outlives the tune
        if child.write_error is not None:
            raise child.write_error
        if code != 0 and self.should_stop():  # the stop reached it too (a scheduler's SIGTERM
            raise Interrupted(candidate.name)  # to every process of the job): not a result
        trial = self._outcome(candidate, child, code, steps, peak_rss)
        if trial.ok and trial.step_seconds:
            self.slowest_step = max(self.slowest_step, trial.step_seconds)
        return trial

    def _start(self, candidate: Candidate, run_dir: Path) -> tuple[Child, StepCount]:
        steps = StepCount()
        command = [sys.executable, "-m", TRIAL_MODULE, str(steps.child_fd)]
        log = run_dir / "train.log"
        try:
            child = self.children.keep(
                Child(
                    [*command, *self.command(candidate)],
                    self.env,
                    log,
                    candidate.name,
                    tether=self.toml,
                    pass_fds=(steps.child_fd,),
                    redact=True,
                )
            )
        except BaseException:
            steps.close()
            raise
        finally:
            steps.started()
        return child, steps

    def _outcome(
        self,
        candidate: Candidate,
        child: Child,
        code: int | None,
        steps: StepCount,
        peak: float | None,
    ) -> Trial:
        run_dir, wall = self.run_dir(candidate), child.elapsed
        if code is None:
            if steps.count == 0 and steps.ready is not None:
                waited = time.monotonic() - steps.ready
                return no_step(candidate, wall, run_dir, waited, self.slowest_step)
            return stopped(candidate, wall, run_dir, steps.count)
        if code < 0:
            return killed(candidate, wall, run_dir, -code, error_in(child.log))
        if code != 0:
            error = child.error_line()
            if _NO_SPACE.search(error):  # every trial would fail alike: the tune ends here
                raise OSError(errno.ENOSPC, f"trial {candidate.name}: {error}")
            return failed(candidate, wall, run_dir, code, error)
        log = child.log
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            error = f"it left no readable summary.json ({exc}); its output is in {log}"
            return failed(candidate, wall, run_dir, 0, error)
        trial = from_summary(candidate, summary, wall, run_dir, peak)
        # The run's own count: the pipe also hears the optimizer steps of the micro-batch
        # search's probes, which take no step's time.
        done = summary.get("steps")
        return dataclasses.replace(
            trial, steps_completed=done if isinstance(done, int) else steps.count
        )


class StepCount:
    """The pipe a trial's process reports on (`thrifty.tune_trial`): "+" once it is
    ready to train (torch and the Trainer imported), then "." per optimizer step. `count`:
    the steps read so far; `ready`: when it was ready (time.monotonic seconds), or None."""

    def __init__(self) -> None:
        self.fd, self.child_fd = os.pipe()
        os.set_blocking(self.fd, False)
        self.count = 0
        self.ready: float | None = None

    def started(self) -> None:
        """The child holds its end now: this process's copy would keep the pipe open."""
        if self.child_fd >= 0:
            os.close(self.child_fd)
            self.child_fd = -1

    def read(self) -> None:
        try:
            while chunk := os.read(self.fd, 1 << 16):
                self.count += chunk.count(STEP)
                if self.ready is None and READY in chunk:
                    self.ready = time.monotonic()
        except BlockingIOError:
            pass

    def close(self) -> None:
        self.started()
        if self.fd >= 0:
            self.read()
            os.close(self.fd)
            self.fd = -1


def cpu_peaks(precisions: Iterable[str], given: str) -> dict[str, float]:
    """The CPU's peak in TFLOP/s for each precision, measured once here for every trial: a
    trial measuring its own on a busy machine would make MFUs incomparable. `given` is the
    config's precision mode; "auto" gets the peak of the precision it resolves to."""
    import torch

    from thrifty.levers.precision import resolve_precision
    from thrifty.measure.peak import measure_cpu_peak

    auto = resolve_precision("auto", torch.device("cpu")).name
    names = {*precisions, auto if given == "auto" else given}
    peaks = {name: measure_cpu_peak(name).tflops for name in sorted(names)}
    if given == "auto":
        peaks["auto"] = peaks[auto]
    return peaks


def _wait(
    child: Child, deadline: float, steps: StepCount, should_stop: Callable[[], bool]
) -> tuple[int | None, float | None]:
    """(exit code, or None once killed at the deadline; peak RSS in bytes, or None). Raises
    `Interrupted` once it ended the child because the tune was asked to stop."""
    peak = None
    while True:
        code = child.poll()
        peak = _peak_rss(child.proc.pid) or peak
        steps.read()
        if code is not None:
            child.wait()
            return code, peak
        if should_stop():
            child.kill()
            raise Interrupted(child.label)
        if time.monotonic() >= deadline:
            child.kill()
            return None, peak
        time.sleep(POLL_SECONDS)


def _peak_rss(pid: int) -> float | None:
    """The process's peak resident set in bytes (Linux VmHWM), None where unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError, IndexError):
        return None
    return None
