"""`thrifty launch`: no secret in a job file, on screen, or on an engine's command line.

Credentials in `--bucket`, in `--set` values and in the config are redacted as in a run's
config.toml: the job file names an environment variable instead, and the value reaches the
training command through it, exactly as given. The scripts run in the sandbox of
launch_sandbox.py; submission goes to recording stand-ins for sky and sbatch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fleet.launch_sandbox import SKY_ENV, Sandbox, agent_command
from thrifty.cli import main

REPO = Path(__file__).resolve().parents[2]
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
PASSWORD = "hunter2-pass"
SIGNATURE = "deadbeefcafe0123"
TOKEN = "hf_abcdefSECRETTOKEN"
CONFIG_SECRET = "config-file-secret-9"
SECRETS = (KEY_ID, SECRET, PASSWORD, SIGNATURE, TOKEN, CONFIG_SECRET)

BUCKET = f"s3://{KEY_ID}:{PASSWORD}@fleet-bucket/run"
SETS = (
    f'checkpoint.storage_options={{key = "{KEY_ID}", secret = "{SECRET}"}}',
    "run.name=plain",
    f"checkpoint.resume=https://b.s3.amazonaws.com/c?X-Amz-Signature={SIGNATURE}&X-Amz-Expires=60",
    f"task.model_args.hf_token={TOKEN}",
)
# What the submitting environment holds: the value of each secret --set, and the bucket.
PASSED = {
    "THRIFTY_SET_1": SETS[0].partition("=")[2],
    "THRIFTY_SET_2": SETS[2].partition("=")[2],
    "THRIFTY_SET_3": TOKEN,
    "CHECKPOINT_LOCATION": BUCKET,
}
ARGS = ("--gpus", "H100:8", "--nodes", "2", "--bucket", BUCKET, "--params", "1M", "--tokens", "1M")
SET_ARGS = tuple(word for item in SETS for word in ("--set", item))
# The training command every node runs: the user's values, exactly.
COMMAND = ["train", "demo.toml", *SET_ARGS, "--set", f"checkpoint.location={BUCKET}"]


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """The demo config with credentials of its own, in the current directory."""
    project = tmp_path / "project"
    project.mkdir()
    demo = (REPO / "examples" / "demo.toml").read_text()
    (project / "demo.toml").write_text(
        demo.replace(
            "[data]",
            f'[checkpoint]\nlocation = "s3://user:{CONFIG_SECRET}@b/x"\n'
            f'storage_options = {{ secret = "{CONFIG_SECRET}" }}\n\n[data]',
        )
    )
    monkeypatch.chdir(project)
    return project


def launch(capsys, *args: str) -> tuple[int, str]:
    code = main(["launch", "demo.toml", *ARGS, *SET_ARGS, *args])
    out, err = capsys.readouterr()
    for secret in SECRETS:
        assert secret not in out and secret not in err, secret
    return code, out


def job_file(out: str) -> str:
    return out.split("(not written: --dry-run) ---\n", 1)[1]


def test_the_skypilot_task_names_each_secret_and_the_nodes_receive_it(project, capsys, tmp_path):
    sky = pytest.importorskip(
        "sky", reason="SkyPilot is not installed: pip install 'thrifty[skypilot]'"
    )
    code, out = launch(capsys, "--dry-run")
    assert code == 0
    text = job_file(out)
    for name, what in [
        ("THRIFTY_SET_1", "the value of --set number 1"),
        ("THRIFTY_SET_2", "the value of --set number 3"),
        ("CHECKPOINT_LOCATION", "the checkpoint location (--bucket)"),
    ]:
        assert f"#   {name}: {what}\n" in text
    loaded = yaml.safe_load(text)
    assert loaded["envs"] == dict.fromkeys(PASSED)
    # SkyPilot itself refuses the task until the submitting environment gives each value.
    with pytest.raises(ValueError, match="Environment variable 'THRIFTY_SET_1' is None"):
        sky.Task.from_yaml_config(yaml.safe_load(text))
    task = sky.Task.from_yaml_config(loaded, env_overrides=list(PASSED.items()))

    box = Sandbox(tmp_path, project)
    result = box.run_sky(task.run, {**task.envs, **SKY_ENV})
    assert result.returncode == 0, result.stderr
    (node,) = box.calls("python")
    assert agent_command(node) == COMMAND


def test_the_sbatch_script_names_each_secret_and_the_steps_receive_it(project, capsys, tmp_path):
    code, out = launch(capsys, "--dry-run", "--engine", "slurm")
    assert code == 0
    text = job_file(out)
    assert "#   THRIFTY_SET_3: the value of --set number 4\n" in text
    box = Sandbox(tmp_path, project)
    result = box.run_sbatch(text, PASSED)
    assert result.returncode == 0, result.stderr
    (srun,) = box.calls("srun")
    assert agent_command(srun) == COMMAND


def test_a_job_whose_secret_is_not_set_stops_naming_the_variable(project, capsys, tmp_path):
    _, out = launch(capsys, "--dry-run", "--engine", "slurm")
    box = Sandbox(tmp_path, project)
    result = box.run_sbatch(
        job_file(out), {k: v for k, v in PASSED.items() if k != "THRIFTY_SET_2"}
    )
    assert result.returncode != 0
    assert (
        "THRIFTY_SET_2: set THRIFTY_SET_2 in the environment that submits this job" in result.stderr
    )
    assert box.calls("srun") == []


def test_submitting_hands_the_secrets_to_sky_in_its_environment_only(
    project, capsys, tmp_path, monkeypatch
):
    pytest.importorskip("sky", reason="SkyPilot is not installed: pip install 'thrifty[skypilot]'")
    box = Sandbox(tmp_path, project, watch=tuple(PASSED))
    monkeypatch.setenv("PATH", os.pathsep.join([str(box.bin), "/usr/bin", "/bin"]))
    code, out = launch(capsys)
    assert code == 0
    written = (project / "demo.sky.yaml").read_text()
    assert not any(secret in written for secret in SECRETS)
    (call,) = box.records("sky")
    passing = [w for name in PASSED for w in ("--env", name)]
    assert call["argv"] == [
        "jobs",
        "launch",
        "--yes",
        *passing,
        "-n",
        "thrifty-plain",
        "demo.sky.yaml",
    ]
    assert call["env"] == PASSED
    assert f"submitting: sky jobs launch --yes {' '.join(passing)} -n thrifty-plain" in out


def test_submitting_hands_the_secrets_to_sbatch_in_its_environment_only(
    project, capsys, tmp_path, monkeypatch
):
    box = Sandbox(tmp_path, project, watch=tuple(PASSED))
    monkeypatch.setenv("PATH", os.pathsep.join([str(box.bin), "/usr/bin", "/bin"]))
    code, _ = launch(capsys, "--engine", "slurm")
    assert code == 0
    written = (project / "demo.sbatch").read_text()
    assert not any(secret in written for secret in SECRETS)
    assert "#SBATCH --export=ALL" in written
    (call,) = box.records("sbatch")
    assert call == {"argv": ["demo.sbatch"], "env": PASSED}


def test_without_sbatch_the_message_names_the_variables_to_set(project, capsys, monkeypatch):
    monkeypatch.setenv("PATH", os.pathsep.join([str(project / "no-sbatch"), "/usr/bin", "/bin"]))
    code, out = launch(capsys, "--engine", "slurm")
    assert code == 0
    names = ", ".join(PASSED)
    assert f"submit it on the cluster with sbatch demo.sbatch ({names} set there)\n" in out
