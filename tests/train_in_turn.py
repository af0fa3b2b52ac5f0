"""Run several `thrifty train` command lines one after another in one process.

    python -m torch.distributed.run --standalone --nproc-per-node=2 tests/train_in_turn.py \\
        CONFIG --out DIR -- CONFIG --out DIR ...

Under torchrun this is one job whose ranks run a Trainer for each command line in turn, each
joining a process group of its own (on keys of its own in torchrun's shared store, its default:
leave TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset): one launch, and one torch import a rank, serve
all the runs. It stops at the first command line that does not end with 0, and exits with its
code, as that command would have.
"""

from __future__ import annotations

import sys

from thrifty.cli import main


def torchrun_in_turn(*lines: list[str], nprocs: int = 2) -> list[str]:
    """The command of one torchrun job of `nprocs` processes that trains each of `lines` (a
    `thrifty train` command line, without the `train`) in turn."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={nprocs}", __file__]
    for line in lines:
        command += [*line, "--"]
    return command[:-1]


def command_lines(words: list[str]) -> list[list[str]]:
    lines: list[list[str]] = [[]]
    for word in words:
        if word == "--":
            lines.append([])
        else:
            lines[-1].append(word)
    return [line for line in lines if line]


if __name__ == "__main__":
    for line in command_lines(sys.argv[1:]):
        code = main(["train", *line])
        if code:
            sys.exit(code)
