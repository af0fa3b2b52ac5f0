"""One trial: `thrifty train` for a few steps in the tune's warm worker, and what it measured.

A trial runs `thrifty train TRIAL-CONFIG --out DIR/trials/NAME --steps N --set ...` in the
tune's warm worker (`thrifty.search.engine`: torch imported once, a compiled model's code
compiled once; the config reaches it through a pipe, credentials included, never a file) with
its output in train.log there, redacted, so an out-of-memory error or a compile crash ends that
trial only (a crash that ends the worker costs a new worker). Its figures are the run's own
steady-state ones from summary.json: the Trainer leaves the warm-up steps (and with
torch.compile, the compiling ones) out of them. Peak memory is the CUDA peak allocated the run
reports or, on a CPU, the peak resident set of the worker while the trial ran (VmHWM in
/proc/PID/status, which the worker starts again for each trial, read while it runs).

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
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from thrifty.callbacks.trial_pipe import TrialPipe
from thrifty.config import toml_literal
from thrifty.search.engine import Engine, TrialSession
from thrifty.search.tune.space import Setting
from thrifty.search.tune.trial_record import (
    Candidate,
    Trial,
    failed,
    from_summary,
    killed,
    no_step,
    stopped,
    warmup_steps,
)

# What other modules and tests find here: a trial's record lives in `trial_record`.
__all__ = [
    "Candidate",
    "WorkerTrials",
    "Interrupted",
    "Runner",
    "Trial",
    "cpu_peaks",
    "failed",
    "from_summary",
    "no_step",
    "stopped",
    "warmup_steps",
]

_NO_SPACE = re.compile(r"no space left|disk quota exceeded|\[Errno (28|122)\]", re.IGNORECASE)


class Interrupted(Exception):
    """The tune was asked to stop (SIGTERM, SIGINT): the trial `name` was ended (None: none
    was running). Not a result: the trial runs again when the tune is resumed."""

    def __init__(self, name: str | None) -> None:
        super().__init__(name)
        self.name = name


# (candidate, deadline on the runner's clock) -> the trial
Runner = Callable[[Candidate, float], Trial]


class WorkerTrials:
    """Runs each candidate as `thrifty train` in the tune's warm worker, under
    `out/trials/<name>`, and ends it at the deadline (time.monotonic seconds; its worker with
    it) or when `should_stop()` says the tune was asked to stop (then raises `Interrupted`).
    `close()` ends the worker.

    `config` is the TOML data every trial starts from (credentials included: it reaches the
    trial through a pipe, never a file); a trial's --set items are the values of its setting
    that differ from `base` (the config's own), and its precision's peak from `peaks` (TFLOP/s,
    see `cpu_peaks`) when given. `env` is the worker's environment.
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
        self.engine = Engine(out / "workers", self.env)
        self.slowest_step = 0.0  # seconds: the slowest step of a finished trial, for no_step

    def run_dir(self, candidate: Candidate) -> Path:
        return self.out / "trials" / candidate.name

    def command(self, candidate: Candidate) -> list[str]:
        """The `thrifty train` options after the config."""
        setting = candidate.setting
        steps = max(candidate.steps or self.steps, warmup_steps(setting) + 1)
        command = ["--out", str(self.run_dir(candidate)), "--steps", str(steps)]
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
        child = self.engine.start(
            self.command(candidate), self.toml, run_dir / "train.log", candidate.name
        )
        pipe = child.pipe
        try:
            code, peak_rss = _wait(child, deadline, pipe, self.should_stop)
            if code is not None:
                child.wait()
        except BaseException:
            self.engine.kill_all()  # an error here: no trial outlives the tune
            raise
        if child.write_error is not None:
            raise child.write_error
        if code != 0 and self.should_stop():  # the stop reached it too (a scheduler's SIGTERM
            raise Interrupted(candidate.name)  # to every process of the job): not a result
        trial = self._outcome(candidate, child, code, pipe, peak_rss)
        if trial.ok and trial.step_seconds:
            self.slowest_step = max(self.slowest_step, trial.step_seconds)
        return trial

    def close(self) -> None:
        """End the worker (the tune is over)."""
        self.engine.close()

    def _outcome(
        self,
        candidate: Candidate,
        child: TrialSession,
        code: int | None,
        pipe: TrialPipe,
        peak: float | None,
    ) -> Trial:
        run_dir, wall = self.run_dir(candidate), child.elapsed
        if code is None:
            if pipe.steps == 0 and pipe.ready is not None:
                waited = time.monotonic() - pipe.ready
                return no_step(candidate, wall, run_dir, waited, self.slowest_step)
            return stopped(candidate, wall, run_dir, pipe.steps)
        if code < 0:
            return killed(candidate, wall, run_dir, -code, child.error())
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
        # The run's own count: the pipe drops a line that finds it full.
        done = summary.get("steps")
        return dataclasses.replace(
            trial, steps_completed=done if isinstance(done, int) else pipe.steps
        )


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
    child: TrialSession, deadline: float, pipe: TrialPipe, should_stop: Callable[[], bool]
) -> tuple[int | None, float | None]:
    """(exit code, or None once killed at the deadline; peak RSS in bytes, or None), serving
    the trial's pipe meanwhile. Raises `Interrupted` once it ended the child because the tune
    was asked to stop."""
    peak = None

    def turn() -> bool:
        nonlocal peak
        peak = _peak_rss(child.proc.pid) or peak
        if should_stop():
            child.kill()
            raise Interrupted(child.label)
        if time.monotonic() >= deadline:
            child.kill()
            return True
        return False

    return pipe.serve(child, turn), peak


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
