"""`--nprocs N`: start N local processes of the same command with torch's elastic launcher.

This is what `torchrun --standalone --nproc_per_node N -m thrifty ...` does, plus the exit code
the job should end with: torchrun turns any failed worker into exit code 1, while a preempted
job must end with EXIT_PREEMPTED (75) so a scheduler can tell "resume me" from "broken". The
same launcher runs one node of a job on several (`Rendezvous`): the job files `thrifty launch`
writes start it on every node (see docs/distributed.md).

Two launcher settings decide whether a preempted job keeps its emergency checkpoint. The signals
the launcher forwards to the workers: torch's default set (SIGTERM, SIGINT, SIGHUP, SIGQUIT)
lacks SIGUSR1, Slurm's warning, so the launcher would die of it and orphan its workers. And
how long it waits for the workers after forwarding one before it kills them: torch's default
is 30 s, less than `checkpoint.upload_deadline` (90 s by default) that an emergency save may
spend uploading.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from thrifty.console import EXIT_USAGE
from thrifty.errors import ConfigError
from thrifty.records.stop_signals import DEFAULT_SIGNALS, EXIT_PREEMPTED, parse_signals

# What torch's launcher handles by default; `spot.signals` is added to it.
_LAUNCHER_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
# Seconds a worker needs besides the upload: finish the step it is in, write the local copy,
# exit. A guess that errs long: a launcher waiting too long costs nothing, one too short
# kills the upload.
_GRACE_MARGIN = 30.0
# Set by the user, it wins over the grace computed from the upload deadline.
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
# Workers of a restarted group must not share the agent's rendezvous store: keys the first
# group left there (gloo's and NCCL's peer addresses) lead the next one to dead ports, and its
# process group times out (pytorch/pytorch#135712). "1": a fresh store for every group.
SEPARATE_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
# The launcher's pid, for its ranks: `follow_launcher`.
LAUNCHER_ENV = "THRIFTY_LAUNCHER_PID"
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun's agent in each worker it starts


def follow_launcher(signals: Sequence[str] = DEFAULT_SIGNALS) -> None:
    """In a rank this launcher or torchrun started: a stop signal (SIGTERM, else the first of
    `signals`) from the kernel when the launcher dies without forwarding one (SIGKILLed
    alone, by the OOM killer or by hand), so that the rank stops as on a preemption, saving
    its step, rather than train on with nobody to report to and hold the run directory's
    lock. torchrun's agent starts its workers from its main thread, whose end the kernel
    watches. Linux only; nothing for a process no launcher started."""
    launcher = os.environ.get(LAUNCHER_ENV)
    if launcher is None and TORCHRUN_ENV in os.environ:  # a worker of torchrun's agent
        launcher = str(os.getppid())
    if launcher is None or str(os.getppid()) != launcher:
        return
    from thrifty.children import parent_death_signal

    watched = parse_signals(signals)
    signum = signal.SIGTERM if signal.SIGTERM in watched else next(iter(watched), signal.SIGTERM)
    ask = parent_death_signal(signum)
    if ask is None:
        return
    ask()
    if str(os.getppid()) != launcher:  # it died before the kernel was asked
        os.kill(os.getpid(), signum)


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
        from thrifty.strategies.device import available_cpus

        cpus = available_cpus()
    return max(1, cpus // nprocs)


def worker_grace_seconds(upload_deadline: float) -> int:
    """Seconds the launcher should wait for workers it told to stop before killing them: the
    emergency upload's deadline (seconds) plus a margin for the step and the local write."""
    return math.ceil(upload_deadline + _GRACE_MARGIN)


def forwarded_signals(signals: Sequence[str] = DEFAULT_SIGNALS) -> str:
    """The launcher's `signals_to_handle`: torch's default set plus the ones the workers
    watch, comma-separated (what torchrun's `--signals-to-handle` takes)."""
    names = [*_LAUNCHER_SIGNALS, *(s.name for s in parse_signals(signals))]
    return ",".join(dict.fromkeys(names))


def _shutdown_settings(
    fields: set[str], signals: Sequence[str], upload_deadline: float
) -> dict[str, Any]:
    """LaunchConfig arguments this torch has (features detected, not versions checked)."""
    settings: dict[str, Any] = {}
    if "signals_to_handle" in fields:
        settings["signals_to_handle"] = forwarded_signals(signals)
    if "shutdown_timeout" in fields and SHUTDOWN_TIMEOUT_ENV not in os.environ:
        settings["shutdown_timeout"] = worker_grace_seconds(upload_deadline)
    return settings


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Rendezvous:
    """Where the nodes of one job meet (torch's c10d rendezvous), and how often torch's agent
    restarts the node's worker group after a failure before the job fails.

    `endpoint` is HOST:PORT on the first node (port 0: a free one, one node only); `run_id`
    names the job, the same on every node (None: a new one, one node only).
    """

    nodes: int = 1
    endpoint: str = "localhost:0"
    run_id: str | None = None
    max_restarts: int = 0

    def __post_init__(self) -> None:
        for name, low in (("nodes", 1), ("max_restarts", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} = {value!r} is invalid: give a whole number >= {low}")
        if self.nodes > 1 and (self.run_id is None or self.endpoint.endswith(":0")):
            raise ConfigError(
                f"a job on {self.nodes} nodes needs a rendezvous: give the first node's "
                "HOST:PORT and a job id, the same on every node"
            )


def launch(
    nprocs: int,
    argv: Sequence[str],
    *,
    signals: Sequence[str] = DEFAULT_SIGNALS,
    upload_deadline: float = 90.0,
    rendezvous: Rendezvous | None = None,
) -> int:
    """Run `python -m thrifty ARGV` in `nprocs` processes; returns the job's exit code.

    `signals`: the ones the workers watch (`spot.signals`), which the launcher forwards to
    them; `upload_deadline`: seconds an emergency save may upload
    (`checkpoint.upload_deadline`), which the launcher waits for, plus a margin, before it
    kills workers it told to stop. `rendezvous`: this node's part in a job on several nodes,
    or restarts of the worker group (default: one node, no restart).
    """
    meet = rendezvous or Rendezvous()
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
    os.environ.setdefault(SEPARATE_STORE_ENV, "1")
    os.environ[LAUNCHER_ENV] = str(os.getpid())  # the ranks stop if this process dies alone
    config = LaunchConfig(
        min_nodes=meet.nodes,
        max_nodes=meet.nodes,
        nproc_per_node=nprocs,
        run_id=meet.run_id or str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint=meet.endpoint,  # port 0: a free one, like torchrun --standalone
        max_restarts=meet.max_restarts,
        monitor_interval=0.1,
        **_shutdown_settings(
            {f.name for f in dataclasses.fields(LaunchConfig)}, signals, upload_deadline
        ),
    )
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "thrifty", *strip_nprocs(argv))
    except ChildFailedError as exc:
        codes = {rank: failure.exitcode for rank, failure in exc.failures.items()}
        first_rank, _ = exc.get_first_failure()
        return _exit_code(codes, first_rank)
    except SignalException as exc:
        watched = parse_signals(signals)
        if exc.sigval in watched and exc.sigval != signal.SIGINT:
            print(
                f"thrifty: stopped by {exc.sigval.name}; every rank was told to stop, saving a "
                "checkpoint if it had a step to save: run the same command to resume (exit code "
                f"{EXIT_PREEMPTED})",
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
    # A rank killed outright (the OOM killer, a lost machine) whose every survivor found a
    # checkpoint to resume from (they exited 75): the job is to run again.
    rest = [c for r, c in failed.items() if r != rank]
    if code < 0 and rest and all(c == EXIT_PREEMPTED for c in rest):
        return EXIT_PREEMPTED
    if code == EXIT_USAGE or any(c == EXIT_USAGE for c in failed.values()):
        return EXIT_USAGE  # rank 0 printed the one line
    reason = f"signal {-code}" if code < 0 else f"exit code {code}"
    print(
        f"thrifty: error: rank {rank} ended with {reason}; see its output above",
        file=sys.stderr,
    )
    return 1
