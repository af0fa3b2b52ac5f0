"""`thrifty report`: one self-contained HTML page of a run, of several runs, of a tune, or of a
sweep.

Registering only builds the parser; the handler imports the report when it runs.
"""

from __future__ import annotations

import argparse

from thrifty.console import add_output_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `report` to the `thrifty` command line."""
    parser = subparsers.add_parser(
        "report",
        help="write one self-contained HTML page of a run (or several, a tune, or a sweep)",
        description="Write one HTML file that opens offline: the headline figures, loss with "
        "resumes, rollbacks and checkpoint saves marked, throughput and MFU, the step-time "
        "breakdown, system sampling, dollars against the projection, and the diagnosis. Given "
        "several runs, they are compared on the same axes first. Given a tune's --out, its "
        "trials table and waterfall. Given a sweep's --out, every trial's validation curve "
        "(pruned ones ending where they stopped), the trials table, the best trial and the "
        "command that runs it, the parameter importances, and each trial's cost with what "
        "pruning saved.",
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="a run directory (it holds metrics.jsonl), a tune's --out (it holds tune.json) or a "
        "sweep's --out (it holds sweep.json)",
    )
    add_output_options(
        parser,
        out="the HTML file to write (default RUN_DIR/report.html; required for several runs)",
        out_metavar="FILE",
        overwrite="replace the --out file when it exists (never a file thrifty did not write)",
    )
    parser.set_defaults(handler=run_report_command)


def run_report_command(args: argparse.Namespace) -> int:
    """Write the report and print its path; what was left out of a run's files is said on
    stderr, one `thrifty: ...` line each."""
    import logging

    from thrifty.reporting import render_report

    if not logging.getLogger("thrifty").hasHandlers():
        logging.basicConfig(level=logging.WARNING, format="thrifty: %(message)s")
    path = render_report(args.run_dirs, out=args.out, overwrite=args.overwrite)
    print(f"wrote {path}")
    return 0
