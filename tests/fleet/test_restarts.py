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
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
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


def test_plain_torchrun_says_1_where_the_node_agent_keeps_75(tmp_path):
    config = write_config(tmp_path, at=100)
    plain = torchrun("-m", "thrifty", "train", str(config), "--out", str(tmp_path / "plain"))
    assert plain.returncode == 1, plain.stderr[-2000:]
    assert "exitcode: 75" in plain.stderr  # what the worker said, lost in the exit code

    kept = agent("--", "train", str(config), "--out", str(tmp_path / "agent"))
    assert kept.returncode == 75, kept.stderr[-3000:]
    assert "preempted at step" in kept.stdout
    assert not (tmp_path / "agent" / "summary.json").exists()


def test_a_preempted_group_restarted_by_torchrun_resumes_and_finishes_exactly(tmp_path):
    reference = tmp_path / "reference"
    undisturbed = write_config(tmp_path, at=10**9)
    result = run(
        [
            sys.executable,
            "-m",
            "thrifty",
            "train",
            str(undisturbed),
            "--out",
            str(reference),
            "--nprocs",
            "2",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]

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
