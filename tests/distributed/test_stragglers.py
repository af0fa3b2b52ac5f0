"""Stragglers on two real processes (DDP, gloo on CPU): a rank whose forward is slower than
the other's is recorded as the slowest in the metrics and named in diagnosis.json; with both
ranks alike, none is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
TIMEOUT = 120  # seconds the launch may take before the test fails instead of hanging

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


def train_two_ranks(tmp_path: Path, slow_rank: int, slow_ms: float, data_ms: float = 0.0) -> Path:
    config = tmp_path / "config.toml"
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
    config.write_text(text)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS / "distributed"), str(TESTS), str(REPO / "src")]),
        OMP_NUM_THREADS="1",
        THRIFTY_SPOT_PROVIDER="none",
    )
    command = [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(out)]
    result = subprocess.run(
        [*command, "--nprocs", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def interval_records(run: Path) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for line in lines if "ranks" in (r := json.loads(line))]


def test_a_rank_slower_at_its_forward_is_recorded_and_named_a_straggler(tmp_path):
    run = train_two_ranks(tmp_path, slow_rank=1, slow_ms=25.0)
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


def test_ranks_doing_the_same_work_name_no_straggler(tmp_path):
    run = train_two_ranks(tmp_path, slow_rank=-1, slow_ms=0.0)
    assert all(len(r["ranks"]["work_seconds"]) == 2 for r in interval_records(run))
    diagnosis = json.loads((run / "diagnosis.json").read_text())
    assert "straggler" in diagnosis and diagnosis["straggler"] is None
    assert not any("straggler" in line for line in diagnosis["evidence"])


def test_a_rank_slower_at_fetching_its_data_is_named_with_the_data_advice(tmp_path):
    # Rank 1's items cost 1 ms each (32 ms a micro-batch); rank 0's cost nothing. Rank 0's own
    # data wait includes waiting for rank 1 in the fetch's agreement: only the time outside
    # agreements tells them apart.
    run = train_two_ranks(tmp_path, slow_rank=1, slow_ms=0.0, data_ms=1.0)
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
