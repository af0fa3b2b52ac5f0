"""`--nprocs N`: start N local processes of the same command with torch's elastic launcher.

This is what `torchrun --standalone --nproc_per_node N -m thrifty ...` does, plus the exit code
the job should end with: torchrun turns any failed worker into exit code 1, while a preempted
job must end with EXIT_PREEMPTED (75) so a scheduler can tell "resume me" from "broken". For
several nodes, launch with torchrun itself (see docs/distributed.md).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from collections.abc import Sequence

from thrifty.errors import ConfigError
from thrifty.preemption import EXIT_PREEMPTED

EXIT_USAGE = 2


def strip_nprocs(argv: Sequence[str]) -> list[str]:
    """`argv` without its `--nprocs N` (or `--nprocs=N`)."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == "--nprocs":
            skip = i + 1 < len(argv)
            continue
        if arg.startswith("--nprocs="):
            continue
        out.append(arg)
    return out


def threads_per_process(nprocs: int, cpus: int | None = None) -> int:
    """CPU threads each process gets so that together they use the machine (or `cpus`) once."""
    if cpus is None:
        from thrifty.loading import available_cpus

        cpus = available_cpus()
    return max(1, cpus // nprocs)


def launch(nprocs: int, argv: Sequence[str]) -> int:
    """Run `python -m thrifty ARGV` in `nprocs` processes; returns the job's exit code."""
    if isinstance(nprocs, bool) or nprocs < 1:
        raise ConfigError(f"--nprocs {nprocs} is invalid: give the number of processes, 1 or more")
    if "RANK" in os.environ:
        raise ConfigError(
            "--nprocs cannot be used inside a job torchrun already launched: drop --nprocs"
        )
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The launcher's own log repeats every worker's failure as a report; thrifty says it in
    # one line below, and rank 0 has already printed the reason.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_process(nprocs)))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nprocs,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # a free port, like torchrun --standalone
        max_restarts=0,
        monitor_interval=0.1,
    )
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "thrifty", *strip_nprocs(argv))
    except ChildFailedError as exc:
        codes = {rank: failure.exitcode for rank, failure in exc.failures.items()}
        first_rank, _ = exc.get_first_failure()
        return _exit_code(codes, first_rank)
    except SignalException as exc:
        if exc.sigval == signal.SIGTERM:
            print(
                "thrifty: stopped by SIGTERM; every rank was told to save an emergency checkpoint: "
                f"run the same command to resume (exit code {EXIT_PREEMPTED})",
                file=sys.stderr,
            )
            return EXIT_PREEMPTED
        return 130
    return 0


def _exit_code(codes: dict[int, int], first: int) -> int:
    """The job's exit code from its ranks' (`first` failed first: the others were stopped)."""
    failed = {rank: code for rank, code in codes.items() if code != 0}
    rank = first if first in failed else min(failed)
    code = failed[rank]
    # The launcher stops the other ranks once one has exited; what that one says is the
    # job's outcome. Ranks leave a preempted run only after rank 0's emergency checkpoint.
    if code == EXIT_PREEMPTED or all(c == EXIT_PREEMPTED for c in failed.values()):
        return EXIT_PREEMPTED
    if code == EXIT_USAGE or any(c == EXIT_USAGE for c in failed.values()):
        return EXIT_USAGE  # rank 0 printed the one line
    reason = f"signal {-code}" if code < 0 else f"exit code {code}"
    print(
        f"thrifty: error: rank {rank} ended with {reason}; see its output above",
        file=sys.stderr,
    )
    return 1
