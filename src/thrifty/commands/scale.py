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
model's gradients (`thrifty.measure.bandwidth.measure_bus_bandwidth`). The comparison and its
table are in `scale_report`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty import children
from thrifty.commands.scale_report import compare, print_report, throughput_key
from thrifty.console import add_config_options, add_output_options, prepare_out, refuse_file, say
from thrifty.errors import ConfigError, ThriftyError
from thrifty.measure.bandwidth import MAX_BUS_BYTES, measure_bus_bandwidth
from thrifty.plan.scaling import DDP_GRAD_BYTES_PER_PARAM
from thrifty.strategies.launcher import threads_per_process

DEFAULT_STEPS = 20
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
        "--bus-gbs",
        type=float,
        metavar="X",
        help="all-reduce bus bandwidth in GB/s per direction for the prediction "
        "(default: measured on this machine)",
    )
    add_output_options(
        parser,
        out="where the runs go, DIR/nprocs-N (default runs/scale-<name>)",
        overwrite="replace runs an earlier scale left in --out",
        json=True,
    )
    add_config_options(parser)
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


class ChildRunner:
    """Runs one count as `python -m thrifty train` and returns its summary.json."""

    def __init__(self, plan: ScalePlan, launch: Launch = children.launch) -> None:
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
                f"(exit {code}): {children.first_error_line(log)} (log: {log})"
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
# The command


def run_scale(
    args: argparse.Namespace, runner: Runner | None = None, bus_meter: BusMeter | None = None
) -> int:
    """The handler. `runner` and `bus_meter` replace the child runs and the bandwidth
    measurement (tests)."""
    from thrifty.console import to_json
    from thrifty.rundir.files import write_json

    plan = make_plan(args)
    _prepare_out(plan, args.overwrite)
    runner = runner or ChildRunner(plan)
    crowded = [n for n in plan.counts if plan.device == "cpu" and n > plan.cpus]
    if crowded:
        say(
            "scale",
            f"{crowded[0]} processes on {plan.cpus} CPUs: they share cores, expect it slower",
        )
    summaries = {}
    for n in plan.counts:
        say("scale", f"{n} process{'es' if n > 1 else ''} -> {plan.run_dir(n)}")
        summaries[n] = _checked(runner(n), n, plan)
        s = summaries[n]
        rate, unit = throughput_key(s)
        say("scale", f"{n}: {s[rate]:,.1f} {unit}, {s['step_seconds'] * 1e3:,.1f} ms per step")
    bus, source = _bus(plan, args.bus_gbs, summaries[plan.counts[0]]["parameters"], bus_meter)
    report = compare(plan, summaries, bus)
    report["bus_source"] = source
    write_json(plan.out / "scale.json", report)
    if args.json:
        print(to_json(report))
    else:
        print_report(report)
    return 0


def make_plan(args: argparse.Namespace) -> ScalePlan:
    """Check every option and the config up front, before any run starts."""
    from thrifty.config import load_config, parse_set_args
    from thrifty.strategies.device import available_cpus

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
    micro, effective = config.batch.fixed_micro, config.batch.effective
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
    """Refuse runs an earlier scale left in --out unless --overwrite, which replaces only
    those; a folder this command did not write is never deleted."""
    out = plan.out
    refuse_file(out)
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
        say("scale", f"replacing {path} (--overwrite)")
    prepare_out(out, present)


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
    nbytes = int(min(params * DDP_GRAD_BYTES_PER_PARAM, MAX_BUS_BYTES))
    bus = {}
    for n in counts:
        bus[n] = meter(n, nbytes, plan.backend)
        say("scale", f"bus bandwidth, {n} {plan.backend} processes: {bus[n]:.3g} GB/s")
    cap = " (capped)" if params * DDP_GRAD_BYTES_PER_PARAM > MAX_BUS_BYTES else ""
    return bus, (
        f"measured: {plan.backend} all-reduce of {fmt_bytes(nbytes)}{cap}, the model's fp32 "
        "gradients; busbw = bytes/s x 2(n-1)/n"
    )
