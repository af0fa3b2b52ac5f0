"""What a trial is and what it measured: the `Candidate` a tune tries, and the `Trial` of each
way its run ends (its summary.json read, a failure classified, the budget's stop, a hang, a
signal). `thrifty.search.tune.trials` runs the candidates.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.search.tune.space import Setting

# With torch.compile the Trainer leaves the first 3 steps out of its figures (1 without).
COMPILE_WARMUP_STEPS = 3
# A trial ready to train that completes no step is hung once it has waited HUNG_SECONDS and
# HUNG_STEPS times the slowest step the tune has measured: on a loaded machine whose steps take
# seconds, a first step still running when the budget ends it is not a hang.
HUNG_SECONDS = 30.0
HUNG_STEPS = 5
_OOM = re.compile(r"out of memory|OutOfMemoryError", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A setting to try: `name` is its folder under trials/, `stage` the lever it changes;
    `steps` the optimizer steps it runs, when not the tune's --steps (a paired comparison's
    runs, `thrifty.search.tune.compare`)."""

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
    from thrifty.rundir.files import step_records

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
