"""One trial: `thrifty train` for a few steps in its own process, and what it measured.

A trial runs `python -m thrifty train TRIAL.toml --out DIR/trials/NAME --steps N --set ...`
with its output in train.log there, so an out-of-memory error or a compile crash ends that
trial only. Its figures are the run's own steady-state ones from summary.json: the Trainer
leaves the warm-up steps (and with torch.compile, the compiling ones) out of them. Peak
memory is the CUDA peak allocated the run reports or, on a CPU, the peak resident set of the
trial's main process (VmHWM in /proc/PID/status, read while it runs).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.commands.children import Child, Children
from thrifty.tuning.space import Setting

POLL_SECONDS = 0.1
# With torch.compile the Trainer leaves the first 3 steps out of its figures (1 without).
COMPILE_WARMUP_STEPS = 3
_OOM = re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A setting to try: `name` is its folder under trials/, `stage` the lever it changes."""

    name: str
    stage: str
    setting: Setting


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """What one trial measured, or how it failed.

    `status`: ok, failed, or stopped (by the budget). `failure`: oom, bad_input (the run
    refused its config), crash, or budget. Rates are per second over the steady-state steps;
    `peak_memory_bytes` comes from `peak_memory_source`: "cuda" (peak allocated) or "rss"
    (the process's peak resident set). `micro_batch`, `num_workers` and `precision` are the
    values the run used (an "auto" setting resolved).
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
    micro = summary.get("micro_batch") or None  # older runs report none: the size given
    if micro is None and isinstance(candidate.setting.micro, int):
        micro = candidate.setting.micro
    return Trial(
        **base,
        status="ok",
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
    )


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


def stopped(candidate: Candidate, wall_seconds: float, run_dir: Path) -> Trial:
    """A trial the budget ended before it finished."""
    return Trial(
        **_base(candidate, wall_seconds, run_dir),
        status="stopped",
        failure="budget",
        error=f"stopped by the budget after {wall_seconds:.0f} s",
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
    """Runs each candidate as `python -m thrifty train` in its own process, under
    `out/trials/<name>`, and ends it at the deadline (time.monotonic seconds).

    `config` is the TOML every trial starts from; a trial's --set items are the values of its
    setting that differ from `base` (the config's own), and its precision's peak from `peaks`
    (TFLOP/s, see `cpu_peaks`) when given. `env` is the children's environment.
    """

    def __init__(
        self,
        config: Path,
        out: Path,
        steps: int,
        base: Setting,
        env: Mapping[str, str],
        peaks: Mapping[str, float] | None = None,
    ) -> None:
        self.config, self.out, self.steps, self.base = config, out, steps, base
        self.env = dict(env)
        self.peaks = dict(peaks or {})
        self.children = Children()

    def run_dir(self, candidate: Candidate) -> Path:
        return self.out / "trials" / candidate.name

    def command(self, candidate: Candidate) -> list[str]:
        setting = candidate.setting
        steps = self.steps
        if setting.compile != "off":
            steps = max(steps, COMPILE_WARMUP_STEPS + 1)
        command = [sys.executable, "-m", "thrifty", "train", str(self.config)]
        command += ["--out", str(self.run_dir(candidate)), "--steps", str(steps)]
        base = self.base.config_values()
        for key, value in setting.config_values().items():
            if value != base[key]:
                command += ["--set", f"{key}={toml_value(value)}"]
        if setting.precision in self.peaks:
            command += ["--set", f"measure.peak_tflops={self.peaks[setting.precision]!r}"]
        return command

    def __call__(self, candidate: Candidate, deadline: float) -> Trial:
        run_dir = self.run_dir(candidate)
        run_dir.mkdir(parents=True, exist_ok=True)
        log = run_dir / "train.log"
        child = self.children.start(self.command(candidate), self.env, log, candidate.name)
        try:
            code, peak_rss = _wait(child, deadline)
        finally:
            self.children.kill_all()  # Ctrl-C or an error here: no trial outlives the tune
        wall = child.elapsed
        if code is None:
            return stopped(candidate, wall, run_dir)
        if code != 0:
            return failed(candidate, wall, run_dir, code, child.error_line())
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            error = f"it left no readable summary.json ({exc}); its output is in {log}"
            return failed(candidate, wall, run_dir, 0, error)
        return from_summary(candidate, summary, wall, run_dir, peak_rss)


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


def _wait(child: Child, deadline: float) -> tuple[int | None, float | None]:
    """(exit code, or None once killed at the deadline; peak RSS in bytes, or None)."""
    peak = None
    while True:
        code = child.poll()
        peak = _peak_rss(child.proc.pid) or peak
        if code is not None:
            child.wait()
            return code, peak
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


def toml_value(value: Any) -> str:
    """A --set value as TOML: strings quoted, lists as arrays, numbers as they are."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)
