"""A fleet job: what every engine's job file says, read from the thrifty config and the
request of `thrifty launch` (`LaunchRequest`).

The job is the same whatever runs it: N nodes of K GPUs, each starting thrifty's node agent
(`python -m thrifty.fleet.agent`, torch's elastic agent with the preempted exit code kept),
which trains the config with its checkpoints in storage every node and every relaunch can
read. A sweep's job (`SweepJob`) instead starts one sweep worker per node
(`python -m thrifty sweep ... --workers K`, a trial a GPU), all of them taking trials from
one study. Units: seconds, GPUs per node.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from thrifty.errors import ConfigError
from thrifty.fleet.credentials import Passed, location_word, override_words
from thrifty.fleet.shell import Env, Word, check_travels

ENGINES = ("skypilot", "slurm")
RENDEZVOUS_PORT = 29500
# Seconds the node agent needs besides the upload to stop its workers: the step they are in,
# the local write, the exit (the agent's own margin), plus Slurm's up-to-a-minute lateness.
SIGNAL_MARGIN_SECONDS = 60
# `pip install` extras for a checkpoint URL's scheme (fsspec's filesystems).
STORAGE_EXTRAS = {"s3": "s3", "gs": "gcs", "gcs": "gcs"}

_GPUS = re.compile(r"^\s*([A-Za-z0-9][\w.-]*)\s*(?::\s*(\S+))?\s*$")


# The most GPUs one node holds: 8 on an HGX board, 16 on the largest cloud machines (GCP's
# a2-megagpu-16g).
MAX_GPUS_PER_NODE = 16


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """`--gpus NAME:COUNT`: a catalog GPU (`name`, canonical) and how many per node."""

    name: str
    given: str
    per_node: int


def parse_gpus(text: str, known: Sequence[str], resolve: object) -> GpuRequest:
    """`H100:8` (or `H100`, one GPU) → the catalog GPU and the count per node.

    `known`: the catalog's GPU names, listed when the name is not one; `resolve`: the
    catalog's `gpu(name)` lookup (raises LookupError for an unknown name).
    """
    match = _GPUS.match(text)
    count_text = match.group(2) if match else None
    if match is None or (count_text is not None and not count_text.isdigit()):
        raise ConfigError(
            f"--gpus {text!r} is invalid: give GPU:COUNT, the GPUs of one node, e.g. H100:8"
        )
    count = 1 if count_text is None else int(count_text)
    if not 1 <= count <= MAX_GPUS_PER_NODE:
        raise ConfigError(
            f"--gpus {text!r} is invalid: the count is the GPUs of one node, 1 to "
            f"{MAX_GPUS_PER_NODE}, e.g. H100:8 (use --nodes for more)"
        )
    name = match.group(1)
    try:
        gpu = resolve(name)  # type: ignore[operator]
    except LookupError:
        raise ConfigError(
            f"--gpus {text!r} is invalid: unknown GPU {name!r}; the catalog knows "
            f"{', '.join(known)}"
        ) from None
    return GpuRequest(gpu.name, name, count)


def is_remote(location: str | None) -> bool:
    """A URL other than file://: storage that outlives the node (a bucket)."""
    return location is not None and "://" in location and not location.startswith("file://")


STORAGE_ENV = "THRIFTY_SWEEP_STORAGE"  # a sweep's study URL: it holds a password, so it travels


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepJob:
    """`thrifty launch --sweep SPACE.toml`: `space` relative to the job's directory like the
    config, the study's `storage` URL (None: one node, a journal in `out`), its `study` name
    and each node's `out`."""

    space: str
    storage: str | None
    study: str
    out: str

    def __post_init__(self) -> None:
        check_travels(self.space, "the space's path")
        check_travels(self.study, "--study")


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetJob:
    """Everything the engines write: the job's name, nodes, GPUs, storage and command.

    `config` is the config's path relative to the directory the job runs in (the submitting
    directory); `location` the checkpoint location the launch sets (None: the config's own);
    `requirements` a requirements file beside the config, relative likewise;
    `storage_extra` the thrifty extra the checkpoint storage needs (`s3`); `loader_workers`
    the config's `data.num_workers` (None: "auto"). A value no job file could carry as it
    is (`thrifty.fleet.shell.check_travels`) is refused here. Secrets are never written:
    `passed()` lists the environment variables that carry them.
    """

    name: str
    config: str
    gpus: GpuRequest
    nodes: int = 1
    spot: bool = False
    location: str | None = None
    overrides: tuple[str, ...] = ()
    requirements: str | None = None
    signals: tuple[str, ...] = ("SIGTERM", "SIGINT", "SIGUSR1")
    upload_deadline: float = 90.0
    max_restarts: int = 3
    time_limit: float | None = None
    storage_extra: str | None = None
    loader_workers: int | None = None
    sweep: SweepJob | None = None

    def __post_init__(self) -> None:
        check_travels(self.config, "the config's path")
        if self.requirements is not None:
            check_travels(self.requirements, "the requirements file's path")
        for number, item in enumerate(self.overrides, 1):
            check_travels(item, f"--set number {number}")
        if self.location is not None:
            check_travels(self.location, "--bucket")

    @property
    def signal_lead_seconds(self) -> int:
        """Seconds before a time limit the preemption signal must come: the agent's wait for
        the workers (upload deadline plus its margin) plus Slurm's lateness."""
        from thrifty.strategies.launcher import worker_grace_seconds

        return worker_grace_seconds(self.upload_deadline) + SIGNAL_MARGIN_SECONDS

    def passed(self) -> list[Passed]:
        """The secrets among the job's values, each passed in an environment variable."""
        passed = override_words(self.overrides)[1]
        if self.sweep is not None and self.sweep.storage is not None:
            passed.append(Passed(STORAGE_ENV, self.sweep.storage, "the sweep's study (--storage)"))
        if self.location is not None:
            location = location_word(self.location, in_env=False)[1]
            passed += [location] if location is not None else []
        return passed

    def required_lines(self) -> list[str]:
        """Script lines that stop the job, naming the variable, when a passed value is unset."""
        return [
            f': "${{{p.name}:?set {p.name} in the environment that submits this job}}"'
            for p in self.passed()
        ]

    def node_lines(
        self, nodes: Word, per_node: Word, head: Env, job_id: Word, *, location_in_env: bool
    ) -> list[list[Word]]:
        """What every node runs, one option a line: thrifty's node agent (`head` holds the
        first node's address), then `-- train CONFIG --set ...`. `location_in_env`: the
        checkpoint location is read from LOCATION_ENV, which the engine sets (so it is,
        whatever this says, when the location holds a secret). A sweep's job runs one sweep
        worker instead, a trial per GPU of the node."""
        if self.sweep is not None:
            return self._sweep_lines(per_node, location_in_env)
        lines: list[list[Word]] = [
            ["python", "-m", "thrifty.fleet.agent"],
            ["--nnodes", nodes],
            ["--nproc-per-node", per_node],
            ["--rdzv-endpoint", (head, f":{RENDEZVOUS_PORT}")],
            ["--rdzv-id", job_id],
            ["--signals", ",".join(self.signals)],
            ["--upload-deadline", str(math.ceil(self.upload_deadline))],
            ["--", "train", self.config],
        ]
        lines += [["--set", word] for word in override_words(self.overrides)[0]]
        if self.location is not None:
            lines.append(["--set", location_word(self.location, location_in_env)[0]])
        return lines

    def _sweep_lines(self, per_node: Word, location_in_env: bool) -> list[list[Word]]:
        sweep = self.sweep
        assert sweep is not None
        lines: list[list[Word]] = [
            ["python", "-m", "thrifty", "sweep", self.config],
            ["--space", sweep.space],
            ["--study", sweep.study],
            ["--out", sweep.out],
            ["--workers", per_node],
        ]
        if sweep.storage is not None:
            lines.insert(2, ["--storage", Env(STORAGE_ENV)])
        lines += [["--set", word] for word in override_words(self.overrides)[0]]
        if self.location is not None:  # each trial's saves in a folder of their own there
            lines.append(["--set", location_word(self.location, location_in_env)[0]])
        return lines


def storage_extra(location: str | None) -> str | None:
    """The `pip install` extra the checkpoint location's scheme needs (None: none)."""
    scheme = (location or "").partition("://")[0]
    return STORAGE_EXTRAS.get(scheme) if is_remote(location) else None


def relative_config(path: str | os.PathLike[str], cwd: str | os.PathLike[str]) -> str:
    """The config's path from `cwd`, the directory the job runs in: the engines run the
    job there (SkyPilot uploads it as the workdir), so the config must be inside it."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(cwd))
    if rel == ".." or rel.startswith(f"..{os.sep}"):
        raise ConfigError(
            f"config {path} is outside the current directory: run thrifty launch from the "
            "project directory that holds it (the job runs there)"
        )
    rel = Path(rel).as_posix()
    return f"./{rel}" if rel.startswith("-") else rel  # a path, never read as an option


def requirements_beside(config: str, cwd: str | os.PathLike[str]) -> str | None:
    """`requirements.txt` in the config's folder, relative to `cwd`, if there is one."""
    candidate = Path(config).parent / "requirements.txt"
    return candidate.as_posix() if (Path(cwd) / candidate).is_file() else None


def check_storage(nodes: int, location: str | None, engine: str, spot: bool) -> None:
    """Refuse a job that could not resume: several nodes (or a SkyPilot relaunch, always on
    a new machine) with checkpoints on one machine's disk."""
    if is_remote(location):
        return
    fix = (
        "give --bucket s3://BUCKET/PATH (or set checkpoint.location to a bucket URL in the config)"
    )
    if nodes > 1:
        raise ConfigError(
            f"--nodes {nodes} without --bucket: a fleet without shared storage cannot resume; {fix}"
        )
    if engine == "skypilot" and spot:
        raise ConfigError(
            "--spot without --bucket: SkyPilot relaunches a preempted job on a new machine, "
            f"which cannot see the old one's checkpoints; {fix}"
        )


def check_bucket(bucket: str | None, engine: str) -> None:
    """SkyPilot's nodes share no filesystem: their storage is a URL."""
    if bucket is not None and engine == "skypilot" and not is_remote(bucket):
        raise ConfigError(
            f"--bucket {bucket!r} is invalid: SkyPilot's machines share no folder; give a "
            "bucket URL, e.g. s3://BUCKET/PATH or gs://BUCKET/PATH"
        )


def job_name(run_name: str) -> str:
    """`thrifty-<run.name>` with only the letters engines accept in a job name."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", run_name.lower()).strip("-")
    return f"thrifty-{cleaned or 'run'}"
