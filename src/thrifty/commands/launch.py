"""`thrifty launch`: run a config on a spot fleet through SkyPilot or Slurm.

It writes the engine's own job file from the config (a SkyPilot task YAML or an sbatch
script), prints the planner's cost estimate first, and submits the file when the engine is
installed here. Registering only builds the parser; the handler imports the rest.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from thrifty.commands.plan.options import COUNT, FRACTION
from thrifty.console import add_config_options, add_output_options

if TYPE_CHECKING:
    from thrifty.fleet.request import LaunchRequest


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `launch` to the `thrifty` command line."""
    parser = subparsers.add_parser(
        "launch",
        help="run a config on a (spot) fleet: write and submit a SkyPilot task or sbatch script",
        description="Write the engine's job file for CONFIG on N nodes of GPU:COUNT (a SkyPilot "
        "managed-job YAML or a Slurm sbatch script), print the planner's cost estimate "
        "(on-demand, spot, and spot with the expected interruptions) and submit the file "
        "when the engine is installed here. A preempted job saves an emergency checkpoint, "
        "exits 75, and the engine relaunches it; it resumes from --bucket. SkyPilot's "
        "machines install this very thrifty, shipped in .thrifty-launch/; a secret in "
        "--bucket or --set is never written: the file names the environment variable "
        "that carries it.",
    )
    parser.add_argument("--gpus", required=True, metavar="GPU:COUNT", help="per node, e.g. H100:8")
    parser.add_argument("--nodes", type=_positive_int, default=1, metavar="N", help="default 1")
    parser.add_argument("--spot", action="store_true", help="spot instances (SkyPilot use_spot)")
    parser.add_argument(
        "--bucket",
        metavar="URL",
        help="checkpoint location every node and every relaunch reads, e.g. s3://B/run "
        "(sets checkpoint.location; needed for more than one node)",
    )
    parser.add_argument("--engine", choices=("skypilot", "slurm"), default="skypilot")
    parser.add_argument("--dry-run", action="store_true", help="print the file, write nothing")
    add_output_options(
        parser,
        out="default: beside the config",
        out_metavar="FILE",
        overwrite="replace an --out that thrifty launch wrote",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        metavar="K",
        help="relaunches after a failure that is not a preemption (default 3)",
    )
    parser.add_argument("--time", metavar="DURATION", help="Slurm time limit, e.g. 24h")
    sweep = parser.add_argument_group("a sweep instead of one run (thrifty sweep on every node)")
    sweep.add_argument(
        "--sweep",
        metavar="SPACE.toml",
        help="start one sweep worker per node, a trial per GPU, instead of one training run",
    )
    sweep.add_argument(
        "--storage",
        metavar="URL",
        help="the study the nodes share (postgresql://...); it travels in THRIFTY_SWEEP_STORAGE, "
        "never in the file; needed with more than one node",
    )
    sweep.add_argument("--study", metavar="NAME", help="the study's name (default: the run's name)")
    _cost_options(parser)
    add_config_options(parser)
    parser.set_defaults(handler=run_launch)


def _cost_options(parser: argparse.ArgumentParser) -> None:
    cost = parser.add_argument_group("the cost estimate (thrifty plan's figures)")
    cost.add_argument("--instance", metavar="NAME", help="catalog instance to price the job on")
    cost.add_argument(
        "--params", type=COUNT, metavar="N", help="e.g. 7B (default: counted from task.model)"
    )
    cost.add_argument(
        "--tokens",
        type=COUNT,
        metavar="D",
        help="e.g. 140B (default: run.max_tokens, or run.max_steps x batch x --seq)",
    )
    cost.add_argument("--seq", type=_positive_int, metavar="T", help="tokens per sample")
    cost.add_argument("--mfu", type=FRACTION, metavar="F", help="0-1 (default 0.35)")


def launch_request(args: argparse.Namespace) -> LaunchRequest:
    """The typed request `thrifty.fleet` runs, from the parsed command line."""
    from thrifty.fleet.request import CostFigures, LaunchRequest

    return LaunchRequest(
        config=args.config,
        overrides=tuple(args.overrides),
        gpus=args.gpus,
        nodes=args.nodes,
        spot=args.spot,
        bucket=args.bucket,
        engine=args.engine,
        dry_run=args.dry_run,
        out=args.out,
        overwrite=args.overwrite,
        max_restarts=args.max_restarts,
        time=args.time,
        sweep=args.sweep,
        storage=args.storage,
        study=args.study,
        cost=CostFigures(
            instance=args.instance,
            params=args.params,
            tokens=args.tokens,
            seq=args.seq,
            mfu=args.mfu,
        ),
    )


def run_launch(args: argparse.Namespace) -> int:
    """Print the cost, then print (--dry-run), write, or write and submit the job file."""
    from thrifty.fleet.launching import run

    return run(launch_request(args))
