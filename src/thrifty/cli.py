"""The `thrifty` command line.

Each command lives in its own module with a `register(subparsers)` function that adds its parser
and sets `handler`; registering must stay cheap (no torch import), so `thrifty --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from thrifty.errors import ThriftyError

# Modules that contribute subcommands, in the order `thrifty --help` lists them.
COMMAND_MODULES = (
    "thrifty.commands.training",
    "thrifty.commands.profile",
    "thrifty.commands.chaos",
    "thrifty.plan.cli",
)

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"thrifty: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="thrifty", description="Make PyTorch training cost less.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.handler(args) or 0)
    except ThriftyError as exc:
        print(f"thrifty: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("thrifty: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
