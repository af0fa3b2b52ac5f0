"""`thrifty launch --sweep SPACE.toml`: one sweep worker per node, a trial per GPU, every node
taking trials from the one study `--storage` names; the study's URL (its password) travels in
an environment variable, never in the job file. The scripts run in the sandbox of
launch_sandbox.py, with recording stand-ins for python and srun."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fleet.launch_sandbox import SKY_ENV, Sandbox
from thrifty.cli import main

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "s3cr3t-pg-pass"
STORAGE = f"postgresql+psycopg://sweeper:{PASSWORD}@db.internal:5432/studies"
ARGS = ("--gpus", "H100:8", "--nodes", "2", "--params", "1M", "--tokens", "1M")


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "demo.toml").write_text((REPO / "examples" / "demo.toml").read_text())
    (project / "space.toml").write_text('["optimizer.lr"]\nlow = 1e-4\nhigh = 1e-2\nlog = true\n')
    monkeypatch.chdir(project)
    return project


def launch(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["launch", "demo.toml", *ARGS, *args])
    out, err = capsys.readouterr()
    assert PASSWORD not in out and PASSWORD not in err
    return code, out, err


def job_file(out: str) -> str:
    return out.split("(not written: --dry-run) ---\n", 1)[1]


SWEEP = ("--sweep", "space.toml", "--storage", STORAGE, "--study", "lr-search", "--dry-run")
# What every node runs: a sweep worker with a trial per GPU, the study's URL exactly as given.
COMMAND = [
    "-m", "thrifty", "sweep", "demo.toml", "--space", "space.toml", "--storage", STORAGE,
    "--study", "lr-search", "--out", "runs/sweep-lr-search", "--workers", "8",
    "--set", "run.name=lr",
]  # fmt: skip


def test_the_sbatch_script_starts_one_sweep_worker_per_node(project, capsys, tmp_path):
    code, out, _ = launch(capsys, *SWEEP, "--engine", "slurm", "--set", "run.name=lr")
    assert code == 0
    text = job_file(out)
    assert PASSWORD not in text and "THRIFTY_SWEEP_STORAGE: the sweep's study (--storage)" in text
    assert "thrifty.fleet.agent" not in text  # no rendezvous: each node sweeps on its own
    box = Sandbox(tmp_path, project)
    result = box.run_sbatch(text, {"THRIFTY_SWEEP_STORAGE": STORAGE})
    assert result.returncode == 0, result.stderr
    (srun,) = box.calls("srun")
    assert srun[:1] == ["--ntasks-per-node=1"]  # one worker on every node
    assert srun[srun.index("python") + 1 :] == COMMAND


def test_the_skypilot_task_starts_one_sweep_worker_per_node(project, capsys, tmp_path):
    sky = pytest.importorskip(
        "sky", reason="SkyPilot is not installed: pip install 'thrifty[skypilot]'"
    )
    code, out, _ = launch(capsys, *SWEEP, "--set", "run.name=lr")
    assert code == 0
    loaded = yaml.safe_load(job_file(out))
    assert loaded["num_nodes"] == 2 and loaded["envs"] == {"THRIFTY_SWEEP_STORAGE": None}
    task = sky.Task.from_yaml_config(loaded, env_overrides=[("THRIFTY_SWEEP_STORAGE", STORAGE)])
    box = Sandbox(tmp_path, project)
    result = box.run_sky(task.run, {**task.envs, **SKY_ENV})
    assert result.returncode == 0, result.stderr
    (node,) = box.calls("python")
    assert node == COMMAND


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--sweep", "space.toml"), "--nodes 2 with --sweep needs --storage URL"),
        (("--sweep", "nowhere.toml", "--storage", STORAGE), "--sweep nowhere.toml: no such file"),
        (("--storage", STORAGE), "--storage and --study are a sweep's"),
        (
            ("--sweep", "space.toml", "--storage", STORAGE, "--spot", "--engine", "skypilot"),
            "--spot without --bucket: SkyPilot relaunches a preempted job on a new machine",
        ),
        (
            ("--sweep", "space.toml", "--storage", STORAGE, "--bucket", "/shared/x"),
            "--bucket '/shared/x' is invalid: SkyPilot's machines share no folder",
        ),
    ],
)
def test_a_sweep_job_that_cannot_work_is_one_line(project, capsys, args, words):
    code, _, err = launch(capsys, *args, "--dry-run")
    assert code == 2
    assert words in err and err.count("\n") == 1


def test_a_sweeps_bucket_reaches_every_trial_its_secret_in_the_environment(
    project, capsys, tmp_path
):
    # Each trial then saves under BUCKET/STUDY/trials/NNNN (tests/test_sweep.py): a trial a dead or
    # preempted node leaves behind resumes there on whichever node takes it up.
    bucket = "s3://AKIAIOSFODNN7EXAMPLE:bucket-s3cr3t@b/sweeps"
    code, out, _ = launch(
        capsys, *SWEEP, "--engine", "slurm", "--spot", "--bucket", bucket, "--set", "run.name=lr"
    )
    assert code == 0
    text = job_file(out)
    assert "bucket-s3cr3t" not in text and "CHECKPOINT_LOCATION" in text
    box = Sandbox(tmp_path, project)
    result = box.run_sbatch(text, {"THRIFTY_SWEEP_STORAGE": STORAGE, "CHECKPOINT_LOCATION": bucket})
    assert result.returncode == 0, result.stderr
    (srun,) = box.calls("srun")
    assert srun[srun.index("python") + 1 :] == [*COMMAND, "--set", f"checkpoint.location={bucket}"]
