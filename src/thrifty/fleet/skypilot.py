"""The SkyPilot task YAML of a fleet job, submitted as a managed job (`sky jobs launch`).

A managed job relaunches the task on new machines when the cloud takes a spot instance back,
and, under `resources.job_recovery`, when the task fails: `max_restarts_on_errors` times for
any failure, always for the codes in `recover_on_exit_codes` (SkyPilot versions whose schema,
`sky/utils/schemas.py`, has that field). 75 is listed there: a preempted thrifty job resumes
from its bucket however often it is preempted. Every node runs the same `run` script; the
first line of SKYPILOT_NODE_IPS is the head node, where rank 0 and the rendezvous live.

The file is written by PyYAML's emitter and its scripts quote every value (`shell`), so no
value the user gave can add a key or a command. Setup installs the thrifty that wrote the
file, shipped as a wheel in the uploaded folder (`wheel`). A secret is never written: its
key is in `envs` (or `secrets`, where SkyPilot has that field) with no value, and
`sky jobs launch --env NAME` (`--secret NAME`) takes the value from the environment it
is started in (`credentials`).
"""

from __future__ import annotations

import importlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from thrifty.errors import MissingDependencyError
from thrifty.fleet.credentials import LOCATION_ENV, described
from thrifty.fleet.files import MARKER
from thrifty.fleet.job import FleetJob
from thrifty.fleet.shell import Env, command
from thrifty.fleet.wheel import FOLDER
from thrifty.records.stop_signals import EXIT_PREEMPTED

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


def _schema_property(schema: str, *path: str) -> bool | None:
    """Whether the installed SkyPilot's schema (`sky/utils/schemas.py`) has the property at
    `path` (None: SkyPilot is not installed here)."""
    try:
        schemas = importlib.import_module("sky.utils.schemas")
    except ImportError:
        return None
    node = getattr(schemas, schema)()
    for key in path[:-1]:
        node = node["properties"][key]
    options = node.get("anyOf", [node])
    return any(path[-1] in option.get("properties", {}) for option in options)


def exit_codes_supported() -> bool | None:
    """Whether the installed SkyPilot's schema has `job_recovery.recover_on_exit_codes`
    (None: SkyPilot is not installed here, so the file is written for a current one)."""
    return _schema_property("get_resources_schema", "job_recovery", "recover_on_exit_codes")


def secrets_supported() -> bool | None:
    """Whether the installed SkyPilot's task has a `secrets` field, whose values it never
    shows (None: not installed here; the file then uses `envs`, which every SkyPilot reads)."""
    return _schema_property("get_task_schema", "secrets")


def task_yaml(
    job: FleetJob, *, wheel: str, exit_codes: bool | None, secrets: bool | None = None
) -> str:
    """The task file's text. `wheel`: the path, from the submitting directory, of the thrifty
    wheel the machines install (`thrifty.fleet.wheel`); `exit_codes`, `secrets`: from
    `exit_codes_supported()` and `secrets_supported()`."""
    passed = job.passed()
    recovery: dict[str, Any] = {"max_restarts_on_errors": job.max_restarts}
    if exit_codes is not False:
        recovery["recover_on_exit_codes"] = _Flow([EXIT_PREEMPTED])
    task: dict[str, Any] = {
        "name": job.name,
        "num_nodes": job.nodes,
        "workdir": ".",
        "resources": {
            "accelerators": accelerator(job),
            "use_spot": job.spot,
            "job_recovery": recovery,
        },
    }
    envs: dict[str, str | None] = {}
    if job.location is not None and not any(p.name == LOCATION_ENV for p in passed):
        envs[LOCATION_ENV] = job.location
    hidden = {p.name: None for p in passed}
    if secrets:
        task["secrets"] = hidden
    else:
        envs.update(hidden)
    if envs:
        task["envs"] = envs
    task["setup"] = _setup_script(job, wheel)
    task["run"] = _run_script(job)
    header = [MARKER, *(f"# {line}" for line in _header(job, exit_codes, secrets))]
    return "\n".join(header) + "\n" + _dump(task)


def _header(job: FleetJob, exit_codes: bool | None, secrets: bool | None) -> list[str]:
    lines = [
        "SkyPilot managed job. Submit it from the directory thrifty launch ran in, which is",
        "uploaded as the workdir:",
        f"  {' '.join(submit_words(Path('THIS_FILE'), job, secrets, sky='sky'))}",
        f"Setup installs the thrifty that wrote this file, from {FOLDER}/ in that directory",
        "(written with this file; --dry-run writes neither).",
        *described(job.passed()),
    ]
    if exit_codes is False:
        lines += [
            "This SkyPilot has no recover_on_exit_codes: a preempted exit (75) counts against",
            "max_restarts_on_errors; a spot preemption itself never does.",
        ]
    return lines


def _setup_script(job: FleetJob, wheel: str) -> str:
    """Install the user's requirements, then the thrifty that wrote the task (its extra for
    the checkpoint storage), last so that nothing replaces it; a reused machine that has
    the same version gets this build all the same (--force-reinstall)."""
    pip = ["python", "-m", "pip", "install"]
    lines = ["set -e"]
    if job.requirements is not None:
        lines.append(command([[*pip, "-r", job.requirements]]))
    spec = f"{wheel}[{job.storage_extra}]" if job.storage_extra else wheel
    lines.append(command([[*pip, spec]]))
    lines.append(command([[*pip, "--force-reinstall", "--no-deps", wheel]]))
    return "\n".join(lines) + "\n"


def _run_script(job: FleetJob) -> str:
    node = job.node_lines(
        Env("SKYPILOT_NUM_NODES"),
        Env("SKYPILOT_NUM_GPUS_PER_NODE"),
        Env("HEAD"),
        Env("SKYPILOT_TASK_ID"),
        location_in_env=True,
    )
    if job.sweep is not None:
        lines = [
            *job.required_lines(),
            "# one sweep worker per node, a trial per GPU, all taking trials from one study.",
            "# 75: preempted, its trials saved; SkyPilot relaunches and the sweep goes on.",
            command(node),
        ]
        return "\n".join(lines) + "\n"
    lines = [
        *job.required_lines(),
        "# rank 0 and the rendezvous are on the head node, the first of SKYPILOT_NODE_IPS;",
        "# SKYPILOT_NODE_RANK orders the others. 75: preempted, SkyPilot relaunches.",
        'HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)',
        command(node),
    ]
    return "\n".join(lines) + "\n"


class _Flow(list[Any]):
    """A list the task file writes on one line: `[75]`."""


def _dump(task: dict[str, Any]) -> str:
    """The task as YAML, by PyYAML's emitter (SkyPilot reads it with `yaml.safe_load`):
    every value is quoted or escaped as YAML needs, so none can add or change a key."""
    try:
        yaml = importlib.import_module("yaml")
    except ImportError:
        raise MissingDependencyError(
            f"PyYAML is not installed, and it writes the SkyPilot task: {INSTALL} "
            "(or pip install pyyaml)"
        ) from None

    class Dumper(yaml.SafeDumper):  # type: ignore[name-defined]
        pass

    def text(dumper: Any, data: str) -> Any:
        # Scripts as `|` blocks; the emitter falls back to a quoted, escaped scalar when the
        # text holds what a block cannot (control characters, trailing spaces).
        style = "|" if "\n" in data else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    def flow(dumper: Any, data: list[Any]) -> Any:
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)

    Dumper.add_representer(str, text)
    Dumper.add_representer(_Flow, flow)
    # Non-ASCII escaped: written raw, a NEL (U+0085) or a line separator reads back as a line
    # break, and a value would change on its way to the job.
    dumped: str = yaml.dump(
        task, Dumper=Dumper, sort_keys=False, allow_unicode=False, width=1_000_000
    )
    return dumped


def sky_executable() -> str:
    """The `sky` command, or the one line saying how to install it."""
    found = shutil.which("sky")
    if found is None:
        raise MissingDependencyError(
            f"SkyPilot is not installed: {INSTALL} (or give --dry-run to print the task file)"
        )
    return found


def excluded_from_upload(cwd: Path, path: str) -> str | None:
    """The file (".skyignore" or ".gitignore") that leaves `path`, relative to `cwd`, out of
    the workdir SkyPilot uploads, by SkyPilot's own reading of it; None when it is uploaded."""
    try:
        storage_utils = importlib.import_module("sky.data.storage_utils")
        excluded = storage_utils.get_excluded_files(str(cwd))
    except Exception:  # noqa: BLE001 - a courtesy check: SkyPilot runs its own at upload
        return None
    for entry in excluded:
        entry = entry.rstrip("/")
        if entry and (path == entry or path.startswith(f"{entry}/")):
            return ".skyignore" if (cwd / ".skyignore").exists() else ".gitignore"
    return None


def submit_words(path: Path, job: FleetJob, secrets: bool | None, sky: str) -> list[str]:
    """`sky jobs launch`, taking every passed value from the submitting environment."""
    flag = "--secret" if secrets else "--env"
    passing = [word for p in job.passed() for word in (flag, p.name)]
    return [sky, "jobs", "launch", "--yes", *passing, "-n", job.name, str(path)]


def submit(path: Path, job: FleetJob) -> int:
    """`sky jobs launch` the task file (from the current directory, its workdir), with the
    passed values in its environment; returns sky's exit code."""
    command = submit_words(path, job, secrets_supported(), sky_executable())
    env = {**os.environ, **{p.name: p.value for p in job.passed()}}
    return subprocess.run(command, env=env, check=False).returncode


def submit_hint(path: Path, job: FleetJob) -> str:
    words = submit_words(path, job, secrets_supported(), sky="sky")
    return " ".join(shlex.quote(w) for w in words)
