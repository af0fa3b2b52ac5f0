"""A sandbox that runs the job files `thrifty launch` writes the way their engines do, with a
recording stand-in for every program they start.

Each stand-in (srun, scontrol, python, python3, pip, sbatch, sky) appends one JSON line per
call to `<name>.calls` in the sandbox's bin folder: its arguments and the environment
variables the test watches, so a test compares them with what the user gave, character for
character. SkyPilot's own wrapper (`sky.skylet.log_lib.make_task_bash_script`: it exports the
task's envs and runs the script from ~/sky_workdir with `bash -i`) runs a task's setup and
run; the sbatch script runs under bash as Slurm runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROGRAMS = ("srun", "scontrol", "python", "python3", "pip", "sbatch", "sky")
HOSTS = ("gpu1", "gpu2")
STUB = """#!{python}
import json, os, sys
with open({log!r}, "a", encoding="utf-8") as f:
    env = {{name: os.environ.get(name) for name in {watch!r}}}
    f.write(json.dumps({{"argv": sys.argv[1:], "env": env}}) + "\\n")
if {name!r} == "scontrol" and sys.argv[1:3] == ["show", "hostnames"]:
    print("\\n".join({hosts!r}))
sys.exit(int(os.environ.get("STUB_EXIT_" + {name!r}.upper(), "0")))
"""
SKY_ENV = {
    "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8",
    "SKYPILOT_NUM_NODES": "2",
    "SKYPILOT_NODE_RANK": "0",
    "SKYPILOT_NUM_GPUS_PER_NODE": "8",
    "SKYPILOT_TASK_ID": "sky-managed-1",
}
SLURM_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
}


@dataclass
class Sandbox:
    """`root`/bin holds the stand-ins, `root`/home the home folder; `project` is the
    directory launch ran in (SkyPilot's ~/sky_workdir links to it)."""

    root: Path
    project: Path
    watch: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.bin = self.root / "bin"
        self.home = self.root / "home"
        self.bin.mkdir(exist_ok=True)
        self.home.mkdir(exist_ok=True)
        (self.home / ".bashrc").write_text("")
        workdir = self.home / "sky_workdir"
        if not workdir.exists():
            workdir.symlink_to(self.project, target_is_directory=True)
        for name in PROGRAMS:
            self.stub(name)

    def stub(self, name: str) -> None:
        path = self.bin / name
        log = str(self.bin / f"{name}.calls")
        path.write_text(
            STUB.format(python=sys.executable, log=log, watch=self.watch, name=name, hosts=HOSTS)
        )
        path.chmod(0o755)

    def env(self, extra: dict[str, str] | None = None, path: str | None = None) -> dict[str, str]:
        return {
            "PATH": path or os.pathsep.join([str(self.bin), "/usr/bin", "/bin"]),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            **(extra or {}),
        }

    def calls(self, name: str) -> list[list[str]]:
        return [call["argv"] for call in self.records(name)]

    def records(self, name: str) -> list[dict]:
        log = self.bin / f"{name}.calls"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]

    def run_sky(
        self, script: str, envs: dict[str, str], path: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A task's setup or run as SkyPilot runs it on a node: its wrapper exports `envs`
        (the task's envs and SkyPilot's own) and runs the script in ~/sky_workdir."""
        from sky.skylet.log_lib import make_task_bash_script

        wrapped = self.root / "sky_script.sh"
        wrapped.write_text(make_task_bash_script(script, env_vars=envs), encoding="utf-8")
        return self._bash(["-i", str(wrapped)], self.env(path=path))

    def run_sbatch(
        self, script: str, extra: dict[str, str] | None = None, path: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The sbatch script as Slurm runs it: in the submitting directory, with the
        submitting environment and the job's own variables."""
        job = self.root / "job.sbatch"
        job.write_text(script, encoding="utf-8")
        return self._bash([str(job)], self.env({**SLURM_ENV, **(extra or {})}, path))

    def _bash(self, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        # A new session and no terminal: `bash -i` must not take the test's terminal.
        return subprocess.run(
            ["bash", *args],
            cwd=self.project,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            start_new_session=True,
            timeout=120,
        )

    def pwned(self) -> list[Path]:
        """Files a payload would have created, had it run as a command."""
        return sorted(self.root.rglob("PWNED"))


def agent_command(argv: list[str]) -> list[str]:
    """The thrifty command after the node agent's `--`."""
    return argv[argv.index("--") + 1 :]
