"""A warm worker: the long-lived process in which a search (`thrifty tune`, `thrifty sweep`)
runs its trials one after another, `python -m thrifty.worker REPORTS,ORDERS`.

It imports torch and thrifty once; each trial then pays for its own model, data and steps
only. The search side is `thrifty.search.engine`, which says what a worker shares between
trials and what it never does.

Start: the search sends a JSON object as the tether of `thrifty.children` ({"marker": M}), so
the worker ends with the search, however the search ends. Then, on ORDERS, one JSON line per
trial: {"command": "train", "options": [...], "config": TEXT, "answers": true|false}. The
config (credentials included) reaches the run through a pipe of this process, never a file.
The worker runs `thrifty <command> CONFIG <options>` in its main thread with the trial's report
(`thrifty.callbacks.trial_report.TrialReport`) as a callback, on REPORTS and, with answers, on
ORDERS (the search answers a trial's evaluations there while it runs). Around each trial it
writes the lines "M begin" and "M end" on its output, so the search files the trial's output in
the trial's own log; after the end it writes {"done": EXIT_CODE, "leaving": BOOL} on REPORTS.
The end of ORDERS (the search closed it) ends the worker; so does a trial stopped by a signal
(exit 75 without its search's "pause"): the stop was meant for the process, a scheduler's
SIGTERM to every process of the job, a cloud's notice. It then says "leaving" and exits.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import logging
import os
import random
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Sequence
from typing import Any

from thrifty.records.stop_signals import EXIT_PREEMPTED

# Signals a trial's run may take over; each is put back as it was before the next trial.
_SIGNALS = tuple(
    getattr(signal, name)
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT")
    if hasattr(signal, name)
)


def main(argv: Sequence[str]) -> int:
    from thrifty.callbacks.trial_report import read_line
    from thrifty.children import tethered

    settings = json.loads(tethered())
    faulthandler.enable()  # a crash in native code still says where: "Fatal Python error: ..."
    marker = str(settings["marker"])
    reports, orders = _pipes(argv[0] if argv else "")

    from thrifty.lazy import load_torch

    load_torch()
    import thrifty.cli
    import thrifty.run.trainer  # noqa: F401 (what every trial would import again)

    clean = CleanState()
    while True:
        order = read_line(orders)
        if not order:  # the search closed its end: no more trials
            return 0
        _mark(marker, "begin")
        try:
            code, paused = _run(json.loads(order), reports, orders)
        finally:
            clean.restore()
            _mark(marker, "end")
        leaving = code == EXIT_PREEMPTED and not paused
        _write_all(reports, (json.dumps({"done": code, "leaving": leaving}) + "\n").encode())
        if leaving:
            return 0


def _run(order: dict[str, Any], reports: int, orders: int) -> tuple[int, bool]:
    """The trial's exit code, and whether its search paused it."""
    from thrifty.callbacks.trial_report import TrialReport
    from thrifty.cli import main as thrifty_main

    report = TrialReport(reports, orders if order.get("answers") else None)
    report.ready()
    read, path = config_pipe(order["config"].encode())
    words = [order["command"], path, *order["options"]]
    try:
        code = thrifty_main(words, callbacks=[report])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the trial's error, never the worker's end: its traceback, exit 1
        traceback.print_exc()
        code = 1
    finally:
        os.close(read)
        os.set_blocking(reports, True)
    return code, report.paused


class CleanState:
    """What a process starts with that a run may change, taken once when the worker is ready
    and put back after every trial: the random generators, torch's global switches, the
    environment, the working directory, the import path, the loggers, the warning filters and
    the signal handlers. Modules a trial imported from outside the installed packages (the
    user's own model and data modules) are forgotten, so the next trial imports them afresh,
    as a new process would; memory is collected and the CUDA cache emptied."""

    def __init__(self) -> None:
        import numpy as np
        import torch

        self.random = random.getstate()
        self.numpy = np.random.get_state()
        self.torch_rng = torch.get_rng_state()
        self.switches = _torch_switches()
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.path = list(sys.path)
        self.modules = set(sys.modules)
        self.loggers = _loggers()
        self.warnings = list(warnings.filters)
        self.signals = {signum: signal.getsignal(signum) for signum in _SIGNALS}
        self.installed = _installed_places()

    def restore(self) -> None:
        import numpy as np
        import torch

        for signum, handler in self.signals.items():
            if handler is not None:
                signal.signal(signum, handler)
        sys.stdout.flush()
        sys.stderr.flush()
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        sys.path[:] = self.path
        warnings.filters[:] = self.warnings  # type: ignore[index]
        _restore_loggers(self.loggers)
        self._forget_user_modules()
        random.setstate(self.random)
        np.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_rng)
        _set_torch_switches(self.switches)
        sys.last_value = sys.last_traceback = None  # an error's frames hold the run's tensors
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        _reset_peak_rss()

    def _forget_user_modules(self) -> None:
        for name in [name for name in sys.modules if name not in self.modules]:
            module = sys.modules.get(name)
            where = getattr(module, "__file__", None)
            if where and not any(where.startswith(place) for place in self.installed):
                del sys.modules[name]


def config_pipe(data: bytes) -> tuple[int, str]:
    """A pipe of this process holding `data`, and the path `thrifty train` reads it from: the
    config never touches a file. Close the descriptor once the run has read it."""
    read, write = os.pipe()

    def feed() -> None:
        with open(write, "wb") as f:
            f.write(data)

    threading.Thread(target=feed, daemon=True).start()
    return read, f"/dev/fd/{read}"


def _torch_switches() -> dict[str, Any]:
    import torch

    backends = torch.backends
    return {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_tf32": backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": backends.cudnn.allow_tf32,
        "cudnn_benchmark": backends.cudnn.benchmark,
        "cudnn_deterministic": backends.cudnn.deterministic,
        "dtype": torch.get_default_dtype(),
        "threads": torch.get_num_threads(),
        "grad": torch.is_grad_enabled(),
    }


def _set_torch_switches(switches: dict[str, Any]) -> None:
    import torch

    torch.use_deterministic_algorithms(switches["deterministic"], warn_only=switches["warn_only"])
    torch.set_float32_matmul_precision(switches["matmul_precision"])
    torch.backends.cuda.matmul.allow_tf32 = switches["cuda_tf32"]
    torch.backends.cudnn.allow_tf32 = switches["cudnn_tf32"]
    torch.backends.cudnn.benchmark = switches["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = switches["cudnn_deterministic"]
    torch.set_default_dtype(switches["dtype"])
    if torch.get_num_threads() != switches["threads"]:
        torch.set_num_threads(switches["threads"])
    torch.set_grad_enabled(switches["grad"])


def _loggers() -> dict[str, tuple[list[logging.Handler], int, bool]]:
    named = [logging.getLogger()] + [
        logger for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    ]  # fmt: skip
    return {
        logger.name: (list(logger.handlers), logger.level, logger.propagate) for logger in named
    }


def _restore_loggers(kept: dict[str, tuple[list[logging.Handler], int, bool]]) -> None:
    for logger in [logging.getLogger(), *logging.root.manager.loggerDict.values()]:
        if not isinstance(logger, logging.Logger):
            continue
        handlers, level, propagate = kept.get(logger.name, ([], logging.NOTSET, True))
        for handler in logger.handlers:
            if handler not in handlers:
                logger.removeHandler(handler)
                try:
                    handler.close()
                except Exception:  # a handler whose file is gone: nothing to keep
                    pass
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


def _installed_places() -> tuple[str, ...]:
    """Where installed modules live (the standard library, site-packages, thrifty itself): a
    module from anywhere else is the user's own."""
    import sysconfig

    import thrifty

    places = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    places.add(os.path.dirname(os.path.abspath(thrifty.__file__)))
    return tuple(os.path.join(os.path.realpath(p), "") for p in places) + tuple(
        os.path.join(p, "") for p in places
    )


def _reset_peak_rss() -> None:
    """Start the process's peak resident set (VmHWM) again: each trial's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux: the peak then spans the worker's trials
        pass


def _mark(marker: str, what: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    _write_all(1, f"{marker} {what}\n".encode())


def _write_all(fd: int, data: bytes) -> None:
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _pipes(word: str) -> tuple[int, int]:
    try:
        reports, orders = (int(part) for part in word.split(","))
    except ValueError:
        sys.exit(f"thrifty: error: the worker's pipes are {word!r}: give REPORTS,ORDERS")
    os.set_blocking(reports, True)
    return reports, orders


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
