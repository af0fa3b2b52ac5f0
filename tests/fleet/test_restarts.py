"""A preempted worker group under torch's elastic agent: what plain torchrun returns, what
thrifty's node agent returns, and a restart (`--max-restarts 1`) that resumes the run.

Rank 1 is sent SIGTERM while it loads a batch of the first attempt only (fleet_task.py);
the others run undisturbed, on 2 gloo processes on CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from train_in_turn import torchrun_in_turn

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
TIMEOUT = 240  # seconds a launch may take before the test fails instead of hanging
STEPS = 12

CONFIG = f"""
[run]
max_steps = {STEPS}
log_every = 1
progress = "off"
seed = 7

[precision]
mode = "fp32"

[batch]
micro = 16
effective = 64

[data]
num_workers = 0

[eval]
every = 5

[checkpoint]
every = "off"

[measure]
system = false
peak_tflops = 1.0

[distributed]
strategy = "ddp"
timeout = "60s"

[task]
model = "dist_task:model"
train_data = "fleet_task:train_data"
val_data = "fleet_task:val_data"
optimizer = "dist_task:sgd"
loss_fn = "dist_task:cross_entropy"
data_args = {{ at = {{at}} }}
"""


def write_config(tmp: Path, at: int) -> Path:
    """`at`: the item of rank 1's first attempt that brings the SIGTERM (a large one: never)."""
    path = tmp / f"preempt-{at}.toml"
    path.write_text(CONFIG.replace("{at}", str(at)))
    return path


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    # torchrun's workers share its agent's store, as by default (a second Trainer in a job, and a
    # restarted worker group, meet there on keys of their own).
    dropped = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    environ = {k: v for k, v in os.environ.items() if k not in dropped}
    environ.update(
        PYTHONPATH=os.pathsep.join([str(TESTS / "fleet"), str(TESTS), str(REPO / "src")]),
        OMP_NUM_THREADS="1",
        THRIFTY_SPOT_PROVIDER="none",
        **env,
    )
    return subprocess.run(
        command, cwd=REPO, env=environ, capture_output=True, text=True, timeout=TIMEOUT
    )


def torchrun(*args: str, **env: str) -> subprocess.CompletedProcess:
    return run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            *args,
        ],
        **env,
    )


def agent(*args: str) -> subprocess.CompletedProcess:
    return run(
        [
            sys.executable,
            "-m",
            "thrifty.fleet.agent",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--rdzv-endpoint",
            "localhost:0",
            "--rdzv-id",
            "test",
            *args,
        ]
    )


def losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One job under plain torchrun (no restarts) whose 2 processes train, in turn, an
    undisturbed run (`reference`, the restart test's) and then one whose rank 1 is preempted
    (`plain`): one launch for both."""
    tmp = tmp_path_factory.mktemp("plain")
    reference = [str(write_config(tmp, at=10**9)), "--out", str(tmp / "reference")]
    preempted = [str(write_config(tmp, at=100)), "--out", str(tmp / "plain")]
    return tmp, run(torchrun_in_turn(reference, preempted))


def test_plain_torchrun_says_1_where_the_node_agent_keeps_75(tmp_path, plain):
    folder, result = plain
    assert result.returncode == 1, result.stderr[-2000:]
    assert "exitcode: 75" in result.stderr  # what the worker said, lost in the exit code
    assert "preempted at step" in result.stdout
    assert not (folder / "plain" / "summary.json").exists()

    config = write_config(tmp_path, at=100)
    kept = agent("--", "train", str(config), "--out", str(tmp_path / "agent"))
    assert kept.returncode == 75, kept.stderr[-3000:]
    assert "preempted at step" in kept.stdout
    assert not (tmp_path / "agent" / "summary.json").exists()


def test_a_preempted_group_restarted_by_torchrun_resumes_and_finishes_exactly(tmp_path, plain):
    reference = plain[0] / "reference"
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["stop_reason"] == "max_steps"

    out = tmp_path / "restarted"
    result = torchrun(
        "--max-restarts",
        "1",
        "-m",
        "thrifty",
        "train",
        str(write_config(tmp_path, at=100)),
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preempted at step" in result.stdout
    stopped = int(result.stdout.split("preempted at step ")[1].split(";")[0])
    assert 0 < stopped < STEPS
    assert f"resumed from step {stopped}" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["stop_reason"] == "max_steps"
    assert losses(out) == losses(reference)  # every step once, each the same as undisturbed
