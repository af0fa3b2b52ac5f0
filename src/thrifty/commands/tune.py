"""`thrifty tune`: search the cost levers for the configuration with the lowest cost per token.

Registering only builds the parser; the handler imports the search (and torch) when it runs.
"""

from __future__ import annotations

import argparse

from thrifty.console import add_config_options, add_output_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tune` to the `thrifty` command line."""
    parser = subparsers.add_parser(
        "tune",
        help="search precision, activation checkpointing, micro-batch, torch.compile and "
        "data-loader workers for the lowest cost per token",
        description="Run short measured trials of CONFIG, each in its own process, one lever "
        "at a time in order of impact (workers, precision, the largest micro-batch that fits "
        "under each activation-checkpointing policy, torch.compile), at the configured "
        "effective batch, within --budget. Prints a table of the trials, the winner (written "
        "as a TOML file thrifty train runs as is) and the waterfall from the config as given "
        "to the winner, lever by lever.",
    )
    parser.add_argument(
        "--budget",
        default="10m",
        metavar="TIME",
        help="time for the whole search, e.g. 90s, 10m, 1h (default 10m); candidates it "
        "leaves no time for are listed as not reached",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=20,
        metavar="N",
        help="optimizer steps per trial (default 20; the first, and with torch.compile the "
        "first 3, are warm-up and not measured)",
    )
    parser.add_argument(
        "--instance",
        metavar="NAME",
        help="catalog instance to price the job on (default: the config's [cost] section)",
    )
    parser.add_argument(
        "--levers",
        metavar="L,L,...",
        help="levers to search (default all): workers, precision, micro, checkpointing, compile",
    )
    parser.add_argument(
        "--micro",
        metavar="auto|N,N,...",
        help="micro-batch sizes to try (divisors of the effective batch) instead of auto, "
        "the largest that fits",
    )
    add_output_options(
        parser,
        out="where the trials and winner.toml go (default runs/tune-<config>); the same "
        "command resumes a tune stopped there",
        overwrite="replace what an earlier tune left in --out (never other files: a folder "
        "holding them is refused); without it, an unfinished tune of the same search is resumed",
        json=True,
    )
    add_config_options(parser)
    parser.set_defaults(handler=run_tune_command)


def run_tune_command(args: argparse.Namespace) -> int:
    """Tune, print the report (whatever trials finished) and, when no trial found a winner,
    raise the one line that says why (exit code 2). Stopped by SIGTERM or SIGINT: one line,
    exit code 75, and the same command resumes."""
    from thrifty.config import parse_set_args
    from thrifty.console import call_with_options, say, to_json
    from thrifty.errors import ThriftyError
    from thrifty.search.tune.report import print_report, result_dict
    from thrifty.search.tune.session import make_plan, read_given, run_tune
    from thrifty.search.tune.stopping import TuneStopped

    given = read_given(args.config, parse_set_args(args.overrides))
    plan = call_with_options(make_plan, args, given, args.config)
    try:
        result = run_tune(plan)
    except TuneStopped as exc:
        say("tune", exc)
        return exc.exit_code
    if any(t.status != "stopped" for t in result.trials):
        if args.json:
            print(to_json(result_dict(result)))
        else:
            print_report(result)
    if result.reason is not None:
        raise ThriftyError(result.reason)
    return 0
