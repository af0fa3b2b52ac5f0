"""The `thrifty` command line.

Each command lives in its own module with a `register(subparsers)` function that adds its parser
and sets `handler`; registering must stay cheap (no torch import), so `thrifty --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from thrifty.console import EXIT_USAGE
from thrifty.errors import ConfigError, ThriftyError, command_line_words
from thrifty.lazy import load_torch
from thrifty.records.stop_signals import EXIT_PREEMPTED, StopRequested, StopSignals, stopping
from thrifty.redact import printed, redact_text, redacted_log_records

# Modules that contribute subcommands, in the order `thrifty --help` lists them.
COMMAND_MODULES = (
    "thrifty.commands.training",
    "thrifty.commands.profile",
    "thrifty.commands.chaos",
    "thrifty.commands.scale",
    "thrifty.commands.prices",
    "thrifty.commands.plan",
    "thrifty.commands.tune",
    "thrifty.commands.sweep",
    "thrifty.commands.report",
    "thrifty.commands.runs",
    "thrifty.commands.launch",
)

# Commands that train: a stop signal from their first moment is a clean stop (exit 75).
TRAINING_COMMANDS = ("train", "demo")

RANK0_GRACE_SECONDS = 5.0

if TYPE_CHECKING:
    from thrifty.callbacks import Callback


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line with exit code 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"thrifty: error: {printed(message)} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="thrifty", description="Make PyTorch training cost less.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None, *, callbacks: Sequence[Callback] = ()) -> int:
    """Run the command `argv` names (the process's arguments by default); `callbacks` go to
    the Trainer of a command that trains in this process (a trial's report to its search)."""
    with redacted_log_records():  # every log line of every command, whoever prints it
        return _run(list(sys.argv[1:] if argv is None else argv), tuple(callbacks))


def _run(words: list[str], callbacks: tuple[Callback, ...] = ()) -> int:
    if words[:1] and words[0] in TRAINING_COMMANDS:
        # Before the commands are even imported: the launcher's SIGTERM can come at any time.
        with stopping() as stops:
            try:
                load_torch(compiler=False)  # `train` adds it once it knows it trains here
                return _main(words, stops, callbacks)
            except StopRequested:  # a stop before the first step: nothing to save yet
                return _stopped(stops)
    return _main(words, None, callbacks)


def _main(words: list[str], stops: StopSignals | None, callbacks: tuple[Callback, ...] = ()) -> int:
    parser = build_parser()
    args = parser.parse_args(words)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return EXIT_USAGE
    args.argv = words
    if callbacks:
        args.callbacks = callbacks
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()  # a closed pipe is seen here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # a reader that stopped early (`| head`): a quiet end
        _discard_stdout()
        return 0
    except ThriftyError as exc:
        if stops is not None and _ended_by_stop(stops, exc):
            return _stopped(stops, exc)
        _report(exc)
        return int(getattr(exc, "exit_code", EXIT_USAGE))
    except Exception as exc:
        if stops is not None and _ended_by_stop(stops, exc):
            return _stopped(stops, exc)
        if not _lost_a_rank(exc):
            raise
        rank = os.environ.get("RANK", "0")
        text = redact_text(str(exc)).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        print(
            f"thrifty: error: rank {rank} lost contact with another rank ({first[:200]}); "
            "the first error above is the cause",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt as exc:  # its words: what a forced stop lost, if anything
        print(f"thrifty: interrupted{f': {exc}' if str(exc) else ''}", file=sys.stderr)
        return 130


def _ended_by_stop(stops: StopSignals, exc: Exception) -> bool:
    """An error during set-up after a stop signal came: most likely its doing (a rank the stop
    took away, a worker it killed). Bad input (exit code 2) and nothing to do (0) stay so."""
    if not stops.requested or stops.past_set_up:
        return False
    if not isinstance(exc, ThriftyError):
        return True
    return getattr(exc, "exit_code", EXIT_USAGE) not in (0, EXIT_USAGE)


def _stopped(stops: StopSignals, cause: BaseException | None = None) -> int:
    """A stop before the first step: one line (rank 0's), and the exit code to start again."""
    if os.environ.get("RANK", "0") == "0":
        print(redact_text(stops.line(cause)), file=sys.stderr)
    return EXIT_PREEMPTED


def _discard_stdout() -> None:
    """Point stdout at the null device, so that the flush at exit has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _lost_a_rank(exc: BaseException) -> bool:
    """A collective failed because another rank went away (it reports its own error)."""
    if "RANK" not in os.environ or "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("Connection closed by peer", "Connection reset by peer")
    )


def _report(exc: ThriftyError) -> None:
    """One line on stderr, secrets redacted. In a job of several processes, an error every rank
    raises alike (a config error, or one rank 0 shared) is printed by rank 0 only; others name
    their rank. Its fixes are worded as this command line's flags."""
    rank = os.environ.get("RANK", "0")
    message = printed(command_line_words(exc))
    if getattr(exc, "exit_code", EXIT_USAGE) == 0:  # nothing to do (a finished run): no error
        if rank == "0":
            print(f"thrifty: {message}", file=sys.stderr)
    elif rank == "0":
        print(f"thrifty: error: {message}", file=sys.stderr)
    elif not isinstance(exc, ConfigError) and not getattr(exc, "reported_by_rank0", False):
        print(f"thrifty: error: rank {rank}: {message}", file=sys.stderr)
    else:
        # A launcher stops every rank once one has exited: leave rank 0 the time to say it.
        import time

        time.sleep(RANK0_GRACE_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
