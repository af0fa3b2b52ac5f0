"""`thrifty launch`: no value the user gives can become a command in the job files.

The config's folder and file name, the requirements path beside it, run.name, `--set`
values and `--bucket` hold payloads that would create a file named PWNED if any reached a
shell unquoted. The SkyPilot task is read by SkyPilot's own loader and its setup and run
scripts are run by SkyPilot's own wrapper; the sbatch script is run by bash; every program
they start is a recording stand-in (launch_sandbox.py). No PWNED appears, and every
argument arrives exactly as given.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import tomli_w

from fleet.launch_sandbox import SKY_ENV, Sandbox, agent_command
from thrifty.cli import main
from thrifty.config import toml_loads

REPO = Path(__file__).resolve().parents[2]
WHEEL = ".thrifty-launch/thrifty-0.1.0-py3-none-any.whl"
PAYLOADS = {
    "substitution": "$(touch PWNED)",
    "backticks": "`touch PWNED`",
    "single quotes": "'; touch PWNED; '",
    "double quotes": '"; touch PWNED; echo "',
    "newline": "x\ntouch PWNED\n#",
    "yaml keys": "x\nsetup: touch PWNED\nrun: touch PWNED",
    "history and variables": "!! !$ ${HOME} $PATH ~ *",
    "non-ascii": "données – 漢字 🚀",
    "unicode line breaks": "a\u0085b\u2028c\u2029d",  # YAML reads NEL raw as a line break
    "spaces and tabs": "a  b\tc \\ \\n",
}
COST = ("--params", "1M", "--tokens", "1M")  # no model is built for the estimate


def payload_project(root: Path, payload: str) -> tuple[Path, str, str]:
    """A project whose config lives in a folder and a file named after the payload, with
    run.name the payload and a requirements file beside it; returns the project and the
    config's and requirements' paths from it."""
    project = root / "project"
    folder = project / payload.replace("/", "_")
    folder.mkdir(parents=True)
    config = toml_loads((REPO / "examples" / "demo.toml").read_text())
    config["run"]["name"] = payload
    path = folder / f"{payload.replace('/', '_')}.toml"
    path.write_text(tomli_w.dumps(config))
    (folder / "requirements.txt").write_text("numpy\n")
    rel = path.relative_to(project).as_posix()
    return project, rel, (folder / "requirements.txt").relative_to(project).as_posix()


def dry_run(capsys, config: str, *args: str) -> str:
    code = main(["launch", config, "--dry-run", *COST, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out.split("(not written: --dry-run) ---\n", 1)[1]


@pytest.fixture(params=list(PAYLOADS), ids=list(PAYLOADS))
def payload(request) -> str:
    return PAYLOADS[request.param]


def test_payloads_reach_skypilots_nodes_as_text_never_as_commands(
    payload, tmp_path, capsys, monkeypatch
):
    sky = pytest.importorskip(
        "sky", reason="SkyPilot is not installed: pip install 'thrifty[skypilot]'"
    )
    import yaml
    from sky.utils import common_utils, schemas

    project, config, requirements = payload_project(tmp_path, payload)
    monkeypatch.chdir(project)
    bucket = f"s3://bucket/{payload}"
    sets = [f"checkpoint.resume={payload}", f"run.name={payload}"]
    text = dry_run(
        capsys,
        config,
        "--gpus",
        "H100:8",
        "--bucket",
        bucket,
        *[w for s in sets for w in ("--set", s)],
    )

    loaded = yaml.safe_load(text)
    assert set(loaded) == {"name", "num_nodes", "workdir", "resources", "envs", "setup", "run"}
    common_utils.validate_schema(loaded, schemas.get_task_schema(), "Invalid task YAML: ")
    task = sky.Task.from_yaml_config(loaded)
    assert re.fullmatch(r"thrifty-[a-z0-9-]+", task.name)
    assert task.envs == {"CHECKPOINT_LOCATION": bucket}

    box = Sandbox(tmp_path, project)
    envs = {**task.envs, **SKY_ENV}
    for script in (task.setup, task.run):
        result = box.run_sky(script, envs)
        assert result.returncode == 0, result.stderr
    assert box.pwned() == []
    *setup, node = box.calls("python")
    assert setup == [
        ["-m", "pip", "install", "-r", requirements],
        ["-m", "pip", "install", f"{WHEEL}[s3]"],
        ["-m", "pip", "install", "--force-reinstall", "--no-deps", WHEEL],
    ]
    assert node[node.index("--rdzv-endpoint") + 1] == "10.0.0.7:29500"
    assert agent_command(node) == [
        "train",
        config,
        *[w for s in sets for w in ("--set", s)],
        "--set",
        f"checkpoint.location={bucket}",
    ]


def test_payloads_reach_slurms_steps_as_text_never_as_commands(
    payload, tmp_path, capsys, monkeypatch
):
    project, config, _ = payload_project(tmp_path, payload)
    monkeypatch.chdir(project)
    bucket = f"s3://bucket/{payload}"
    sets = [f"checkpoint.resume={payload}", f"run.name={payload}"]
    text = dry_run(
        capsys,
        config,
        "--gpus",
        "H100:8",
        "--engine",
        "slurm",
        "--nodes",
        "2",
        "--bucket",
        bucket,
        *[w for s in sets for w in ("--set", s)],
    )
    assert all(
        re.fullmatch(r"#SBATCH --[a-z-]+=[\w@:%.-]+|#SBATCH --requeue", line)
        for line in text.splitlines()
        if line.startswith("#SBATCH")
    )

    box = Sandbox(tmp_path, project)
    result = box.run_sbatch(text)
    assert result.returncode == 0, result.stderr
    assert box.pwned() == []
    (srun,) = box.calls("srun")
    assert srun[srun.index("--rdzv-endpoint") + 1] == "gpu1:29500"
    assert agent_command(srun) == [
        "train",
        config,
        *[w for s in sets for w in ("--set", s)],
        "--set",
        f"checkpoint.location={bucket}",
    ]


def test_no_comment_line_holds_a_value_the_user_gave(tmp_path, capsys, monkeypatch):
    payload = "x\nname: evil # $(touch PWNED)"
    project, config, _ = payload_project(tmp_path, "plain")
    monkeypatch.chdir(project)
    for engine in ("skypilot", "slurm"):
        text = dry_run(
            capsys, config, "--gpus", "H100:8", "--engine", engine, "--set", f"run.name={payload}"
        )
        comments = [line for line in text.splitlines() if line.lstrip().startswith("#")]
        # The job's name, cleaned to [a-z0-9-] from run.name, is the only trace of it.
        for raw in ("plain", "$(", "name: evil"):
            assert not any(raw in line for line in comments), (engine, raw)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "a\0b",
            "--set number 1 holds a NUL byte, which no command line or environment "
            "variable can carry: remove it",
        ),
        (
            "a\udcffb",
            "--set number 1 is not valid UTF-8 text (bytes the job file cannot "
            "hold): give it in UTF-8",
        ),
    ],
    ids=["NUL", "not UTF-8"],
)
def test_a_value_no_job_file_can_carry_is_refused_in_one_line(
    tmp_path, capsys, monkeypatch, value, message
):
    shutil.copy(REPO / "examples" / "demo.toml", tmp_path / "demo.toml")
    monkeypatch.chdir(tmp_path)
    for engine in ("skypilot", "slurm"):
        code = main(
            [
                "launch",
                "demo.toml",
                "--gpus",
                "H100:8",
                "--engine",
                engine,
                "--set",
                f"run.name={value}",
                *COST,
            ]
        )
        out, err = capsys.readouterr()
        assert code == 2 and out == ""
        assert err == f"thrifty: error: {message}\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.toml"]


def test_a_config_whose_name_begins_with_a_dash_stays_a_path(tmp_path, capsys, monkeypatch):
    shutil.copy(REPO / "examples" / "demo.toml", tmp_path / "--help.toml")
    monkeypatch.chdir(tmp_path)
    text = dry_run(capsys, "./--help.toml", "--gpus", "H100:8", "--engine", "slurm")
    box = Sandbox(tmp_path, tmp_path)
    assert box.run_sbatch(text).returncode == 0
    (srun,) = box.calls("srun")
    assert agent_command(srun) == ["train", "./--help.toml"]
