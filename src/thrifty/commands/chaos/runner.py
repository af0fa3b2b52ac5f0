"""Driving the child runs of `thrifty chaos`: the reference run, then the run that is SIGKILLed
and resumed, watched through its metrics.jsonl and its checkpoint folders."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from thrifty.children import Child, Children
from thrifty.commands.chaos.compare import compare_runs
from thrifty.commands.chaos.kills import Kill, plan_kills
from thrifty.commands.chaos.timing import effective_time
from thrifty.console import say
from thrifty.errors import ThriftyError
from thrifty.rundir.files import step_records

REFERENCE_TIMEOUT = 3600.0
POLL_SECONDS = 0.005  # metrics and checkpoint folders, while waiting for a kill's step
FAST_POLL_SECONDS = 0.0005  # a checkpoint folder, while waiting for its save to start
MANIFEST = (
    "manifest.json"  # thrifty.checkpointing.store.manifest.MANIFEST (not imported: it loads torch)
)
STEP_PREFIX = "step-"


# --------------------------------------------------------------------------------------------
# Watching a run directory


class MetricsTail:
    """The complete lines of metrics.jsonl, read incrementally; a replaced file is re-read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[bytes] = []
        self._ino: int | None = None
        self._offset = 0
        self._partial = b""

    def update(self) -> bool:
        """Read what was appended since the last call; True when the lines changed."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            return False
        with f:
            st = os.fstat(f.fileno())
            if st.st_ino != self._ino or st.st_size < self._offset:  # truncated on resume
                self._ino, self._offset, self._partial, self.lines = st.st_ino, 0, b"", []
            if st.st_size == self._offset:
                return False
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        parts = (self._partial + data).split(b"\n")
        self._partial = parts.pop()
        self.lines.extend(parts)
        return True


class Attempt:
    """What one attempt logged: the step it resumed from and the last step it reached.

    A resumed run drops the records after its checkpoint's step (the steps it runs again) and
    appends `{"step": r, "event": "resumed"}`. The file stays ordered by step, so what it kept
    is a prefix of `before` (the previous attempt's lines, as the kill left them) and its own
    lines start at the first one that differs from `before`. Fed incrementally.
    """

    def __init__(self, before: Sequence[bytes]) -> None:
        self.before = before
        self.reached: int | None = None  # the last step logged, else the resumed step
        self.resumed: int | None = None
        self.records = 0  # records of its own seen so far
        self._lines: list[bytes] | None = None
        self._start: int | None = None
        self._parsed = 0

    def update(self, lines: list[bytes]) -> None:
        if lines is not self._lines or len(lines) < self._parsed:  # the file was replaced
            self._lines, self._start, self._parsed = lines, None, 0
            self.reached = self.resumed = None
            self.records = 0
        if self._start is None:
            common, before = 0, self.before
            while common < min(len(lines), len(before)) and lines[common] == before[common]:
                common += 1
            if common == len(lines):
                return  # nothing of its own yet
            self._start = self._parsed = common
        for record in step_records(lines[self._parsed :]):
            if self.records == 0 and record.get("event") == "resumed":
                self.resumed = record["step"]
            if "loss" in record:
                self.reached = max(self.reached or 0, record["step"])
            elif self.reached is None:
                self.reached = self.resumed
            self.records += 1
        self._parsed = len(lines)


@dataclass
class Folders:
    """Checkpoint folders by step: when each was first seen unpublished, and published."""

    seen: dict[int, float] = field(default_factory=dict)
    published: dict[int, float] = field(default_factory=dict)
    save_seconds: list[float] = field(default_factory=list)

    def update(self, root: Path) -> None:
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return
        now = time.monotonic()
        for name in names:
            step = _step_of(name)
            if step is None:
                continue
            if os.path.exists(root / name / MANIFEST):
                if step not in self.published:
                    self.published[step] = now
                    if step in self.seen:
                        self.save_seconds.append(now - self.seen.pop(step))
            else:
                self.published.pop(step, None)  # saved again: the old manifest goes first
                self.seen.setdefault(step, now)

    def typical_save(self) -> float:
        """The median save time seen so far in seconds (0 before the first)."""
        return statistics.median(self.save_seconds) if self.save_seconds else 0.0


def _step_of(name: str) -> int | None:
    if not name.startswith(STEP_PREFIX):
        return None
    digits = name[len(STEP_PREFIX) :]
    return int(digits) if digits.isdigit() else None


def _modified_since(path: Path, since: float) -> bool:
    """Whether `path` (a file, or a folder and the files in it) was written after `since`."""
    try:
        times = [path.stat().st_mtime]
        if path.is_dir():
            times += [p.stat().st_mtime for p in path.iterdir()]
    except OSError:  # absent, or removed while looking
        return False
    return max(times) >= since


def left_behind(root: Path, since: float) -> tuple[list[int], list[int]]:
    """Checkpoint folders without a manifest that were written to after `since` (epoch time):
    saves the kill tore (above the newest published checkpoint), and deletions of old ones it
    cut short (below it: the manifest goes first)."""
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return [], []
    published, unpublished = [], []
    for name in names:
        step = _step_of(name)
        if step is None:
            continue
        if (root / name / MANIFEST).exists():
            published.append(step)
        elif _modified_since(root / name, since):
            unpublished.append(step)
    newest = max(published, default=-1)
    return [s for s in unpublished if s > newest], [s for s in unpublished if s < newest]


# --------------------------------------------------------------------------------------------
# The two runs


@dataclass(frozen=True, slots=True)
class Reference:
    """The uninterrupted run: its metrics records, last step, wall time and median step time."""

    records: list[dict[str, Any]]
    last_step: int
    wall_seconds: float
    step_seconds: float


def run_both(
    args: argparse.Namespace, out: Path, config: Path, children: Children, dropped: list[str]
) -> dict[str, Any]:
    """Train `config` without interruption, then again with `args.kills` kills; the report."""
    for item in dropped:
        say("chaos", f"not used: {item}")
    ref = _reference(args, out, config, children)
    kills = plan_kills(args.kills, args.every, ref.last_step, args.seed)
    run = KilledRun(out, config, children, args.timeout or 3 * ref.wall_seconds + 60)
    rng = random.Random(args.seed + 1)
    failure, finished_early = _kill_and_resume(run, kills, args.every, ref.step_seconds, rng)
    return _report(args, out, dropped, ref, kills, failure, finished_early, run.attempt_seconds)


def _start_training(
    children: Children, config: Path, run_dir: Path, log: Path, label: str
) -> Child:
    """`python -m thrifty train CONFIG --out RUN_DIR` in its own process group."""
    env = dict(os.environ)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    command = [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(run_dir)]
    return children.keep(Child(command, env, log, label))


def _wait(job: Child, timeout: float) -> int:
    try:
        return job.wait(timeout)
    except subprocess.TimeoutExpired:
        raise _timed_out(job, timeout) from None


def _timed_out(job: Child, timeout: float) -> ThriftyError:
    job.kill()
    return ThriftyError(
        f"the {job.label} ran past --timeout {timeout:g} s and was stopped; its output is in "
        f"{job.log} (a larger --timeout, or fewer --steps)"
    )


def _failed(job: Child, code: int) -> str:
    return f"{job.label} failed (exit {code}): {job.error_line()} (log: {job.log})"


def _reference(args: argparse.Namespace, out: Path, config: Path, children: Children) -> Reference:
    from thrifty.rundir.files import read_metrics

    ref_dir = out / "reference"
    say("chaos", f"reference run -> {ref_dir}")
    job = _start_training(children, config, ref_dir, out / "reference.log", "reference run")
    code = _wait(job, args.timeout or REFERENCE_TIMEOUT)
    wall = job.elapsed
    if code != 0:
        raise ThriftyError(
            f"the reference run failed (exit {code}): {job.error_line()} (log: {job.log})"
        )
    records = read_metrics(ref_dir / "metrics.jsonl")
    steps = [r for r in records if "loss" in r]
    if not steps:
        raise ThriftyError(f"the reference run logged no step (log: {job.log})")
    last_step = max(r["step"] for r in steps)
    step_times = [r["step_seconds"] for r in steps if isinstance(r.get("step_seconds"), float)]
    step_seconds = statistics.median(step_times) if step_times else wall / last_step
    say("chaos", f"reference run: {last_step} steps in {wall:.1f} s")
    return Reference(records, last_step, wall, step_seconds)


class KilledRun:
    """The run that is killed: one attempt after another in `out/chaos`, each logged to
    `out/chaos-N.log`, and what its files said so far."""

    def __init__(self, out: Path, config: Path, children: Children, timeout: float) -> None:
        self.out = out
        self.config = config
        self.children = children
        self.timeout = timeout  # seconds one attempt may run
        self.dir = out / "chaos"
        self.checkpoints = self.dir / "checkpoints"
        self.metrics = MetricsTail(self.dir / "metrics.jsonl")
        self.folders = Folders()
        self.before: list[bytes] = []  # the previous attempt's metrics lines, as it left them
        self.attempts = 0
        self.attempt_seconds: list[float] = []  # each ended attempt's, from start to exit

    def start(self) -> Child:
        self.attempts += 1
        n = self.attempts
        log = self.out / f"chaos-{n}.log"
        return _start_training(self.children, self.config, self.dir, log, f"attempt {n}")

    def settle(self, job: Child) -> Attempt:
        """What the attempt that just ended logged; the next one starts from these lines."""
        self.attempt_seconds.append(job.elapsed)
        self.metrics.update()
        seen = Attempt(self.before)
        seen.update(self.metrics.lines)
        self.before = list(self.metrics.lines)
        return seen


def _kill_and_resume(
    run: KilledRun, kills: list[Kill], every: int, step_seconds: float, rng: random.Random
) -> tuple[str | None, int | None]:
    """An attempt for each kill, then one that runs to the end: (what failed, the kill the run
    finished before)."""
    for i, kill in enumerate(kills):
        job = run.start()
        code = _drive(job, kill, run, every, step_seconds, rng)
        seen = run.settle(job)
        if i > 0:
            kills[i - 1].set_resumed(seen.resumed)
        if code is not None:  # it ended on its own before the kill
            return (_failed(job, code), None) if code != 0 else (None, kill.number)
        kill.reached = seen.reached
        kill.torn_saves, kill.cut_deletions = left_behind(run.checkpoints, job.started_wall)
        torn = f", tore the save of step {kill.torn_saves[-1]}" if kill.torn_saves else ""
        say(
            "chaos",
            f"kill {kill.number}/{len(kills)}: SIGKILL after {kill.moment:.2f} s at step "
            f"{seen.reached}{torn}",
        )
    job = run.start()
    code = _wait(job, run.timeout)
    kills[-1].set_resumed(run.settle(job).resumed)
    return (_failed(job, code) if code != 0 else None), None


def _drive(
    job: Child,
    kill: Kill,
    run: KilledRun,
    every: int,
    step_seconds: float,
    rng: random.Random,
) -> int | None:
    """Wait for the kill's moment and SIGKILL the job; the job's exit code if it ended first."""
    folder = run.checkpoints / f"{STEP_PREFIX}{kill.target:08d}"
    fresh = job.started_wall
    seen = Attempt(run.before)
    while True:
        code = job.poll()
        if code is not None:
            job.wait()
            return code
        if job.elapsed > run.timeout:
            raise _timed_out(job, run.timeout)
        if run.metrics.update():
            seen.update(run.metrics.lines)
        run.folders.update(run.checkpoints)
        reached = seen.reached
        at_step = reached is not None and reached >= kill.target
        if kill.kind == "step" and at_step and run.folders.published:
            delay = rng.uniform(0, step_seconds)
            break
        if kill.kind == "save" and reached is not None and reached >= kill.target - 1:
            if _modified_since(folder, fresh) and not (folder / MANIFEST).exists():
                delay = rng.uniform(0, run.folders.typical_save() / 2)  # the write is under way
                break
            if _modified_since(folder / MANIFEST, fresh) or reached >= kill.target + every:
                delay = 0.0  # the save was quicker than the poll: kill right after
                break
            time.sleep(FAST_POLL_SECONDS)
            continue
        time.sleep(POLL_SECONDS)
    if delay:
        time.sleep(delay)
    kill.moment = round(job.elapsed, 3)
    job.kill()
    return None


def _report(
    args: argparse.Namespace,
    out: Path,
    dropped: list[str],
    ref: Reference,
    kills: list[Kill],
    failure: str | None,
    finished_early: int | None,
    attempt_seconds: list[float],
) -> dict[str, Any]:
    """What chaos.json holds and `--json` prints; `attempt_seconds` are the killed run's
    attempts' wall times."""
    from thrifty.rundir.files import read_metrics

    done = [k for k in kills if k.moment is not None]
    report: dict[str, Any] = {
        "config": str(args.config),
        "out": str(out),
        "kills_planned": len(kills),
        "every": args.every,
        "seed": args.seed,
        "not_used": dropped,
        "reference": {
            "steps": ref.last_step,
            "wall_seconds": round(ref.wall_seconds, 3),
            "median_step_seconds": ref.step_seconds,
        },
        "kills": [asdict(k) for k in done],
        "finished_before_kill": finished_early,
        "failure": failure,
        "effective_time": None,
    }
    if failure is None:
        chaos_records = read_metrics(out / "chaos" / "metrics.jsonl")
        report.update(compare_runs(out / "reference", out / "chaos", ref.records, chaos_records))
        report["effective_time"] = effective_time(
            chaos_records, attempt_seconds, ref.records, ref.wall_seconds
        )
    else:
        report.update(weights_match=False, match=False)
    first = report.get("first_loss_difference")
    first_resume = done[0].resumed if done else None
    report["diverged_before_first_resume"] = (
        first is not None and first_resume is not None and first <= first_resume
    )
    lost_all = [k.number for k in done if k.resumed is None and failure is None]
    if lost_all:
        report["failure"] = (
            f"kill(s) {', '.join(map(str, lost_all))}: the next attempt did not resume from a "
            "checkpoint although one had been published"
        )
        report["match"] = False
    return report
