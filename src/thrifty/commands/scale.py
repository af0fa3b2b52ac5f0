"""`thrifty scale`: one training job at several process counts, with the same global batch at
each, and its measured scaling efficiency beside the planner's prediction for the same setup.

Each count runs `python -m thrifty train CONFIG --nprocs N` in a child process, into
`<out>/nprocs-N` (its output in `train.log` there), with what would distort the measurement
turned off (periodic checkpoints, validation during the run, the spot watcher, the progress
bar). Throughput is the run's own steady-state figure (summary.json, warm-up excluded).

Efficiency against the smallest count N0: throughput_N / (N / N0 × throughput_N0). The
prediction is `thrifty.plan.scaling.scaling` for N processes on one node, with the compute of
one step taken from the N0 run split N ways, fp32 gradients, and the all-reduce bus bandwidth
either given (--bus-gbs) or measured here by N processes all-reducing a buffer the size of the
model's gradients (`measure_bus_bandwidth`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.commands.training import add_set_option
from thrifty.errors import ConfigError, ThriftyError
from thrifty.launch import threads_per_process

DEFAULT_STEPS = 20
GRAD_BYTES_PER_PARAM = 4  # DDP all-reduces fp32 gradients (parameters stay fp32 under autocast)
MAX_BUS_BYTES = 128 * 2**20  # bandwidth is flat long before this; bounds time and memory
BUS_TIMEOUT = 120.0  # seconds for one bandwidth measurement, process start-up included
DDP_FIRST_BUCKET = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
CLOSE = 0.10  # measured within 10 points of the prediction counts as "as predicted"
# What a run's summary.json must hold for the comparison.
SUMMARY_KEYS = ("tokens_per_second", "samples_per_second", "step_seconds", "parameters")

# (processes) -> the run's summary.json contents
Runner = Callable[[int], Mapping[str, Any]]
# (processes, buffer bytes, backend) -> bus bandwidth in GB/s per direction
BusMeter = Callable[[int, int, str], float]
# (command, environment, log path) -> exit code
Launch = Callable[[Sequence[str], Mapping[str, str], Path], int]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "scale",
        help="run a config at several process counts with the same global batch and compare "
        "the scaling efficiency with the planner's prediction",
        description="Train CONFIG for a few steps at each process count in --nprocs, keeping the "
        "global batch (batch.effective) the same, and print throughput, speed-up and scaling "
        "efficiency beside the efficiency thrifty plan predicts for the same setup.",
    )
    parser.add_argument("config", metavar="CONFIG.toml")
    parser.add_argument(
        "--nprocs",
        required=True,
        metavar="N,N,...",
        help="process counts to compare, e.g. 1,2 or 1,2,4,8 (the smallest is the baseline)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        metavar="N",
        help=f"optimizer steps at each count (default {DEFAULT_STEPS}; the first is warm-up)",
    )
    parser.add_argument(
        "--out", metavar="DIR", help="where the runs go, DIR/nprocs-N (default runs/scale-<name>)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace runs an earlier scale left in --out"
    )
    parser.add_argument(
        "--bus-gbs",
        type=float,
        metavar="X",
        help="all-reduce bus bandwidth in GB/s per direction for the prediction "
        "(default: measured on this machine)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    add_set_option(parser)
    parser.set_defaults(handler=run_scale)


# --------------------------------------------------------------------------------------------
# The plan: counts, global batch, threads, and what each child runs


def parse_nprocs(text: str) -> list[int]:
    """`"1,2,4"` -> [1, 2, 4]: positive whole numbers, sorted, each once."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            shown = part or "an empty item"
            raise ConfigError(
                f"--nprocs {text!r} is invalid: {shown!r} is not a process count; give whole "
                "numbers above 0 separated by commas, e.g. --nprocs 1,2,4"
            )
        counts.append(int(part))
    return sorted(set(counts))


def global_batch(micro: int, effective: int | None, counts: Sequence[int]) -> int:
    """The samples per optimizer step every count runs: batch.effective, or when the config has
    none, micro × the least common multiple of the counts (micro × the largest for 1,2,4,8).
    It must split into whole micro-batches at every count."""
    lcm = math.lcm(*counts)
    if effective is None:
        return micro * lcm
    for n in counts:
        if effective % (micro * n):
            fix = math.ceil(effective / (micro * lcm)) * micro * lcm
            raise ConfigError(
                f"batch.effective = {effective} does not split into whole micro-batches at "
                f"{n} processes (batch.micro × {n} = {micro * n}): every count must run the same "
                f"global batch; use --set batch.effective={fix} (a multiple of {micro} × "
                f"{lcm}), a smaller batch.micro, or other --nprocs"
            )
    return effective


def available_cpus() -> int:
    from thrifty.loading import available_cpus as cpus  # imports torch: only when a scale runs

    return cpus()


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalePlan:
    """What to run. `overrides` are the user's --set items, passed through unchanged."""

    config: str
    counts: list[int]
    steps: int
    out: Path
    micro: int
    effective: int
    effective_from_config: bool
    device: str  # "cpu" or "cuda"
    cpus: int
    user_omp: str | None  # OMP_NUM_THREADS from the environment, kept as is
    overrides: list[str] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def run_dir(self, processes: int) -> Path:
        return self.out / f"nprocs-{processes}"

    def threads(self, processes: int) -> int | None:
        """OMP_NUM_THREADS for a CPU run, None where it is left alone (CUDA, or set by you)."""
        if self.device != "cpu":
            return None
        return int(self.user_omp) if self.user_omp else threads_per_process(processes, self.cpus)

    def child_overrides(self, processes: int) -> list[str]:
        """The user's --set items, then what keeps the measurement clean (those win)."""
        return [
            *self.overrides,
            f"batch.effective={self.effective}",
            "run.progress=off",
            "checkpoint.every=off",  # only the final checkpoint, after the measured steps
            f"checkpoint.location={self.run_dir(processes) / 'checkpoints'}",
            "checkpoint.resume=never",
            "spot.provider=none",
            f"eval.every={self.steps + 1}",  # validation only before and after the run
            "eval.batches=1",
        ]

    def command(self, processes: int) -> list[str]:
        command = [sys.executable, "-m", "thrifty", "train", self.config]
        command += ["--nprocs", str(processes), "--out", str(self.run_dir(processes))]
        command += ["--steps", str(self.steps)]
        for item in self.child_overrides(processes):
            command += ["--set", item]
        return command

    def env(self, processes: int, environ: Mapping[str, str]) -> dict[str, str]:
        env = dict(environ)
        threads = self.threads(processes)
        if threads is not None and not self.user_omp:
            env["OMP_NUM_THREADS"] = str(threads)
        return env


def _launch(command: Sequence[str], env: Mapping[str, str], log: Path) -> int:
    with open(log, "w") as f:
        return subprocess.run(
            list(command), stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env
        ).returncode


_RANK_PREFIX = re.compile(r"^\[[\w-]+\]:\s*")  # "[rank1]: ", "[default0]: "
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def first_error_line(log: Path) -> str:
    """The first error in a log: a `thrifty: error:` line or the last line of a traceback.
    With several processes the first is the cause; the others are ranks losing their peer."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no output)"
    lines = [_RANK_PREFIX.sub("", line).strip() for line in text.splitlines()]
    for line in lines:
        if line.startswith("thrifty: error:") or _EXCEPTION.fullmatch(line):
            return line.removeprefix("thrifty: error: ")
    return next((line for line in reversed(lines) if line), "(no output)")


class ChildRunner:
    """Runs one count as `python -m thrifty train` and returns its summary.json."""

    def __init__(self, plan: ScalePlan, launch: Launch = _launch) -> None:
        self.plan = plan
        self.launch = launch

    def __call__(self, processes: int) -> dict[str, Any]:
        run_dir = self.plan.run_dir(processes)
        run_dir.mkdir(parents=True, exist_ok=True)
        log = run_dir / "train.log"
        env = self.plan.env(processes, os.environ)
        code = self.launch(self.plan.command(processes), env, log)
        if code != 0:
            raise ThriftyError(
                f"the run with {processes} process{'es' if processes > 1 else ''} failed "
                f"(exit {code}): {first_error_line(log)} (log: {log})"
            )
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError) as exc:
            raise ThriftyError(
                f"the run with {processes} processes left no readable summary.json in {run_dir} "
                f"({exc}); its output is in {log}"
            ) from None
        return summary


# --------------------------------------------------------------------------------------------
# Bus bandwidth, measured the nccl-tests way


def bus_gbs(nbytes: float, seconds: float, processes: int) -> float:
    """nccl-tests bus bandwidth of one all-reduce, GB/s per direction:
    bytes / seconds × 2(n-1)/n, what a ring moves over each link."""
    return nbytes / seconds * 2 * (processes - 1) / processes / 1e9


def measure_bus_bandwidth(
    processes: int, nbytes: int, backend: str = "gloo", timeout: float = BUS_TIMEOUT
) -> float:
    """All-reduce bus bandwidth of `processes` local processes in GB/s per direction, for a
    float32 buffer of `nbytes` bytes (capped at 128 MiB): the slowest rank's time, median of 3
    rounds of back-to-back all-reduces after a warm-up. gloo uses CPU tensors, nccl one GPU
    per process. Small buffers measure latency as much as bandwidth, as the real step does."""
    if processes < 2:
        raise ValueError("a bus bandwidth needs at least 2 processes")
    nbytes = max(4, min(int(nbytes), MAX_BUS_BYTES))
    iters = max(2, min(50, (32 * 2**20) // nbytes))
    code = "from thrifty.commands.scale import bus_worker; bus_worker()"
    env = dict(os.environ)
    if backend == "gloo" and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_per_process(processes, available_cpus()))
    what = f"measuring the all-reduce bandwidth of {processes} {backend} processes"
    with tempfile.TemporaryDirectory(prefix="thrifty-bus-") as tmp:
        argv = [sys.executable, "-c", code, "RANK", str(processes), f"{tmp}/store", str(nbytes)]
        argv += [str(iters), backend]
        logs = [Path(tmp) / f"rank-{rank}.log" for rank in range(processes)]
        procs: list[subprocess.Popen[bytes]] = []
        killed = set()
        try:
            for rank, log in enumerate(logs):
                argv[3] = str(rank)
                with open(log, "w") as f:
                    procs.append(subprocess.Popen(argv, stdout=f, stderr=f, env=env))
            deadline = time.monotonic() + timeout
            # One rank that fails leaves the others waiting for it: stop at the first failure.
            while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
                if time.monotonic() > deadline:
                    raise ThriftyError(f"{what} took over {timeout:g} s: give --bus-gbs instead")
                time.sleep(0.05)
        finally:
            for rank, proc in enumerate(procs):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    killed.add(rank)
        outputs = [log.read_text(errors="replace") for log in logs]
    for rank in sorted(range(processes), key=lambda r: r in killed):  # a real failure first
        proc, output = procs[rank], outputs[rank]
        if proc.returncode:
            tail = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "(no output)")
            raise ThriftyError(
                f"{what} failed (exit {proc.returncode}): {tail.strip()}; give --bus-gbs instead"
            )
    result = [ln for ln in outputs[0].splitlines() if ln.startswith('{"seconds"')]
    return bus_gbs(nbytes, json.loads(result[-1])["seconds"], processes)


def bus_worker() -> None:
    """One rank of `measure_bus_bandwidth` (argv: rank world store bytes iters backend)."""
    rank, world, store, nbytes, iters, backend = sys.argv[1:7]
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(int(rank))
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=int(rank), world_size=int(world)
    )
    device = torch.device("cuda", int(rank)) if cuda else torch.device("cpu")
    buffer = torch.zeros(int(nbytes) // 4, dtype=torch.float32, device=device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    dist.all_reduce(buffer)  # warm-up: connections, buffers
    rounds = []
    for _ in range(3):
        dist.barrier()
        sync()
        start = time.perf_counter()
        for _ in range(int(iters)):
            dist.all_reduce(buffer)
        sync()
        rounds.append((time.perf_counter() - start) / int(iters))
    # The collective takes as long as its slowest rank.
    slowest = torch.tensor(rounds, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == "0":
        print(json.dumps({"seconds": statistics.median(slowest.tolist())}), flush=True)
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# The comparison


def overlap_applies(device: str, gradient_bytes: float) -> tuple[bool, str]:
    """Whether the planner's 'with overlap' efficiency describes this setup, and why."""
    if device != "cuda":
        return False, "gloo on CPU reduces on the cores that run backward, so little is hidden"
    if gradient_bytes <= DDP_FIRST_BUCKET:
        return False, "the gradients fit DDP's first 1 MiB bucket, reduced only once backward ends"
    return True, "DDP all-reduces gradient buckets on its own CUDA stream while backward runs"


def predict(
    params: float, processes: int, one_process_seconds: float, bus_gbs: float | None
) -> dict[str, float]:
    """The planner's efficiency for `processes` on one node: each computes 1/N of the step one
    process takes (`one_process_seconds`), then all-reduces fp32 gradients at `bus_gbs`."""
    from thrifty.plan.scaling import scaling

    if processes == 1:
        return {"no_overlap": 1.0, "overlap": 1.0, "allreduce_seconds": 0.0}
    s = scaling(
        params,
        gpus_per_node=processes,
        compute_seconds=one_process_seconds / processes,
        intra_node_gbs=bus_gbs or 0.0,
        grad_bytes_per_param=GRAD_BYTES_PER_PARAM,
    )
    return {
        "no_overlap": s.efficiency_no_overlap,
        "overlap": s.efficiency_overlap,
        "allreduce_seconds": s.allreduce_seconds,
    }


def compare(
    plan: ScalePlan, summaries: Mapping[int, Mapping[str, Any]], bus: Mapping[int, float]
) -> dict[str, Any]:
    """Throughput, speed-up and efficiency per count against the smallest, beside the planner's
    prediction. `bus` holds the bus bandwidth (GB/s per direction) of each count above 1."""
    base_n = plan.counts[0]
    base = summaries[base_n]
    key, unit = _throughput(base)
    params = base["parameters"]
    one_process = base["step_seconds"] * base_n  # the whole global batch on one process
    overlap, why = overlap_applies(plan.device, params * GRAD_BYTES_PER_PARAM)
    base_pred = predict(params, base_n, one_process, bus.get(base_n))
    rows = []
    for n in plan.counts:
        s = summaries[n]
        speedup = s[key] / base[key]
        pred = predict(params, n, one_process, bus.get(n))
        # Relative to the baseline, as the measured efficiency is.
        no_overlap = pred["no_overlap"] / base_pred["no_overlap"]
        with_overlap = pred["overlap"] / base_pred["overlap"]
        rows.append(
            {
                "processes": n,
                "run_dir": str(plan.run_dir(n)),
                "strategy": s.get("strategy"),
                "omp_num_threads": plan.threads(n),
                "accumulation_steps": s.get("accumulation_steps"),
                "steps": s.get("steps"),
                "step_seconds": s["step_seconds"],
                "breakdown": s.get("breakdown"),  # mean seconds per step, by phase
                "throughput": s[key],
                "speedup": speedup,
                "efficiency": speedup / (n / base_n),
                "bus_gbs": bus.get(n),
                "predicted_allreduce_seconds": pred["allreduce_seconds"],
                "predicted_efficiency_no_overlap": no_overlap,
                "predicted_efficiency_overlap": with_overlap,
                "predicted_efficiency": with_overlap if overlap else no_overlap,
            }
        )
    return {
        "config": plan.config,
        "out": str(plan.out),
        "steps": plan.steps,
        "device": plan.device,
        "backend": plan.backend,
        "global_batch": plan.effective,
        "global_batch_from": "the config's batch.effective"
        if plan.effective_from_config
        else f"batch.effective unset: micro x lcm({', '.join(map(str, plan.counts))})",
        "micro": plan.micro,
        "cpus": plan.cpus,
        "omp_from_environment": plan.user_omp is not None and plan.device == "cpu",
        "parameters": params,
        "gradient_bytes": params * GRAD_BYTES_PER_PARAM,
        "unit": unit,
        "baseline_processes": base_n,
        "prediction_applies": "overlap" if overlap else "no_overlap",
        "prediction_applies_because": why,
        "counts": rows,
        "conclusion": conclusion(rows, overlap, unit),
    }


def _throughput(summary: Mapping[str, Any]) -> tuple[str, str]:
    """Tokens per second for a token task, else samples per second: (summary key, unit)."""
    if summary["tokens_per_second"]:
        return "tokens_per_second", "tokens/s"
    return "samples_per_second", "samples/s"


def conclusion(rows: Sequence[Mapping[str, Any]], overlap: bool, unit: str) -> str:
    """One line on the largest count: does adding processes pay, and as the planner said?"""
    base, top = rows[0], rows[-1]
    if len(rows) == 1:
        return f"only {base['processes']} process(es) measured: give two or more counts to compare"
    n, n0 = top["processes"], base["processes"]
    measured, predicted = top["efficiency"], top["predicted_efficiency"]
    head = (
        f"{n} processes give {top['speedup']:.2f}x the {unit} of {n0} ({measured:.0%} "
        f"efficient); the planner predicted {predicted:.0%} ({'with' if overlap else 'no'} overlap)"
    )
    gap = round((measured - predicted) * 100)
    if top["speedup"] < 1:
        return f"{head}: more processes are slower here, keep {n0}"
    if abs(gap) <= CLOSE * 100:
        return f"{head}: as predicted"
    if gap < 0:
        return (
            f"{head}: {-gap} points lower, so the step has costs the all-reduce model leaves out "
            "(work every process repeats, ranks waiting for each other, cores shared by compute "
            "and communication)"
        )
    threads0, threads = base["omp_num_threads"], top["omp_num_threads"]
    if threads0 is not None and threads0 != threads:
        return (
            f"{head}: {gap} points higher, so one process made less of {threads0} threads than "
            f"{n} processes of {threads} each (OMP_NUM_THREADS=1 compares at equal threads)"
        )
    return f"{head}: {gap} points higher, so more of the all-reduce was hidden than modelled"


# --------------------------------------------------------------------------------------------
# The command


def run_scale(
    args: argparse.Namespace, runner: Runner | None = None, bus_meter: BusMeter | None = None
) -> int:
    """The handler. `runner` and `bus_meter` replace the child runs and the bandwidth
    measurement (tests)."""
    plan = make_plan(args)
    _prepare_out(plan, args.overwrite)
    runner = runner or ChildRunner(plan)
    crowded = [n for n in plan.counts if plan.device == "cpu" and n > plan.cpus]
    if crowded:
        _say(f"{crowded[0]} processes on {plan.cpus} CPUs: they share cores, expect it slower")
    summaries = {}
    for n in plan.counts:
        _say(f"{n} process{'es' if n > 1 else ''} -> {plan.run_dir(n)}")
        summaries[n] = _checked(runner(n), n, plan)
        s = summaries[n]
        rate, unit = _throughput(s)
        _say(f"{n}: {s[rate]:,.1f} {unit}, {s['step_seconds'] * 1e3:,.1f} ms per step")
    bus, source = _bus(plan, args.bus_gbs, summaries[plan.counts[0]]["parameters"], bus_meter)
    report = compare(plan, summaries, bus)
    report["bus_source"] = source
    from thrifty.plan.report import to_json

    (plan.out / "scale.json").write_text(to_json(report) + "\n")
    if args.json:
        print(to_json(report))
    else:
        print_report(report)
    return 0


def make_plan(args: argparse.Namespace) -> ScalePlan:
    """Check every option and the config up front, before any run starts."""
    from thrifty.config import load_config, parse_set_args

    counts = parse_nprocs(args.nprocs)
    if args.steps < 2:
        raise ConfigError(
            f"--steps {args.steps} is invalid: the first step is warm-up and not measured; "
            "give 2 or more (e.g. --steps 20)"
        )
    if args.bus_gbs is not None and not (math.isfinite(args.bus_gbs) and args.bus_gbs > 0):
        raise ConfigError(
            f"--bus-gbs {args.bus_gbs:g} is invalid: give GB/s per direction, above 0"
        )
    pairs = [*parse_set_args(args.overrides), ("run.max_steps", args.steps)]
    config = load_config(args.config, pairs)
    micro, effective = config.batch.micro, config.batch.effective
    device = _device(config.run.device, max(counts))
    user_omp = os.environ.get("OMP_NUM_THREADS", "").strip()
    if not (user_omp.isdigit() and int(user_omp) > 0):
        user_omp = ""  # unset, or not a count the children could use: ours replaces it
    return ScalePlan(
        config=str(args.config),
        counts=counts,
        steps=args.steps,
        out=Path(args.out) if args.out else Path("runs") / f"scale-{config.run.name}",
        micro=micro,
        effective=global_batch(micro, effective, counts),
        effective_from_config=effective is not None,
        device=device,
        cpus=available_cpus(),
        user_omp=user_omp or None,
        overrides=list(args.overrides),
    )


def _device(device: str, most: int) -> str:
    if device == "cpu":
        return "cpu"
    if device == "mps":
        raise ConfigError("thrifty scale runs on CPU or CUDA: set run.device = cpu or cuda")
    import torch

    if device == "auto" and not torch.cuda.is_available():
        return "cpu"
    gpus = torch.cuda.device_count()
    if most > gpus:
        raise ConfigError(
            f"--nprocs asks for {most} processes, one GPU each, but {gpus} GPU(s) are visible: "
            f"give counts up to {gpus}, or --set run.device=cpu"
        )
    return "cuda"


def _prepare_out(plan: ScalePlan, overwrite: bool) -> None:
    out = plan.out
    if out.exists() and not out.is_dir():
        raise ThriftyError(f"--out {out} is a file: give a directory")
    ours = [plan.run_dir(n) for n in plan.counts] + [out / "scale.json"]
    present = [p for p in ours if p.exists()]
    if present and not overwrite:
        raise ThriftyError(
            f"--out {out} already holds {present[0].name} from an earlier run: choose another "
            "--out, or replace those runs with --overwrite"
        )
    for path in present:
        # Only what this command wrote: a run directory it logged into (train.log), or empty.
        if path.is_dir() and any(path.iterdir()) and not (path / "train.log").exists():
            raise ThriftyError(
                f"{path} was not written by thrifty scale (it has no train.log): move it away "
                "or choose another --out"
            )
    for path in present:
        _say(f"replacing {path} (--overwrite)")
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ThriftyError(f"cannot create --out {out}: {exc.strerror}") from exc


def _checked(summary: Mapping[str, Any], n: int, plan: ScalePlan) -> Mapping[str, Any]:
    """A summary with what the comparison needs, from a run that did what was asked."""
    where = plan.run_dir(n) / "summary.json"
    missing = [k for k in SUMMARY_KEYS if not isinstance(summary.get(k), int | float)]
    if missing:
        raise ThriftyError(
            f"{where} has no {missing[0]}: this thrifty train is older than thrifty scale "
            "needs (reinstall thrifty)"
        )
    if summary.get("world_size", n) != n:
        raise ThriftyError(
            f"{where} reports world size {summary['world_size']}, not {n}: the train command "
            "did not run --nprocs processes"
        )
    if summary.get("effective_batch", plan.effective) != plan.effective:
        raise ThriftyError(
            f"{where} reports a global batch of {summary['effective_batch']}, not "
            f"{plan.effective}: the counts would not be comparable"
        )
    if not summary["step_seconds"] > 0 or not summary["samples_per_second"] > 0:
        raise ThriftyError(
            f"{where} measured no step after warm-up: give more --steps (e.g. --steps 20)"
        )
    return summary


def _bus(
    plan: ScalePlan, given: float | None, params: float, meter: BusMeter | None
) -> tuple[dict[int, float], str]:
    """Bus bandwidth per count above 1, and where it came from."""
    counts = [n for n in plan.counts if n > 1]
    if given is not None:
        return dict.fromkeys(counts, given), "--bus-gbs"
    from thrifty.plan.units import fmt_bytes

    meter = meter or measure_bus_bandwidth
    nbytes = int(min(params * GRAD_BYTES_PER_PARAM, MAX_BUS_BYTES))
    bus = {}
    for n in counts:
        bus[n] = meter(n, nbytes, plan.backend)
        _say(f"bus bandwidth, {n} {plan.backend} processes: {bus[n]:.3g} GB/s")
    cap = " (capped)" if params * GRAD_BYTES_PER_PARAM > MAX_BUS_BYTES else ""
    return bus, (
        f"measured: {plan.backend} all-reduce of {fmt_bytes(nbytes)}{cap}, the model's fp32 "
        "gradients; busbw = bytes/s x 2(n-1)/n"
    )


def _say(message: str) -> None:
    print(f"thrifty scale: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Printing


def print_report(report: Mapping[str, Any]) -> None:
    from rich.markup import escape

    from thrifty.plan.report import Table, console

    out = console()
    rows = report["counts"]
    out.print(
        escape(
            f"thrifty scale: {report['config']}, global batch {report['global_batch']}, "
            f"{report['steps']} steps per count, {report['device']} ({report['backend']})"
        ),
        style="bold",
    )
    table = Table(pad_edge=False)
    applies = report["prediction_applies"]
    columns = ["processes", "strategy", "threads", "accum", "ms/step", report["unit"], "speedup"]
    columns += ["efficiency", "predicted\nno overlap", "predicted\noverlap", "bus\nGB/s"]
    for name in columns:
        if name.endswith("\n" + applies.replace("_", " ")):
            name = name.replace("\n", " *\n")  # the prediction that applies
        table.add_column(name, justify="left" if name == "strategy" else "right")
    for r in rows:
        table.add_row(
            str(r["processes"]),
            str(r["strategy"] or "-"),
            _dash(r["omp_num_threads"]),
            _dash(r["accumulation_steps"]),
            f"{r['step_seconds'] * 1e3:,.1f}",
            f"{r['throughput']:,.0f}",
            f"{r['speedup']:.2f}x",
            f"{r['efficiency']:.0%}",
            f"{r['predicted_efficiency_no_overlap']:.0%}",
            f"{r['predicted_efficiency_overlap']:.0%}",
            "-" if r["bus_gbs"] is None else f"{r['bus_gbs']:.3g}",
        )
    out.print(table)
    base = report["baseline_processes"]
    if report["device"] == "cpu":
        threads = (
            "OMP_NUM_THREADS from your environment, the same at every count"
            if report["omp_from_environment"]
            else f"OMP_NUM_THREADS = {report['cpus']} CPUs // processes"
        )
    else:
        threads = "OMP_NUM_THREADS left as the launcher sets it (CUDA run)"
    notes = [
        f"threads: {threads}",
        f"global batch: {report['global_batch']} samples per step at every count (micro "
        f"{report['micro']}; {report['global_batch_from']})",
        f"efficiency: {report['unit']} at N / (N/{base} x {report['unit']} at {base})",
        f"predicted: thrifty.plan.scaling with {report['parameters']:,} parameters x "
        f"{GRAD_BYTES_PER_PARAM} bytes of gradients and the compute of one step = "
        f"{rows[0]['step_seconds'] * base * 1e3:,.1f} ms / N (the step at {base} x {base}/N)",
        f"* applies: {report['prediction_applies_because']}",
        f"bus bandwidth: {report['bus_source']}",
    ]
    for note in notes:
        out.print(f"  {escape(note)}", soft_wrap=True)
    out.print(escape(report["conclusion"]), soft_wrap=True)


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)
