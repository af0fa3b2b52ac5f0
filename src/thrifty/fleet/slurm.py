"""The sbatch script of a fleet job.

One task per node (`srun --ntasks-per-node=1`) runs thrifty's node agent, which starts one
worker per GPU and meets the other nodes on the first host of $SLURM_JOB_NODELIST. Slurm sends
SIGUSR1 to the job steps ahead of the time limit (`--signal=USR1@T`, without `B:`, which would
signal the batch shell only); every worker saves the emergency checkpoint and exits 75, the
step ends 75, and the batch script requeues the job, which resumes from the checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from thrifty.console import EXIT_USAGE
from thrifty.fleet.credentials import described
from thrifty.fleet.files import MARKER
from thrifty.fleet.job import FleetJob
from thrifty.fleet.shell import Env, Word, command
from thrifty.records.stop_signals import EXIT_PREEMPTED

# What `data.num_workers = "auto"` measures up to on each rank
# (`thrifty.data.loading.worker_candidates`).
AUTO_LOADER_WORKERS = 8
WRONG_ENV = (
    "thrifty: error: this job runs python -m thrifty, and the python on PATH has no "
    "thrifty {version}: activate the environment that has it before sbatch"
)


def time_limit(seconds: float) -> str:
    """`#SBATCH --time` form of a duration: D-HH:MM:SS, rounded up to the minute."""
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def cpus_per_task(job: FleetJob) -> int:
    """CPUs of the one task on each node: one per GPU's worker process plus its loader
    workers (`data.num_workers`; "auto" measures up to AUTO_LOADER_WORKERS per rank)."""
    workers = AUTO_LOADER_WORKERS if job.loader_workers is None else job.loader_workers
    return job.gpus.per_node * (1 + workers)


def sbatch_script(job: FleetJob, *, version: str) -> str:
    """The script's text. `version`: the thrifty that writes it, which the job checks it runs."""
    lead = job.signal_lead_seconds
    cpus = cpus_per_task(job)
    options = [
        f"--job-name={job.name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={job.gpus.per_node}",
        f"--cpus-per-task={cpus}",
        f"--signal=USR1@{lead}",
        "--requeue",
        "--open-mode=append",
        "--export=ALL",
        f"--output={job.name}-%j.out",
    ]
    if job.time_limit is not None:
        options.insert(5, f"--time={time_limit(job.time_limit)}")
    node = job.node_lines(
        Env("SLURM_JOB_NUM_NODES"),
        str(job.gpus.per_node),
        Env("HEAD"),
        Env("SLURM_JOB_ID"),
        location_in_env=False,
    )
    # srun no longer inherits sbatch's --cpus-per-task (Slurm 22.05): it is given again.
    srun: list[list[Word]] = [["srun", "--ntasks-per-node=1", f"--cpus-per-task={cpus}"]]
    comments = [
        "Submit it from the directory thrifty launch ran in: sbatch THIS_FILE",
        f"It runs the thrifty {version} of the Python environment active when it is",
        "submitted (sbatch passes PATH and VIRTUAL_ENV on): activate it before sbatch.",
        f"--cpus-per-task: {job.gpus.per_node} worker processes, each with its loader workers.",
        *described(job.passed()),
    ]
    lines = [
        "#!/bin/bash",
        MARKER,
        *(f"# {line}" for line in comments),
        *(f"#SBATCH {option}" for option in options),
        "",
        *job.required_lines(),
        *_version_check(version),
        f"# SIGUSR1 comes {lead} s before the time limit: enough for the emergency checkpoint",
        "# (checkpoint.upload_deadline plus the agent's margin) and Slurm's lateness.",
        *_placement(job),
        "",
        command([*srun, *node]),
        "code=$?",
        f"# {EXIT_PREEMPTED}: preempted with its checkpoint saved; queue the job again to resume.",
        f'if [ "$code" -eq {EXIT_PREEMPTED} ]; then',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def _placement(job: FleetJob) -> list[str]:
    """Where the job's processes start: a sweep worker on every node, or rank 0 and the
    rendezvous on the first node."""
    if job.sweep is not None:
        return [
            "# One sweep worker on every node, a trial per GPU, all taking trials from one study."
        ]
    return [
        "# Rank 0 and the rendezvous are on the first node of the allocation.",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    ]


def _version_check(version: str) -> list[str]:
    """Stop before the allocation is used when `python` is not the thrifty that wrote this."""
    check = (
        "import importlib.metadata as m, sys; "
        f'sys.exit(m.version("thrifty") != {json.dumps(version)})'
    )
    return [
        f"if ! python -c {shlex.quote(check)} 2>/dev/null; then",
        f"    echo {shlex.quote(WRONG_ENV.format(version=version))} >&2",
        f"    exit {EXIT_USAGE}",
        "fi",
    ]


def sbatch_executable() -> str | None:
    """The `sbatch` command on PATH, or None (the script is written, not submitted)."""
    return shutil.which("sbatch")


def submit(path: Path, sbatch: str, passed: Mapping[str, str]) -> int:
    """`sbatch` the script from the current directory, with the `passed` values (name →
    value) in the environment it exports to the job; returns sbatch's exit code."""
    env = {**os.environ, **passed}
    return subprocess.run([sbatch, str(path)], env=env, check=False).returncode


def submit_hint(path: Path) -> str:
    """The command to paste: the path quoted as a shell word (it may hold `$(...)` or `;`)."""
    return f"sbatch {shlex.quote(str(path))}"
