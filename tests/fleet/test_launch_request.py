"""`thrifty launch`'s typed request: the command line builds it once, and the fleet runs it
without the command line (no argparse below `thrifty.commands`)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from thrifty.cli import build_parser, main
from thrifty.commands.launch import launch_request
from thrifty.errors import ConfigError
from thrifty.fleet.launching import run
from thrifty.fleet.request import CostFigures, LaunchRequest

REPO = Path(__file__).resolve().parents[2]
FLEET = REPO / "src" / "thrifty" / "fleet"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project directory holding the demo config; the cwd."""
    shutil.copy(REPO / "examples" / "demo.toml", tmp_path / "demo.toml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_command_line_becomes_one_typed_request():
    args = build_parser().parse_args(
        ["launch", "demo.toml", "--gpus", "H100:8", "--nodes", "2", "--spot", "--engine", "slurm"]
        + ["--set", "run.name=a", "--set", "optim.lr=0.1", "--max-restarts", "0"]
        + ["--time", "24h", "--out", "job.sbatch", "--overwrite", "--bucket", "s3://b/r"]
        + ["--params", "7B", "--tokens", "140B", "--seq", "2048", "--mfu", "0.4"]
        + ["--instance", "p5.48xlarge"]
    )
    assert launch_request(args) == LaunchRequest(
        config="demo.toml",
        gpus="H100:8",
        overrides=("run.name=a", "optim.lr=0.1"),
        nodes=2,
        spot=True,
        bucket="s3://b/r",
        engine="slurm",
        out="job.sbatch",
        overwrite=True,
        max_restarts=0,
        time="24h",
        cost=CostFigures(instance="p5.48xlarge", params=7e9, tokens=140e9, seq=2048, mfu=0.4),
    )


def test_a_request_built_in_python_writes_the_command_lines_job_file(project, capsys):
    given = ["--gpus", "H100:8", "--nodes", "2", "--engine", "slurm", "--set", "run.name=req"]
    assert main(["launch", "demo.toml", *given, "--bucket", "s3://b/r", "--dry-run"]) == 0
    from_cli = capsys.readouterr().out
    request = LaunchRequest(
        config="demo.toml",
        gpus="H100:8",
        nodes=2,
        engine="slurm",
        overrides=("run.name=req",),
        bucket="s3://b/r",
        dry_run=True,
    )
    assert run(request) == 0
    from_python = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in from_python and "run.name=req" in from_python
    assert from_python == from_cli
    assert not list(project.glob("*.sbatch"))  # a dry run writes nothing


def test_a_requests_bad_input_is_the_command_lines_one_line(project):
    request = LaunchRequest(config="demo.toml", gpus="H100:8", study="s", dry_run=True)
    with pytest.raises(ConfigError, match=r"^--storage and --study are a sweep's: give --sweep"):
        run(request)
    with pytest.raises(ConfigError, match=r"^--max-restarts -1 is invalid: give 0 or more$"):
        run(LaunchRequest(config="demo.toml", gpus="H100:8", max_restarts=-1, dry_run=True))


def test_only_the_node_agent_parses_a_command_line_under_fleet():
    """The agent is its own program (`python -m thrifty.fleet.agent`); the rest of the fleet
    takes typed values."""
    parsing = set()
    for path in sorted(FLEET.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if "argparse" in names:
                parsing.add(path.stem)
    assert parsing == {"agent"}
