"""`thrifty sweep`: a hyperparameter search over thrifty runs, on Optuna.

Registering only builds the parser; the handler imports the search (and Optuna) when it runs.
"""

from __future__ import annotations

import argparse

from thrifty.console import add_config_options, add_output_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `sweep` to the `thrifty` command line."""
    parser = subparsers.add_parser(
        "sweep",
        help="search hyperparameters over whole thrifty runs, pruning the trials that cannot win",
        description="Run trials of CONFIG, each a whole `thrifty train` run (spot-safe "
        "checkpoints, the guard, every lever) in its own folder under --out, with the "
        "parameters Optuna samples from SPACE.toml. After each evaluation the pruner may stop "
        "a trial that cannot win. A preempted or killed trial resumes from its own checkpoint; "
        "the same command continues a stopped sweep. Writes sweep.json (every trial, the best, "
        "compute and dollars, what pruning saved) and best.toml, which thrifty train runs as is.",
    )
    parser.add_argument(
        "--space",
        required=True,
        metavar="SPACE.toml",
        help='one table per config key: ["optimizer.lr"] low, high, log = true; or choices = [...]',
    )
    parser.add_argument(
        "--trials",
        type=int,
        metavar="N",
        help="trials in the study at most (default: until the budget, or a stop signal)",
    )
    parser.add_argument(
        "--budget",
        metavar="TIME|$USD",
        help="trial time (2h: all trials' seconds summed) or dollars ($40, needs [cost]); no "
        "trial starts that the rest of the budget cannot pay for, and none in flight is cut off",
    )
    parser.add_argument(
        "--pruner",
        default="forecast",
        choices=("forecast", "asha", "hyperband", "median", "none"),
        help="which trials stop early (default forecast: the learning-curve forecast cannot "
        "beat the best finished trial)",
    )
    add_worker_options(parser, "trials")
    parser.add_argument(
        "--hang-after",
        metavar="TIME",
        help="end a trial that reports no step for this long (30m, 90s) as hung, with its "
        "worker (default 30m: a first step that compiles included)",
    )
    parser.add_argument(
        "--study", metavar="NAME", help="the study's name in --storage (default: --out's name)"
    )
    add_output_options(
        parser,
        out="the sweep's folder: the study, each trial's run, sweep.json and best.toml (default "
        "runs/sweep-<config>); the same command continues the sweep there",
        json="print sweep.json on stdout instead of the table",
    )
    add_config_options(parser)
    parser.set_defaults(handler=run_sweep_command)


def add_worker_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--workers (`what` at once on this machine) and --storage (the study several machines
    share), as every command that runs a sweep takes them."""
    parser.add_argument(
        "--workers", type=int, default=1, metavar="K", help=f"{what} at once on this machine"
    )
    parser.add_argument(
        "--storage",
        metavar="URL",
        help="a database several machines share the study through (postgresql://...); "
        "default: a journal file in --out",
    )


def run_sweep_command(args: argparse.Namespace) -> int:
    """Run the sweep, print its table (or JSON). Stopped by SIGTERM or SIGINT: one line, exit
    code 75, and the same command continues it."""
    from pathlib import Path

    from thrifty.console import call_with_options, say, to_json
    from thrifty.errors import ThriftyError

    try:
        from thrifty.search.sweep.plan import SweepOptions, make_sweep
        from thrifty.search.sweep.report import print_table
        from thrifty.search.sweep.runner import SweepStopped, run_sweep
    except ImportError as exc:
        if "optuna" not in str(exc):
            raise
        raise ThriftyError("thrifty sweep needs Optuna: pip install 'thrifty[sweep]'") from None

    out = Path(args.out) if args.out else Path("runs") / f"sweep-{Path(args.config).stem}"
    options = call_with_options(SweepOptions, args)
    plan = make_sweep(args.config, args.space, out, options, say=lambda line: say("sweep", line))
    try:
        record = run_sweep(plan)
    except SweepStopped as exc:
        say("sweep", str(exc))
        return exc.exit_code
    if args.json:
        print(to_json(record))
    else:
        print_table(record, out)
    return 0
