"""`thrifty launch`: the job files it writes, what it submits, its cost estimate, bad input.

SkyPilot's own task loader reads the YAML; the sbatch script is run by bash with fake
`srun` and `scontrol` on PATH; submission goes to fake `sky` and `sbatch` executables that
record their arguments. Nothing reaches a cloud or a cluster.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from thrifty.cli import main
from thrifty.plan.catalog import load_catalog
from thrifty.plan.estimate import estimate

REPO = Path(__file__).resolve().parents[2]
BUCKET = "s3://fleet-bucket/demo"


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project directory holding the demo config and a requirements file; the cwd."""
    shutil.copy(REPO / "examples" / "demo.toml", tmp_path / "demo.toml")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fake_executable(folder: Path, name: str, body: str = "") -> Path:
    """An executable `name` in `folder` that appends its arguments to `name`.argv."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(f'#!/bin/bash\necho "$@" >> "{folder / name}.argv"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def only_on_path(monkeypatch, folder: Path) -> None:
    """PATH is `folder` plus the system's basics (no sky, no sbatch from elsewhere)."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(folder), "/usr/bin", "/bin"]))


def launch(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["launch", "demo.toml", *args])
    out, err = capsys.readouterr()
    return code, out, err


def dry_run_file(out: str) -> str:
    """The job file a --dry-run printed after its marker line."""
    return out.split("(not written: --dry-run) ---\n", 1)[1]


def test_the_skypilot_task_is_read_by_skypilots_own_loader(project, capsys, tmp_path):
    sky = pytest.importorskip(
        "sky", reason="SkyPilot is not installed: pip install 'thrifty[skypilot]'"
    )
    from thrifty.fleet.skypilot import exit_codes_supported

    code, out, _ = launch(
        capsys, "--gpus", "H100:8", "--nodes", "2", "--spot", "--bucket", BUCKET, "--dry-run"
    )
    assert code == 0
    path = tmp_path / "task.yaml"
    path.write_text(dry_run_file(out))
    task = sky.Task.from_yaml(str(path))
    (resources,) = task.resources
    assert task.num_nodes == 2 and task.name == "thrifty-demo"
    assert resources.accelerators == {"H100": 8} and resources.use_spot
    assert resources.job_recovery["max_restarts_on_errors"] == 3
    if exit_codes_supported():
        assert resources.job_recovery["recover_on_exit_codes"] in (75, [75])
    assert task.envs["CHECKPOINT_LOCATION"] == BUCKET
    assert "pip install '.thrifty-launch/thrifty-0.1.0-py3-none-any.whl[s3]'" in task.setup
    assert "pip install -r requirements.txt" in task.setup
    for needed in ("SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert needed in task.run
    assert '--set checkpoint.location="$CHECKPOINT_LOCATION"' in task.run


def test_a_skypilot_with_exit_code_recovery_gets_75_listed(project):
    from thrifty.fleet.job import FleetJob, GpuRequest
    from thrifty.fleet.skypilot import task_yaml

    job = FleetJob(name="thrifty-x", config="demo.toml", gpus=GpuRequest("H100-SXM", "H100", 8))
    assert "    recover_on_exit_codes: [75]\n" in task_yaml(job, wheel="t.whl", exit_codes=True)
    assert "\n    recover_on_exit_codes:" not in task_yaml(job, wheel="t.whl", exit_codes=False)


def test_the_skypilot_run_script_starts_the_agent_on_the_head_nodes_rendezvous(
    project, capsys, tmp_path
):
    code, out, _ = launch(capsys, "--gpus", "A100:4", "--bucket", BUCKET, "--dry-run")
    assert code == 0
    run = dry_run_file(out).split("run: |\n", 1)[1]
    script = "\n".join(line[2:] for line in run.splitlines())
    bin_dir = tmp_path / "bin"
    fake_executable(bin_dir, "python")
    env = {
        "PATH": os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]),
        "SKYPILOT_NODE_IPS": "10.0.0.7\n10.0.0.8",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NUM_GPUS_PER_NODE": "4",
        "SKYPILOT_TASK_ID": "job-1",
        "CHECKPOINT_LOCATION": BUCKET,
    }
    subprocess.run(["bash", "-c", script], env=env, check=True)
    argv = (bin_dir / "python.argv").read_text().split()
    assert argv[:2] == ["-m", "thrifty.fleet.agent"]
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.7:29500"
    assert argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--nproc-per-node") + 1] == "4"
    assert argv[argv.index("--") + 1 :] == [
        "train",
        "demo.toml",
        "--set",
        f"checkpoint.location={BUCKET}",
    ]


def sbatch_text(capsys, *args: str) -> str:
    code, out, _ = launch(capsys, "--engine", "slurm", "--dry-run", *args)
    assert code == 0
    return dry_run_file(out)


def test_the_sbatch_script_signals_the_steps_ahead_of_the_limit_and_requeues(project, capsys):
    text = sbatch_text(
        capsys, "--gpus", "H100:8", "--nodes", "2", "--bucket", BUCKET, "--time", "24h"
    )
    options = [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH")]
    # The signal reaches the job steps (no B:), ahead by the upload deadline (90 s), the
    # agent's margin (30 s) and Slurm's lateness (60 s).
    assert "--signal=USR1@180" in options
    assert {"--requeue", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8"} <= set(options)
    assert "--time=1-00:00:00" in options
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST"' in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


@pytest.mark.parametrize(("step_code", "requeued"), [(75, True), (0, False), (1, False)])
def test_the_sbatch_script_requeues_exactly_when_the_step_ends_75(
    project, capsys, tmp_path, step_code, requeued
):
    text = sbatch_text(capsys, "--gpus", "H100:8", "--nodes", "2", "--bucket", BUCKET)
    bin_dir = tmp_path / "bin"
    fake_executable(bin_dir, "srun", f"exit {step_code}")
    fake_executable(bin_dir, "python")  # the environment check: thrifty is there
    fake_executable(bin_dir, "scontrol", 'if [ "$1" = show ]; then printf "gpu1\\ngpu2\\n"; fi')
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = {
        "PATH": os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"]),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
    }
    result = subprocess.run(["bash", str(script)], env=env)
    assert result.returncode == step_code
    srun = (bin_dir / "srun.argv").read_text().split()
    assert srun[srun.index("--rdzv-endpoint") + 1] == "gpu1:29500"
    assert srun[srun.index("--rdzv-id") + 1] == "4242"
    calls = (bin_dir / "scontrol.argv").read_text().splitlines()
    assert calls[0] == "show hostnames gpu[1-2]"
    assert ("requeue 4242" in calls) == requeued


def test_without_dry_run_the_task_is_written_and_submitted_with_sky_jobs_launch(
    project, capsys, monkeypatch
):
    bin_dir = project / "bin"
    fake_executable(bin_dir, "sky")
    only_on_path(monkeypatch, bin_dir)
    code, out, _ = launch(capsys, "--gpus", "H100:8", "--spot", "--bucket", BUCKET)
    assert code == 0
    written = project / "demo.sky.yaml"
    assert "use_spot: true" in written.read_text()
    argv = (bin_dir / "sky.argv").read_text().split()
    assert argv == ["jobs", "launch", "--yes", "-n", "thrifty-demo", "demo.sky.yaml"]
    assert out.index("Cost") < out.index("wrote demo.sky.yaml")


def test_the_sbatch_command_to_paste_quotes_the_scripts_path(project, capsys, monkeypatch):
    only_on_path(monkeypatch, project / "bin")
    out_file = "j2 $(touch PWNED);x.sbatch"
    code, out, _ = launch(capsys, "--gpus", "H100:8", "--engine", "slurm", "--out", out_file)
    assert code == 0
    command = out.split("submit it on the cluster with ", 1)[1].splitlines()[0]
    assert shlex.split(command) == ["sbatch", out_file]  # pasted, it runs nothing else
    subprocess.run(["bash", "-c", command.replace("sbatch", "true", 1)], cwd=project, check=True)
    assert not (project / "PWNED").exists()


def test_sbatch_on_path_submits_and_without_it_the_script_is_written_with_the_command(
    project, capsys, monkeypatch
):
    bin_dir = project / "bin"
    only_on_path(monkeypatch, bin_dir)
    bin_dir.mkdir()
    code, out, _ = launch(capsys, "--gpus", "H100:8", "--engine", "slurm")
    assert code == 0 and "submit it on the cluster with sbatch demo.sbatch" in out
    assert os.access(project / "demo.sbatch", os.X_OK)

    fake_executable(bin_dir, "sbatch")
    code, out, _ = launch(capsys, "--gpus", "H100:8", "--engine", "slurm", "--overwrite")
    assert code == 0 and (bin_dir / "sbatch.argv").read_text().split() == ["demo.sbatch"]


def test_an_existing_file_is_kept_without_overwrite(project, capsys, monkeypatch):
    (project / "demo.sbatch").write_text("mine\n")
    only_on_path(monkeypatch, project / "empty")
    code, _, err = launch(capsys, "--gpus", "H100:8", "--engine", "slurm")
    assert code == 2
    assert (
        err
        == "thrifty: error: demo.sbatch exists: give --overwrite to replace it, or another --out\n"
    )
    assert (project / "demo.sbatch").read_text() == "mine\n"


def test_the_cost_printed_is_the_planners_estimate(project, capsys):
    code, out, _ = launch(
        capsys,
        "--gpus",
        "H100:8",
        "--nodes",
        "2",
        "--bucket",
        BUCKET,
        "--params",
        "7B",
        "--tokens",
        "140B",
        "--dry-run",
    )
    assert code == 0
    instance = load_catalog().instance("p5.48xlarge")  # the cheapest 8 x H100 with spot
    planned = estimate(7e9, 140e9, instance=instance, count=2, dtype="bf16")
    # Each of the three with the final save (60 s), as the expected cost on spot has it.
    save_hours = 60 / 3600
    on_demand = planned.cost["on-demand"] + planned.price_per_hour["on-demand"] * save_hours
    spot = planned.cost["spot"] + planned.price_per_hour["spot"] * save_hours
    assert f"on-demand  ${on_demand:,.2f} ($110.08/h, with the final 60 s save)" in out
    assert f"spot       ${spot:,.2f} uninterrupted ($40.41/h, with the final 60 s save)" in out
    (expected,) = [line for line in out.splitlines() if line.startswith("  expected   $")]
    assert float(expected.split("$")[1].split()[0].replace(",", "")) > spot
    # Priced as the run saves: Young/Daly's optimum for so rare an interruption is hours apart,
    # checkpoint.max_interval (30 minutes) caps it.
    assert expected.endswith("a checkpoint every 30 min")
    assert out.index("Cost") < out.index("--- demo.sky.yaml")


def test_the_parameters_are_counted_from_the_config_model(project, capsys):
    from thrifty.demo import build_model

    code, out, _ = launch(capsys, "--gpus", "H100:8", "--engine", "slurm", "--dry-run")
    model = build_model(n_layer=4, n_head=4, n_embd=128, block_size=128)
    assert code == 0
    assert f"{sum(p.numel() for p in model.parameters()):,} parameters counted" in out
    assert "tokens = run.max_steps 300 x batch 32 x 128 tokens per sample" in out


def one_line(capsys, *args: str) -> str:
    code, out, err = launch(capsys, *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("thrifty: error: ")
    return err


def test_an_unknown_gpu_lists_the_catalogs(project, capsys):
    err = one_line(capsys, "--gpus", "H1000:8", "--dry-run")
    assert "--gpus 'H1000:8' is invalid: unknown GPU 'H1000'" in err
    assert "H100-SXM" in err and "A100-SXM4-40GB" in err and "MI300X" in err


@pytest.mark.parametrize("gpus", ["H100:0", "H100:x", "H100:-1", ":8", "H100:99999999999999999999"])
def test_a_malformed_gpu_request_is_one_line(project, capsys, gpus):
    err = one_line(capsys, "--gpus", gpus, "--dry-run")
    assert f"--gpus {gpus!r} is invalid" in err and "e.g. H100:8" in err


@pytest.mark.parametrize("engine", ["skypilot", "slurm"])
def test_several_nodes_without_shared_storage_are_refused(project, capsys, engine):
    err = one_line(capsys, "--gpus", "H100:8", "--nodes", "2", "--engine", engine, "--dry-run")
    assert "--nodes 2 without --bucket: a fleet without shared storage cannot resume" in err


def test_a_config_with_a_bucket_location_needs_no_bucket_option(project, capsys):
    code, out, _ = launch(
        capsys,
        "--gpus",
        "H100:8",
        "--nodes",
        "2",
        "--dry-run",
        "--set",
        f"checkpoint.location={BUCKET}",
    )
    assert code == 0 and f"--set checkpoint.location={BUCKET}" in out


def test_skypilot_missing_names_the_install(project, capsys, monkeypatch):
    only_on_path(monkeypatch, project / "empty")
    err = one_line(capsys, "--gpus", "H100:8", "--spot", "--bucket", BUCKET)
    assert "SkyPilot is not installed: pip install 'thrifty[skypilot]'" in err
    assert not (project / "demo.sky.yaml").exists()


def test_a_local_folder_is_no_bucket_for_skypilot(project, capsys):
    err = one_line(capsys, "--gpus", "H100:8", "--bucket", "/shared/ckpt", "--dry-run")
    assert "SkyPilot's machines share no folder" in err


def test_an_instance_with_other_gpus_is_refused(project, capsys):
    err = one_line(capsys, "--gpus", "H100:8", "--instance", "p4d.24xlarge", "--dry-run")
    assert "--instance 'p4d.24xlarge' is invalid: it has 8 x A100-SXM4-40GB" in err


def test_the_tokens_are_the_budget_reached_first(project, capsys):
    code, out, _ = launch(
        capsys, "--gpus", "H100:8", "--engine", "slurm", "--dry-run", "--set", "run.max_tokens=1000"
    )
    assert code == 0
    assert "875,264 parameters x 1,000 tokens" in out and "tokens from run.max_tokens" in out
