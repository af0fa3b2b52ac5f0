"""`thrifty launch`: the machines run the very thrifty that wrote the job file.

SkyPilot: launch ships the running thrifty as a wheel in the uploaded folder, and the task's
setup, run by SkyPilot's own wrapper in a fresh virtual environment, installs it; pip gets no
index and no dependencies (they are the system's), so the test needs no network. Slurm: the
script runs only where `python` has this thrifty.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import thrifty
from fleet.launch_sandbox import SKY_ENV, Sandbox
from thrifty.cli import main
from thrifty.fleet.wheel import build_wheel

REPO = Path(__file__).resolve().parents[2]
COST = ("--params", "1M", "--tokens", "1M")
# pip offline: the wheel only, its dependencies are the system's.
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_NO_DEPS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "examples" / "demo.toml", project / "demo.toml")
    (project / "requirements.txt").write_text("pip\n")  # installed already: nothing to fetch
    monkeypatch.chdir(project)
    return project


def fresh_venv(path: Path) -> Path:
    """A new virtual environment (the system's packages visible) with pip; its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(path)],
        check=True,
    )
    python = path / "bin" / "python"
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode:
        subprocess.run([python, "-m", "ensurepip"], check=True, capture_output=True)
    return python


def test_the_task_setup_installs_the_thrifty_that_wrote_it(project, tmp_path, capsys, monkeypatch):
    sky = pytest.importorskip(
        "sky", reason="SkyPilot is not installed: pip install 'thrifty[skypilot]'"
    )
    box = Sandbox(tmp_path, project)
    monkeypatch.setenv("PATH", os.pathsep.join([str(box.bin), "/usr/bin", "/bin"]))
    code = main(["launch", "demo.toml", "--gpus", "H100:8", "--bucket", "s3://b/run", *COST])
    assert code == 0, capsys.readouterr().err
    task = sky.Task.from_yaml(str(project / "demo.sky.yaml"))
    python = fresh_venv(tmp_path / "venv")
    assert subprocess.run([python, "-c", "import thrifty"], capture_output=True).returncode != 0

    path = os.pathsep.join([str(python.parent), "/usr/bin", "/bin"])
    result = box.run_sky(task.setup, {**task.envs, **SKY_ENV, **OFFLINE}, path=path)
    assert result.returncode == 0, result.stdout + result.stderr

    probe = "import importlib.metadata as m, thrifty; print(m.version('thrifty')); print(thrifty.__file__)"
    version, location = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.split()
    assert version == importlib.metadata.version("thrifty") == thrifty.__version__
    installed = Path(location).parent
    assert installed.is_relative_to(tmp_path / "venv")
    source = Path(thrifty.__file__).parent
    for module in ("fleet/wheel.py", "fleet/skypilot.py", "plan/catalog.toml", "py.typed"):
        assert (installed / module).read_bytes() == (source / module).read_bytes()
    helped = subprocess.run(
        [python.parent / "thrifty", "--help"], capture_output=True, text=True, cwd=tmp_path
    )
    assert helped.returncode == 0 and "launch" in helped.stdout


def test_the_same_files_make_the_same_wheel():
    assert build_wheel() == build_wheel()


def python_with(folder: Path, interpreter: str) -> str:
    """`folder`/python that runs `interpreter`; returns a PATH with it first."""
    folder.mkdir()
    (folder / "python").write_text(f'#!/bin/sh\nexec {interpreter} "$@"\n')
    (folder / "python").chmod(0o755)
    return str(folder)


@pytest.mark.parametrize(
    ("interpreter", "runs"),
    [(sys.executable, True), (getattr(sys, "_base_executable", sys.executable), False)],
    ids=["thrifty's environment", "an environment without thrifty"],
)
def test_the_sbatch_script_runs_only_with_the_thrifty_that_wrote_it(
    project, tmp_path, capsys, interpreter, runs
):
    if not runs and interpreter == sys.executable:
        pytest.skip("this Python is not in a virtual environment: no Python without thrifty")
    code = main(
        ["launch", "demo.toml", "--gpus", "H100:4", "--engine", "slurm", "--dry-run", *COST]
    )
    assert code == 0
    text = capsys.readouterr().out.split("(not written: --dry-run) ---\n", 1)[1]
    box = Sandbox(tmp_path, project)
    real = python_with(tmp_path / "real", interpreter)
    path = os.pathsep.join([real, str(box.bin), "/usr/bin", "/bin"])
    result = box.run_sbatch(text, path=path)
    if runs:
        assert result.returncode == 0, result.stderr
        assert len(box.calls("srun")) == 1
    else:
        version = thrifty.__version__
        assert result.returncode == 2
        assert result.stderr == (
            "thrifty: error: this job runs python -m thrifty, and the python on PATH has no "
            f"thrifty {version}: activate the environment that has it before sbatch\n"
        )
        assert box.calls("srun") == []


@pytest.mark.parametrize(("workers", "cpus"), [("3", 16), ("0", 4), ('"auto"', 36)])
def test_each_node_asks_for_a_cpu_per_gpu_and_for_its_loader_workers(
    project, tmp_path, capsys, workers, cpus
):
    args = ["--engine", "slurm", "--dry-run", "--set", f"data.num_workers={workers}", *COST]
    assert main(["launch", "demo.toml", "--gpus", "H100:4", *args]) == 0
    text = capsys.readouterr().out.split("(not written: --dry-run) ---\n", 1)[1]
    assert f"#SBATCH --cpus-per-task={cpus}\n" in text
    box = Sandbox(tmp_path, project)
    assert box.run_sbatch(text).returncode == 0
    (srun,) = box.calls("srun")
    assert f"--cpus-per-task={cpus}" in srun[: srun.index("python")]
