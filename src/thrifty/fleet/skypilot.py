"""The SkyPilot task YAML of a fleet job, submitted as a managed job (`sky jobs launch`).

A managed job relaunches the task on new machines when the cloud takes a spot instance back,
and, under `resources.job_recovery`, when the task fails: `max_restarts_on_errors` times for
any failure, always for the codes in `recover_on_exit_codes` (SkyPilot versions whose schema,
`sky/utils/schemas.py`, has that field). 75 is listed there: a preempted thrifty job resumes
from its bucket however often it is preempted. Every node runs the same `run` script; the
first line of SKYPILOT_NODE_IPS is the head node, where rank 0 and the rendezvous live.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
from pathlib import Path

from thrifty.errors import MissingDependencyError
from thrifty.fleet.job import FleetJob
from thrifty.run.preemption import EXIT_PREEMPTED

LOCATION_ENV = "CHECKPOINT_LOCATION"
INSTALL = "pip install 'thrifty[skypilot]'"
# thrifty's catalog names → SkyPilot's accelerator names (`sky show-gpus`).
ACCELERATORS = {
    "A100-SXM4-40GB": "A100",
    "A100-SXM4-80GB": "A100-80GB",
    "A100-PCIe-80GB": "A100-80GB",
    "H100-SXM": "H100",
    "H100-PCIe": "H100",
    "H100-NVL": "H100",
    "H200-SXM": "H200",
    "V100-SXM2-16GB": "V100",
    "V100-PCIe-16GB": "V100",
}


def accelerator(job: FleetJob) -> str:
    """`resources.accelerators`: SkyPilot's name for the GPU and the count per node."""
    return f"{ACCELERATORS.get(job.gpus.name, job.gpus.name)}:{job.gpus.per_node}"


def exit_codes_supported() -> bool | None:
    """Whether the installed SkyPilot's schema has `job_recovery.recover_on_exit_codes`
    (None: SkyPilot is not installed here, so the file is written for a current one)."""
    try:
        schemas = importlib.import_module("sky.utils.schemas")
    except ImportError:
        return None
    recovery = schemas.get_resources_schema()["properties"]["job_recovery"]
    return any(
        "recover_on_exit_codes" in option.get("properties", {})
        for option in recovery.get("anyOf", [])
    )


def task_yaml(job: FleetJob, *, version: str, exit_codes: bool | None) -> str:
    """The task file's text. `version`: the thrifty release the machines install;
    `exit_codes`: from `exit_codes_supported()`."""
    lines = [
        f"# SkyPilot managed job for {job.config}, written by `thrifty launch`.",
        "# Submit from this directory (it is uploaded as the workdir):",
        f"#   sky jobs launch -n {job.name} THIS_FILE",
        f"name: {job.name}",
        f"num_nodes: {job.nodes}",
        "workdir: .",
        "resources:",
        f"  accelerators: {accelerator(job)}",
        f"  use_spot: {'true' if job.spot else 'false'}",
        "  job_recovery:",
        f"    max_restarts_on_errors: {job.max_restarts}",
        *_exit_code_lines(exit_codes),
    ]
    if job.location is not None:
        lines += ["envs:", f"  {LOCATION_ENV}: {json.dumps(job.location)}"]
    lines += ["setup: |", f"  {job.install_line(version)}"]
    if job.requirements is not None:
        lines.append(f"  pip install -r {job.requirements}")
    location = f'"${LOCATION_ENV}"' if job.location is not None else None
    agent = job.agent_words(
        '"$SKYPILOT_NUM_NODES"',
        '"$SKYPILOT_NUM_GPUS_PER_NODE"',
        "$HEAD",
        '"$SKYPILOT_TASK_ID"',
    )
    command = [*agent, "--", *job.train_words(location)]
    lines += [
        "run: |",
        "  # rank 0 and the rendezvous are on the head node, the first of SKYPILOT_NODE_IPS;",
        "  # SKYPILOT_NODE_RANK orders the others. 75: preempted, SkyPilot relaunches.",
        '  HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)',
        "  " + " \\\n      ".join(command),
    ]
    return "\n".join(lines) + "\n"


def _exit_code_lines(supported: bool | None) -> list[str]:
    if supported is False:
        return [
            "    # this SkyPilot has no recover_on_exit_codes: a preempted exit (75) counts",
            "    # against max_restarts_on_errors; a spot preemption itself never does",
        ]
    return [f"    recover_on_exit_codes: [{EXIT_PREEMPTED}]"]


def sky_executable() -> str:
    """The `sky` command, or the one line saying how to install it."""
    found = shutil.which("sky")
    if found is None:
        raise MissingDependencyError(
            f"SkyPilot is not installed: {INSTALL} (or give --dry-run to print the task file)"
        )
    return found


def submit(path: Path, job: FleetJob) -> int:
    """`sky jobs launch` the task file (from the current directory, its workdir); returns
    sky's exit code."""
    command = [sky_executable(), "jobs", "launch", "--yes", "-n", job.name, str(path)]
    return subprocess.run(command, check=False).returncode


def submit_hint(path: Path, job: FleetJob) -> str:
    return f"sky jobs launch -n {job.name} {path}"
