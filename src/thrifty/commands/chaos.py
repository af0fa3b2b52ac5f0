"""`thrifty chaos`: SIGKILL a training job at random moments, resume it after each kill, and check
that it ends with the same bits as a run that was never interrupted.

Both runs train the same resolved config (`<out>/config.toml`) in child processes
(`python -m thrifty train`), so a kill is what a reclaimed spot machine does: no signal handler,
no emergency save, the process and its data-loader workers gone mid-instruction.

How the kill moments are chosen (reproducible with `--seed`, in steps, not in seconds):

* the steps after the first checkpoint (`every + 1` .. the reference run's last step − 1) are cut
  into K equal spans, and each kill aims at a random step of its own span, so kills spread over
  the run and every kill has a published checkpoint to come back to;
* half the kills (rounded up, at random) aim at a *save*: a multiple of `--every` in their span.
  Once the step before it is logged, the folder of that checkpoint is polled every 0.5 ms; as
  soon as it holds files written by this attempt but no manifest yet (the background write is
  under way), the job is killed after a random delay of up to half the save time observed so far
  in this run. A save quicker than the poll is caught just after it, instead;
* the other kills aim at a step: once the step is logged, the job is killed after a random
  delay of up to one median step time (measured in the reference run), i.e. somewhere inside
  the next step.

After each kill, a checkpoint folder that the killed process wrote to and that has no manifest
is reported as cut short: a torn save (above the newest published checkpoint) or a half-done
deletion of an old one (below it; the manifest is deleted first). Readers must ignore both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from thrifty.commands.training import add_set_option
from thrifty.errors import ThriftyError

EXIT_MATCH = 0
EXIT_MISMATCH = 1
DEFAULT_KILLS = 3
DEFAULT_EVERY = 5
REFERENCE_TIMEOUT = 3600.0
POLL_SECONDS = 0.005  # metrics and checkpoint folders, while waiting for a kill's step
FAST_POLL_SECONDS = 0.0005  # a checkpoint folder, while waiting for its save to start
MANIFEST = "manifest.json"  # thrifty.checkpoint.manifest.MANIFEST (not imported: it loads torch)
STEP_PREFIX = "step-"
# Values that legitimately differ between two runs of the same config: wall-clock time.
IGNORED = {"config", "progress.seconds"}
OUR_FILES = ("config.toml", "chaos.json", "reference", "chaos", "reference.log")  # + chaos-N.log


def register(subparsers: argparse._SubParsersAction) -> None:
    chaos = subparsers.add_parser(
        "chaos",
        help="SIGKILL a training job at random moments, resume it, and check the final weights "
        "bit for bit against an uninterrupted run",
        description="Train CONFIG once without interruption, then again while SIGKILLing it "
        "--kills times at random moments (some during checkpoint saves) and resuming after "
        "each kill; print the steps each kill lost and whether the final weights match the "
        "uninterrupted run bit for bit. Exit codes: 0 identical, 1 different (or the "
        "interrupted run failed to resume), 2 bad input.",
    )
    chaos.add_argument("config", metavar="CONFIG.toml")
    chaos.add_argument(
        "--kills",
        type=int,
        default=DEFAULT_KILLS,
        metavar="K",
        help=f"how many times to SIGKILL the job (default {DEFAULT_KILLS})",
    )
    chaos.add_argument(
        "--every",
        type=int,
        default=DEFAULT_EVERY,
        metavar="N",
        help=f"checkpoint every N steps in both runs (default {DEFAULT_EVERY})",
    )
    chaos.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="S",
        help="seed for choosing the kill moments (default 0)",
    )
    chaos.add_argument("--steps", type=int, metavar="N", help="optimizer steps (run.max_steps)")
    add_set_option(chaos)
    chaos.add_argument(
        "--out", metavar="DIR", help="where both runs go (default runs/chaos-<run.name>)"
    )
    chaos.add_argument(
        "--overwrite", action="store_true", help="replace the runs of an earlier chaos in --out"
    )
    chaos.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="the longest one training process may run (default: 1 h for the "
        "reference run; 3 × its wall time + 60 s for each resumed attempt)",
    )
    chaos.add_argument("--json", action="store_true", help="print the report as JSON")
    chaos.set_defaults(handler=run_chaos)


# --------------------------------------------------------------------------------------------
# The plan


@dataclass
class Kill:
    """One planned kill, then what happened."""

    number: int
    kind: str  # "step" or "save"
    target: int  # the step it aims at (for a save: the step being saved)
    moment: float | None = None  # seconds after its attempt started
    reached: int | None = None  # the last step the killed attempt logged
    resumed: int | None = None  # the step the next attempt resumed from (None: started over)
    steps_lost: int | None = None
    torn_saves: list[int] = field(default_factory=list)  # saves cut short: no manifest
    cut_deletions: list[int] = field(default_factory=list)  # old checkpoints half deleted


def plan_kills(kills: int, every: int, last_step: int, seed: int) -> list[Kill]:
    """K kills over steps every+1 .. last_step-1, one per equal span; half of them at saves."""
    lo, hi = every + 1, last_step - 1
    if hi - lo + 1 < kills:
        raise ThriftyError(
            f"the reference run did {last_step} steps: too few for {kills} kills after the first "
            f"checkpoint at step {every}; give more --steps or a smaller --every"
        )
    rng = random.Random(seed)
    kinds = ["save"] * math.ceil(kills / 2) + ["step"] * (kills // 2)
    rng.shuffle(kinds)
    span = hi - lo + 1
    plan = []
    for i, kind in enumerate(kinds):
        a, b = lo + span * i // kills, lo + span * (i + 1) // kills - 1
        saves = [s for s in range(a, b + 1) if s % every == 0]
        if kind == "save" and saves:
            plan.append(Kill(i + 1, "save", rng.choice(saves)))
        else:
            plan.append(Kill(i + 1, "step", rng.randint(a, b)))
    return plan


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
        for line in lines[self._parsed :]:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                continue
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
# Child processes


class Job:
    """`python -m thrifty train CONFIG --out RUN` in its own process group, output to a log."""

    def __init__(self, config: Path, run_dir: Path, log: Path, label: str) -> None:
        self.label = label
        self.log = log
        env = dict(os.environ)
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        self._file: TextIO = open(log, "w")  # noqa: SIM115 (closed in wait())
        command = [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(run_dir)]
        self.started_wall = time.time()
        self.started = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._file.close()
            raise ThriftyError(f"cannot start {sys.executable}: {exc.strerror}") from exc

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        """SIGKILL the whole process group (data-loader workers too) and reap it."""
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.wait(30)

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.returncode is not None and not self._file.closed:
                self._file.close()

    def last_line(self) -> str:
        try:
            lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines()]
        except OSError:
            return ""
        errors = [line for line in lines if line.startswith("thrifty: error:")]
        tail = errors[-1] if errors else next((line for line in reversed(lines) if line), "")
        return tail.removeprefix("thrifty: error: ")


class Jobs:
    """Every job started, so that none outlives the command, whatever happens."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def start(self, *args: Any) -> Job:
        job = Job(*args)
        self.jobs.append(job)
        return job

    def kill_all(self) -> None:
        for job in self.jobs:
            if job.proc.returncode is None:
                job.kill()


def _timed_out(job: Job, timeout: float) -> ThriftyError:
    job.kill()
    return ThriftyError(
        f"the {job.label} ran past --timeout {timeout:g} s and was stopped; its output is in "
        f"{job.log} (a larger --timeout, or fewer --steps)"
    )


# --------------------------------------------------------------------------------------------
# The command


def run_chaos(args: argparse.Namespace) -> int:
    _check_args(args)
    out = Path(args.out) if args.out else None
    config, dropped = _resolve_config(args)
    out = out or Path("runs") / f"chaos-{config['run'].get('name', 'run')}"
    _prepare_out(out, args.overwrite)
    config_path = out / "config.toml"
    from thrifty.config import dump_toml

    config_path.write_text(dump_toml(config))
    jobs = Jobs()
    try:
        report = _run(args, out, config_path, jobs, dropped)
    finally:
        jobs.kill_all()
    (out / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    return EXIT_MATCH if report["match"] else EXIT_MISMATCH


def _check_args(args: argparse.Namespace) -> None:
    if args.kills < 1:
        raise ThriftyError(f"--kills {args.kills} is invalid: give 1 or more")
    if args.every < 1:
        raise ThriftyError(f"--every {args.every} is invalid: give a number of steps, 1 or more")
    if args.steps is not None and args.steps < 1:
        raise ThriftyError(f"--steps {args.steps} is invalid: give 1 or more")
    if args.timeout is not None and not args.timeout > 0:
        raise ThriftyError(f"--timeout {args.timeout:g} is invalid: give seconds, more than 0")
    if not hasattr(os, "killpg"):
        raise ThriftyError("thrifty chaos needs POSIX signals (SIGKILL): run it on Linux or macOS")


def _resolve_config(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The user's config and --set values, plus what chaos needs; and what it had to drop."""
    from thrifty.config import TrainConfig, load_config, parse_set_args

    pairs: list[tuple[str, Any]] = list(parse_set_args(args.overrides))
    if args.steps is not None:
        pairs.append(("run.max_steps", args.steps))
    data = load_config(args.config, pairs).to_dict(secrets=False)
    dropped = []
    run = data["run"]
    for key in ("out", "overwrite"):
        run.pop(key, None)
    if run.pop("max_time", None) is not None:
        dropped.append("run.max_time (a wall-clock budget ends two runs at different steps)")
    if all(run.get(k) is None for k in ("max_steps", "max_tokens", "max_epochs")):
        raise ThriftyError(
            "thrifty chaos needs a budget that ends both runs at the same step: set "
            "run.max_steps (or --steps), run.max_tokens or run.max_epochs"
            + ("; run.max_time is a wall-clock budget and is not used" if dropped else "")
        )
    run.update(deterministic=True, log_every=1, progress="off")
    ckpt = data["checkpoint"]
    for key in ("location", "local_dir"):
        if ckpt.pop(key, None) is not None:
            dropped.append(f"checkpoint.{key} (chaos checkpoints to each run's own directory)")
    if ckpt.get("resume", "auto") != "auto":
        dropped.append(f"checkpoint.resume = {ckpt['resume']!r} (chaos resumes automatically)")
    ckpt.update(every=args.every, resume="auto", storage_options={})
    data["spot"] = {"provider": "none"}
    TrainConfig.from_dict(data)  # still valid
    return data, dropped


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ThriftyError(f"--out {out} is a file: give a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ThriftyError(
                f"--out {out} is not empty: choose another --out, or replace its runs with "
                "--overwrite"
            )
        for entry in out.iterdir():
            attempt_log = entry.name.startswith("chaos-") and entry.name.endswith(".log")
            if entry.name in OUR_FILES or attempt_log:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ThriftyError(f"cannot create --out {out}: {exc.strerror}") from exc


def _say(message: str) -> None:
    print(f"thrifty chaos: {message}", file=sys.stderr, flush=True)


def _run(
    args: argparse.Namespace, out: Path, config_path: Path, jobs: Jobs, dropped: list[str]
) -> dict[str, Any]:
    from thrifty.rundir import read_metrics

    for item in dropped:
        _say(f"not used: {item}")
    # --- the uninterrupted reference -----------------------------------------------------------
    ref_dir = out / "reference"
    _say(f"reference run -> {ref_dir}")
    ref_timeout = args.timeout or REFERENCE_TIMEOUT
    job = jobs.start(config_path, ref_dir, out / "reference.log", "reference run")
    try:
        code = job.wait(ref_timeout)
    except subprocess.TimeoutExpired:
        raise _timed_out(job, ref_timeout) from None
    ref_wall = job.elapsed
    if code != 0:
        raise ThriftyError(
            f"the reference run failed (exit {code}): {job.last_line()} (log: {job.log})"
        )
    ref_records = read_metrics(ref_dir / "metrics.jsonl")
    ref_steps = [r for r in ref_records if "loss" in r]
    if not ref_steps:
        raise ThriftyError(f"the reference run logged no step (log: {job.log})")
    last_step = max(r["step"] for r in ref_steps)
    step_times = [r["step_seconds"] for r in ref_steps if isinstance(r.get("step_seconds"), float)]
    step_seconds = statistics.median(step_times) if step_times else ref_wall / last_step
    _say(f"reference run: {last_step} steps in {ref_wall:.1f} s")

    # --- the run that is killed ----------------------------------------------------------------
    kills = plan_kills(args.kills, args.every, last_step, args.seed)
    timeout = args.timeout or 3 * ref_wall + 60
    rng = random.Random(args.seed + 1)
    chaos_dir = out / "chaos"
    metrics = MetricsTail(chaos_dir / "metrics.jsonl")
    folders = Folders()
    before: list[bytes] = []  # the previous attempt's metrics lines, as it left them
    failure = None
    finished_early = None
    attempt = 0
    for kill in kills:
        attempt += 1
        job = jobs.start(config_path, chaos_dir, out / f"chaos-{attempt}.log", f"attempt {attempt}")
        code = _drive(
            job,
            kill,
            metrics,
            before,
            folders,
            chaos_dir / "checkpoints",
            args.every,
            step_seconds,
            rng,
            timeout,
        )
        metrics.update()
        seen = Attempt(before)
        seen.update(metrics.lines)
        before = list(metrics.lines)
        reached = seen.reached
        if attempt > 1:
            _set_resumed(kills[attempt - 2], seen.resumed)
        if code is not None:  # it ended on its own before the kill
            if code != 0:
                failure = _failed(job, code)
            else:
                finished_early = kill.number
            break
        kill.reached = reached
        kill.torn_saves, kill.cut_deletions = left_behind(
            chaos_dir / "checkpoints", job.started_wall
        )
        torn = f", tore the save of step {kill.torn_saves[-1]}" if kill.torn_saves else ""
        _say(
            f"kill {kill.number}/{len(kills)}: SIGKILL after {kill.moment:.2f} s at step "
            f"{reached}{torn}"
        )
    else:
        attempt += 1
        job = jobs.start(config_path, chaos_dir, out / f"chaos-{attempt}.log", f"attempt {attempt}")
        try:
            code = job.wait(timeout)
        except subprocess.TimeoutExpired:
            raise _timed_out(job, timeout) from None
        metrics.update()
        seen = Attempt(before)
        seen.update(metrics.lines)
        _set_resumed(kills[-1], seen.resumed)
        if code != 0:
            failure = _failed(job, code)
    done = [k for k in kills if k.moment is not None]
    report: dict[str, Any] = {
        "config": str(args.config),
        "out": str(out),
        "kills_planned": len(kills),
        "every": args.every,
        "seed": args.seed,
        "not_used": dropped,
        "reference": {
            "steps": last_step,
            "wall_seconds": round(ref_wall, 3),
            "median_step_seconds": step_seconds,
        },
        "kills": [asdict(k) for k in done],
        "finished_before_kill": finished_early,
        "failure": failure,
    }
    if failure is None:
        chaos_records = read_metrics(chaos_dir / "metrics.jsonl")
        report.update(_compare_runs(ref_dir, chaos_dir, ref_records, chaos_records))
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


def _failed(job: Job, code: int) -> str:
    return f"{job.label} failed (exit {code}): {job.last_line()} (log: {job.log})"


def _set_resumed(kill: Kill, resumed: int | None) -> None:
    kill.resumed = resumed
    if kill.reached is not None:
        kill.steps_lost = kill.reached - (resumed or 0)


def _drive(
    job: Job,
    kill: Kill,
    metrics: MetricsTail,
    before: list[bytes],
    folders: Folders,
    ckpt_dir: Path,
    every: int,
    step_seconds: float,
    rng: random.Random,
    timeout: float,
) -> int | None:
    """Wait for the kill's moment and SIGKILL the job; the job's exit code if it ended first."""
    name = f"{STEP_PREFIX}{kill.target:08d}"
    fresh = job.started_wall
    seen = Attempt(before)
    while True:
        code = job.poll()
        if code is not None:
            job.wait()
            return code
        if job.elapsed > timeout:
            raise _timed_out(job, timeout)
        if metrics.update():
            seen.update(metrics.lines)
        folders.update(ckpt_dir)
        reached = seen.reached
        at_step = reached is not None and reached >= kill.target
        if kill.kind == "step" and at_step and folders.published:
            time.sleep(rng.uniform(0, step_seconds))
            return _kill(job, kill)
        if kill.kind == "save" and reached is not None and reached >= kill.target - 1:
            folder = ckpt_dir / name
            if _modified_since(folder, fresh) and not (folder / MANIFEST).exists():
                time.sleep(rng.uniform(0, folders.typical_save() / 2))  # the write is under way
                return _kill(job, kill)
            if _modified_since(folder / MANIFEST, fresh) or reached >= kill.target + every:
                return _kill(job, kill)  # the save was quicker than the poll: kill right after
            time.sleep(FAST_POLL_SECONDS)
            continue
        time.sleep(POLL_SECONDS)


def _kill(job: Job, kill: Kill) -> None:
    kill.moment = round(job.elapsed, 3)
    job.kill()
    return None


# --------------------------------------------------------------------------------------------
# Comparing the two runs


def _final_state(run_dir: Path) -> tuple[int, dict[str, Any]]:
    from thrifty.checkpoint import CheckpointManager

    manager = CheckpointManager(str(run_dir / "checkpoints"))
    info = manager.latest()
    if info is None:
        raise ThriftyError(f"{run_dir} has no valid checkpoint to compare")
    return info.step, manager.load(info)


def compare_states(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Section by section (model, optimizer, progress, rng, ...): how many values were compared
    and which differ. Tensors must agree in dtype, shape and every bit; `IGNORED` is skipped."""
    sections: dict[str, dict[str, Any]] = {}
    for key in sorted(set(a) | set(b)):
        if key in IGNORED:
            continue
        differs: list[str] = []
        count = _compare(a.get(key, _MISSING), b.get(key, _MISSING), key, differs)
        sections[key] = {
            "compared": count,
            "identical": not differs,
            "differs": differs[:10],
            "differ_count": len(differs),
        }
    return sections


_MISSING = object()


def _compare(a: Any, b: Any, where: str, differs: list[str]) -> int:
    """Append the dotted paths where `a` and `b` differ; return the number of leaves compared."""
    import torch

    if where in IGNORED:
        return 0
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return sum(
            _compare(a.get(k, _MISSING), b.get(k, _MISSING), f"{where}.{k}", differs)
            for k in sorted(set(a) | set(b), key=str)
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return sum(_compare(x, y, f"{where}[{i}]", differs) for i, (x, y) in pairs)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            differs.append(where)
        elif a.dtype != b.dtype or a.shape != b.shape:
            differs.append(f"{where} ({a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)})")
        elif not _same_bits(a, b):
            differs.append(where)
        return 1
    if isinstance(a, float) and isinstance(b, float):  # NaN equals NaN; 0.0 and -0.0 differ
        same = struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    else:
        same = type(a) is type(b) and a == b
    if not same:
        differs.append(where)
    return 1


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    try:
        return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    except RuntimeError:  # a layout that has no byte view (sparse, quantized)
        return torch.equal(a, b)


def _compare_runs(
    ref_dir: Path,
    chaos_dir: Path,
    ref_records: list[dict[str, Any]],
    chaos_records: list[dict[str, Any]],
) -> dict[str, Any]:
    ref_step, ref_state = _final_state(ref_dir)
    chaos_step, chaos_state = _final_state(chaos_dir)
    sections = compare_states(ref_state, chaos_state)
    ref_loss = {r["step"]: r["loss"] for r in ref_records if "loss" in r}
    chaos_loss = {r["step"]: r["loss"] for r in chaos_records if "loss" in r}
    steps = set(ref_loss) | set(chaos_loss)
    differing = sorted(s for s in steps if ref_loss.get(s) != chaos_loss.get(s))
    weights = sections.get("model", {"identical": False})
    return {
        "final_step": {"reference": ref_step, "chaos": chaos_step},
        "state": sections,
        "losses_compared": len(ref_loss),
        "first_loss_difference": differing[0] if differing else None,
        "weights_match": bool(weights["identical"]) and ref_step == chaos_step,
        "match": ref_step == chaos_step and all(s["identical"] for s in sections.values()),
    }


# --------------------------------------------------------------------------------------------
# Printing


def _print_report(report: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    ref = report["reference"]
    console.print(
        f"reference run: {ref['steps']} steps in {ref['wall_seconds']:.1f} s; a checkpoint every "
        f"{report['every']} steps; --seed {report['seed']}"
    )
    table = Table(title=f"thrifty chaos: {len(report['kills'])} of {report['kills_planned']} kills")
    for name in (
        "kill",
        "aimed at",
        "killed after",
        "last step logged",
        "resumed from",
        "steps lost",
        "cut short",
    ):
        text = name in ("aimed at", "cut short")
        table.add_column(name, justify="left" if text else "right", overflow="fold")
    for k in report["kills"]:
        resumed = _dash(k["resumed"])
        if k["resumed"] is None and not report["failure"]:
            resumed = "[bold red]started over[/]"
        table.add_row(
            str(k["number"]),
            f"{k['kind']} {k['target']}",
            f"{k['moment']:.2f} s",
            _dash(k["reached"]),
            resumed,
            _dash(k["steps_lost"]),
            _cut_short(k),
        )
    console.print(table)
    if report.get("finished_before_kill"):
        console.print(f"the run finished before kill {report['finished_before_kill']} could land")
    if "state" in report:
        steps = report["final_step"]
        if steps["reference"] != steps["chaos"]:
            console.print(
                f"final checkpoint: [bold red]step {steps['chaos']}[/], the reference "
                f"ends at step {steps['reference']}"
            )
        first = report["first_loss_difference"]
        console.print(
            f"loss at every step: identical ({report['losses_compared']} steps)"
            if first is None
            else f"loss at every step: [bold red]differs[/], first at step {first}"
        )
        if report["diverged_before_first_resume"]:
            console.print(
                f"  step {first} comes before the first resume (step {report['kills'][0]['resumed']}"
                "): this config does not reproduce even without kills (random data or model "
                "set-up outside run.seed, or nondeterministic ops)"
            )
        rest = {k: v for k, v in report["state"].items() if k != "model"}
        differ = [
            f"{k} ({', '.join(v['differs'][:3])}"
            + (f" and {v['differ_count'] - 3} more" if v["differ_count"] > 3 else "")
            + ")"
            for k, v in rest.items()
            if not v["identical"]
        ]
        console.print(
            f"rest of the training state ({', '.join(rest)}): "
            + ("identical" if not differ else f"[bold red]differs[/] in {'; '.join(differ)}")
        )
        model = report["state"].get("model")
        if model and not model["identical"]:
            where = ", ".join(model["differs"][:5])
            more = model["differ_count"] - min(5, len(model["differs"]))
            console.print(f"weights that differ: {where}" + (f" and {more} more" if more else ""))
    if report["failure"]:
        console.print(f"[bold red]failed:[/] {report['failure']}")
    tensors = report.get("state", {}).get("model", {}).get("compared")
    verdict = "[bold green]yes[/]" if report["weights_match"] else "[bold red]no[/]"
    console.print(
        f"final weights match bit for bit: {verdict}"
        + (f" ({tensors} tensors)" if report["weights_match"] and tensors else "")
    )


def _cut_short(kill: Mapping[str, Any]) -> str:
    parts = [f"save {s}" for s in kill["torn_saves"]]
    parts += [f"delete {s}" for s in kill["cut_deletions"]]
    return ", ".join(parts) or "-"


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)
