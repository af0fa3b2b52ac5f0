"""What runs on every node of a fleet job: `python -m thrifty.fleet.agent ... -- train CONFIG`.

It is torchrun's elastic agent (c10d rendezvous on the first node, one worker per GPU) with
thrifty's launcher around it (`thrifty.strategies.launcher`): the launcher forwards `spot.signals`
to the workers (torchrun's default set lacks SIGUSR1, Slurm's warning), waits for the
emergency upload before it kills them, and ends with 75 when the job was preempted. Plain
torchrun ends with 1 then, and the engine could not tell "resume me" from "broken".
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from thrifty.console import EXIT_USAGE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m thrifty.fleet.agent",
        description="Start this node's workers of a thrifty job on several nodes.",
    )
    parser.add_argument("--nnodes", type=int, required=True, metavar="N")
    parser.add_argument("--nproc-per-node", type=int, required=True, metavar="K")
    parser.add_argument("--rdzv-endpoint", required=True, metavar="HOST:PORT")
    parser.add_argument("--rdzv-id", required=True, metavar="ID")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K")
    parser.add_argument("--signals", default="SIGTERM,SIGINT,SIGUSR1", metavar="SIG,SIG")
    parser.add_argument("--upload-deadline", type=float, default=90.0, metavar="SECONDS")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- train CONFIG ...")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run this node's part of the job; returns its exit code (75: preempted, resume)."""
    from thrifty.errors import ThriftyError
    from thrifty.strategies.launcher import Rendezvous, launch

    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if not command:
            raise ThriftyError("no thrifty command to run: end with -- train CONFIG.toml")
        rendezvous = Rendezvous(
            nodes=args.nnodes,
            endpoint=args.rdzv_endpoint,
            run_id=args.rdzv_id,
            max_restarts=args.max_restarts,
        )
        return launch(
            args.nproc_per_node,
            command,
            signals=[s for s in args.signals.split(",") if s],
            upload_deadline=args.upload_deadline,
            rendezvous=rendezvous,
        )
    except ThriftyError as exc:
        from thrifty.redact import printed

        print(f"thrifty: error: {printed(str(exc))}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
