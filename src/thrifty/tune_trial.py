"""A trial's process: `python -m thrifty.tune_trial FD train ARGS...` is
`thrifty train CONFIG ARGS...` where CONFIG comes from the tune, not from a file.

The tune sends the trial's config (the config as given, credentials included) as the tether of
`thrifty.children`: the process reads it from its stdin, so no credential is written to
disk, and from then on it ends when the tune ends, however the tune ends. Each optimizer step
it completes writes "." to descriptor FD, a pipe the tune reads, after a "+" once torch and the
Trainer are imported: how the tune tells a trial that makes no progress (hung) from one the
budget ended while it was still starting.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    from thrifty.children import tethered
    from thrifty.cli import main as thrifty_main
    from thrifty.lazy import load_torch

    config = tethered()
    load_torch()
    report_progress(int(argv[0]))
    command, *options = argv[1:]
    return thrifty_main([command, config_path(config), *options])


def report_progress(fd: int) -> None:
    """Write "+" to `fd` once torch and the Trainer are imported, then "." after every
    optimizer step (never blocking: a full pipe drops it; the tune reads it often)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    import thrifty.trainer  # noqa: F401 (the imports a budget too small is spent on)
    from thrifty.tuning.trials import READY, STEP

    os.set_blocking(fd, False)

    def write(data: bytes) -> None:
        try:
            os.write(fd, data)
        except OSError:  # the pipe is full or the tune is gone (and this process with it)
            pass

    register_optimizer_step_post_hook(lambda *_: write(STEP))
    write(READY)


def config_path(data: bytes) -> str:
    """A path `thrifty train` reads `data` from: a pipe of this process, never a file."""
    read, write = os.pipe()

    def feed() -> None:
        with open(write, "wb") as f:
            f.write(data)

    threading.Thread(target=feed, daemon=True).start()
    return f"/dev/fd/{read}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
