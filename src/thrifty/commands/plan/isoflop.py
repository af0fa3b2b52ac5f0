"""`thrifty plan isoflop`: lay out an IsoFLOP grid of runs of CONFIG and run it as a sweep.

    thrifty plan isoflop CONFIG --size KEY=V1,V2,V3 --flops C1,C2,C3 [--out DIR]
        [--workers K] [--storage URL] [--set KEY=VALUE] [--dry-run] [--json]

For each size of the knob and each FLOP budget, one run of D = C / (6N) tokens (N counted by
building the model on the meta device, without allocating its weights); the runs are the
trials of a sweep in --out (thrifty.search.sweep.isoflop), so a preempted run resumes and the same
command continues the grid. Then `thrifty plan fit DIR` fits the law on them. Registering imports neither torch nor Optuna.
"""

from __future__ import annotations

import argparse

from thrifty.commands.sweep import add_worker_options
from thrifty.console import add_config_options, add_output_options


def register_isoflop(commands: argparse._SubParsersAction) -> None:
    """Add `isoflop` under `thrifty plan`."""
    parser = commands.add_parser(
        "isoflop",
        help="lay out and run an IsoFLOP grid of CONFIG for `thrifty plan fit`",
        description="For each size of a knob of CONFIG's model and each FLOP budget, one run "
        "trained on C / (6N) tokens (N counted by building the model without allocating it, the "
        "tokens turned into run.max_steps), run as a sweep in --out: spot-safe, resumable, "
        "several workers. Fit the result with `thrifty plan fit DIR`.",
    )
    parser.add_argument(
        "--size",
        required=True,
        metavar="KEY=V1,V2,...",
        help="the size knob and at least 3 sizes, e.g. task.model_args.n_embd=64,96,128",
    )
    parser.add_argument(
        "--flops",
        required=True,
        metavar="C1,C2,...",
        help="the FLOP budgets, e.g. 1e13,3e13,1e14 (each size runs at each)",
    )
    add_worker_options(parser, "runs")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the grid's runs and run nothing"
    )
    add_output_options(
        parser,
        out="the grid's folder, a sweep's (default runs/isoflop-<config>); the same command "
        "continues the grid there",
        json="print the grid (and the sweep's record) as JSON",
    )
    add_config_options(parser)
    parser.set_defaults(handler=run_isoflop_command)


def run_isoflop_command(args: argparse.Namespace) -> int:
    """Lay the grid out and print it; run it as a sweep unless --dry-run. Stopped by SIGTERM or
    SIGINT: one line, exit code 75, and the same command continues it."""
    import shlex
    from pathlib import Path

    from thrifty.commands.plan.options import count
    from thrifty.console import Table, call_with_options, console, say, to_json
    from thrifty.errors import ConfigError, ThriftyError
    from thrifty.search.sweep.isoflop import layout, parse_sizes, run_grid

    key, sizes = parse_sizes(args.size)
    try:
        budgets = [count(item) for item in args.flops.split(",")]
    except (ConfigError, ValueError):
        raise ConfigError(
            f"--flops {args.flops!r}: give FLOP budgets, e.g. 1e13,3e13,1e14"
        ) from None
    if args.workers < 1:
        raise ThriftyError(f"--workers {args.workers} is invalid: at least 1")
    runs = layout(args.config, key, sizes, budgets, args.overrides)
    grid = [r.as_dict() for r in runs]
    if not args.json:
        table = Table(title=f"IsoFLOP grid: {len(runs)} runs of {args.config}")
        for column in (key, "parameters", "budget (FLOPs)", "steps", "tokens", "tokens/param"):
            table.add_column(column, justify="right")
        for r in runs:
            table.add_row(
                f"{r.size:g}",
                f"{r.params:,}",
                f"{r.flops:.3g}",
                f"{r.steps:,}",
                f"{r.tokens:,}",
                f"{r.tokens / r.params:.1f}",
            )
        console().print(table)
    if args.dry_run:
        if args.json:
            print(to_json({"size": key, "runs": grid}))
        return 0
    try:
        from thrifty.search.sweep.report import print_table
        from thrifty.search.sweep.runner import SweepStopped
    except ImportError as exc:
        if "optuna" not in str(exc):
            raise
        raise ThriftyError(
            "thrifty plan isoflop runs a sweep: pip install 'thrifty[sweep]'"
        ) from None
    out = Path(args.out) if args.out else Path("runs") / f"isoflop-{Path(args.config).stem}"
    try:
        record = call_with_options(
            run_grid, args, args.config, key, runs, out, say=lambda line: say("plan isoflop", line)
        )
    except SweepStopped as exc:
        say("plan isoflop", str(exc))
        return exc.exit_code
    if args.json:
        print(to_json({"size": key, "runs": grid, "sweep": record}))
    else:
        print_table(record, out)
        say("plan isoflop", f"fit the law on these runs: thrifty plan fit {shlex.quote(str(out))}")
    return 0
