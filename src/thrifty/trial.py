"""A trial's process: `python -m thrifty.trial PIPES train ARGS...` is
`thrifty train CONFIG ARGS...` where CONFIG comes from the search (`thrifty tune`,
`thrifty sweep`), not from a file, and the run reports to the search.

The search sends the trial's config (the config as given, credentials included) as the tether
of `thrifty.children`: the process reads it from its stdin, so no credential is written to
disk, and from then on it ends when the search ends, however the search ends. PIPES names the
trial's pipes ("REPORTS" or "REPORTS,ANSWERS": descriptor numbers); the run reports on them
through its `thrifty.callbacks.trial_report.TrialReport` callback, which says once torch and the
Trainer are imported that the trial is ready to train: how a search tells a trial that makes no
progress (hung) from one the budget ended while it was still starting.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    from thrifty.callbacks.trial_report import TrialReport
    from thrifty.children import tethered
    from thrifty.cli import main as thrifty_main
    from thrifty.lazy import load_torch

    config = tethered()
    load_torch()
    import thrifty.run.trainer  # noqa: F401 (the imports a budget too small is spent on)

    report = TrialReport.from_argument(argv[0])
    report.ready()
    command, *options = argv[1:]
    return thrifty_main([command, config_path(config), *options], callbacks=[report])


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
