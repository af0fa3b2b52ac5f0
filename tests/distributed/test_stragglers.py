"""Stragglers on two real processes (DDP, gloo on CPU): a rank whose forward is slower than
the other's is recorded as the slowest in the metrics and named in diagnosis.json; with both
ranks alike, none is named."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from train_in_turn import torchrun_in_turn

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
TIMEOUT = 240  # seconds the launch (3 runs) may take before the test fails instead of hanging

CONFIG = """
[run]
max_steps = 10
log_every = 2
progress = "off"
seed = 7

[precision]
mode = "fp32"

[batch]
micro = 32
effective = 64

[data]
num_workers = 0

[checkpoint]
every = "off"
final = false

[measure]
system = false
peak_tflops = 1.0

[distributed]
strategy = "ddp"
timeout = "60s"

[task]
model = "straggler_task:model"
model_args = {{ ms = 5.0, slow_rank = {slow_rank}, slow_ms = {slow_ms} }}
train_data = "dist_task:train_data"
optimizer = "dist_task:sgd"
loss_fn = "dist_task:cross_entropy"
"""


def write_config(folder: Path, name: str, slow_rank: int, slow_ms: float, data_ms: float = 0.0):
    """The config of case `name`, written as `folder/name.toml`; returns the command line that
    trains it into `folder/name`."""
    text = CONFIG.format(slow_rank=slow_rank, slow_ms=slow_ms)
    if data_ms:  # rank `slow_rank` is slow at fetching its data instead
        text = text.replace(
            f"slow_rank = {slow_rank}, slow_ms = {slow_ms} }}",
            "slow_rank = -1, slow_ms = 0.0 }",
        ).replace(
            'train_data = "dist_task:train_data"',
            'train_data = "straggler_task:slow_data"\n'
            f"data_args = {{ slow_rank = {slow_rank}, ms = {data_ms} }}",
        )
    config = folder / f"{name}.toml"
    config.write_text(text)
    return [str(config), "--out", str(folder / name)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The three cases' runs, in `runs/<case>`: one torchrun job of two processes that trains
    them in turn, as a launch costs more than the three runs."""
    folder = tmp_path_factory.mktemp("stragglers")
    lines = [
        write_config(folder, "forward", slow_rank=1, slow_ms=25.0),
        write_config(folder, "alike", slow_rank=-1, slow_ms=0.0),
        write_config(folder, "data", slow_rank=1, slow_ms=0.0, data_ms=1.0),
    ]
    # torchrun's shared store, its default, which a second Trainer in a job needs.
    dropped = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS / "distributed"), str(TESTS), str(REPO / "src")]),
        OMP_NUM_THREADS="1",
        THRIFTY_SPOT_PROVIDER="none",
    )
    result = subprocess.run(
        torchrun_in_turn(*lines),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder


def interval_records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for line in lines if "ranks" in (r := json.loads(line))]


def test_a_rank_slower_at_its_forward_is_recorded_and_named_a_straggler(runs):
    run = runs / "forward"
    records = interval_records(run)
    assert len(records) >= 4  # every interval after the warm-up step
    for record in records:
        work = record["ranks"]["work_seconds"]
        assert len(work) == 2 and work[1] > work[0] > 0
        assert record["straggler"]["rank"] == 1
        assert record["straggler"]["lag"] > 0 and record["straggler"]["lag_seconds"] > 0
    diagnosis = json.loads((run / "diagnosis.json").read_text())
    straggler = diagnosis["straggler"]
    assert straggler["rank"] == 1 and straggler["ranks"] == 2
    assert straggler["lag"] > 0.15 and straggler["slowest_intervals"] == straggler["intervals"]
    assert straggler["idle_gpu_seconds"] > 0
    assert any(line.startswith("rank 1 is a straggler") for line in diagnosis["evidence"])
    advice = [r for r in diagnosis["recommendations"] if r["text"].startswith("rank 1 is")]
    assert len(advice) == 1 and advice[0]["area"] == "compute"  # its forward, not its data
    assert "replace the instance" in advice[0]["text"]


def test_ranks_doing_the_same_work_name_no_straggler(runs):
    run = runs / "alike"
    assert all(len(r["ranks"]["work_seconds"]) == 2 for r in interval_records(run))
    diagnosis = json.loads((run / "diagnosis.json").read_text())
    assert "straggler" in diagnosis and diagnosis["straggler"] is None
    assert not any("straggler" in line for line in diagnosis["evidence"])


def test_a_rank_slower_at_fetching_its_data_is_named_with_the_data_advice(runs):
    # Rank 1's items cost 1 ms each (32 ms a micro-batch); rank 0's cost nothing. Rank 0's own
    # data wait includes waiting for rank 1 in the fetch's agreement: only the time outside
    # agreements tells them apart.
    run = runs / "data"
    records = interval_records(run)
    assert records and all(
        r["ranks"]["data_seconds"][1] > r["ranks"]["data_seconds"][0] for r in records
    )
    straggler = json.loads((run / "diagnosis.json").read_text())["straggler"]
    assert straggler["rank"] == 1 and straggler["data_lag_seconds"] > 0
    advice = json.loads((run / "diagnosis.json").read_text())["recommendations"]
    named = [r for r in advice if r["text"].startswith("rank 1 is")]
    assert len(named) == 1 and named[0]["area"] == "data"
    # Rank 0's own loader keeps up: its data wait is the wait for rank 1, not its to fix.
    assert not any(r["text"].startswith("data wait") for r in advice), advice
