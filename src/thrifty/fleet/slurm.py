"""The sbatch script of a fleet job.

One task per node (`srun --ntasks-per-node=1`) runs thrifty's node agent, which starts one
worker per GPU and meets the other nodes on the first host of $SLURM_JOB_NODELIST. Slurm sends
SIGUSR1 to the job steps ahead of the time limit (`--signal=USR1@T`, without `B:`, which would
signal the batch shell only); every worker saves the emergency checkpoint and exits 75, the
step ends 75, and the batch script requeues the job, which resumes from the checkpoint.
"""

from __future__ import annotations

import math
import shlex
import shutil
import subprocess
from pathlib import Path

from thrifty.fleet.job import FleetJob
from thrifty.run.preemption import EXIT_PREEMPTED


def time_limit(seconds: float) -> str:
    """`#SBATCH --time` form of a duration: D-HH:MM:SS, rounded up to the minute."""
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def sbatch_script(job: FleetJob) -> str:
    """The script's text."""
    lead = job.signal_lead_seconds
    options = [
        f"--job-name={job.name}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={job.gpus.per_node}",
        f"--signal=USR1@{lead}",
        "--requeue",
        "--open-mode=append",
        f"--output={job.name}-%j.out",
    ]
    if job.time_limit is not None:
        options.insert(4, f"--time={time_limit(job.time_limit)}")
    agent = job.agent_words(
        '"$SLURM_JOB_NUM_NODES"', str(job.gpus.per_node), "$HEAD", '"$SLURM_JOB_ID"'
    )
    location = None if job.location is None else shlex.quote(job.location)
    command = ["srun --ntasks-per-node=1", *agent, "--", *job.train_words(location)]
    lines = [
        "#!/bin/bash",
        f"# Slurm job for {job.config} ({job.gpus.per_node} x {job.gpus.name} per node), "
        "written by `thrifty launch`.",
        "# Submit from this directory: sbatch THIS_FILE",
        *(f"#SBATCH {option}" for option in options),
        "",
        f"# SIGUSR1 comes {lead} s before the time limit: enough for the emergency checkpoint",
        "# (checkpoint.upload_deadline plus the agent's margin) and Slurm's lateness.",
        "# Rank 0 and the rendezvous are on the first node of the allocation.",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "",
        " \\\n    ".join(command),
        "code=$?",
        f"# {EXIT_PREEMPTED}: preempted with its checkpoint saved; queue the job again to resume.",
        f'if [ "$code" -eq {EXIT_PREEMPTED} ]; then',
        '    scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def sbatch_executable() -> str | None:
    """The `sbatch` command on PATH, or None (the script is written, not submitted)."""
    return shutil.which("sbatch")


def submit(path: Path, sbatch: str) -> int:
    """`sbatch` the script from the current directory; returns sbatch's exit code."""
    return subprocess.run([sbatch, str(path)], check=False).returncode


def submit_hint(path: Path) -> str:
    return f"sbatch {path}"
