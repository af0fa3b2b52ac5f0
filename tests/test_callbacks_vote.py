"""A callback's votes across two real processes (torchrun, gloo on CPU): summed on the step's
one agreement, so the ranks stop together and no collective is added."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 180  # seconds the launch may take before the test fails instead of hanging

# One torchrun job of 2 ranks runs the cases in turn, each a Trainer of its own: a launch costs
# more than the cases together. Each rank counts the all-reduces it makes, and writes a file.
VOTING = """
import json
import os
import sys

import torch
import torch.distributed as dist

from thrifty import Trainer, TrainConfig
from thrifty.callbacks import Callback

RANK = int(os.environ["RANK"])
reduces = [0]
all_reduce = dist.all_reduce


def counted(*args, **kwargs):
    reduces[0] += 1
    return all_reduce(*args, **kwargs)


dist.all_reduce = counted


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(6, 1)

    def forward(self, x, y):
        return ((self.linear(x) - y) ** 2).mean()


class WantsToStop(Callback):
    # Rank 1 alone wants to stop at step `at`: the summed vote tells both ranks.
    votes = 1

    def __init__(self, at):
        self.at, self.heard = at, []

    def vote(self, step):
        return [int(RANK == 1 and step == self.at)]

    def on_step_end(self, step_info):
        self.heard.append([step_info.step, *step_info.votes])
        if step_info.votes[0] > 0:
            step_info.stop(f"rank 1 asked at step {step_info.step}")


g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(256, 6, generator=g), torch.randn(256, 1, generator=g))
for case in ["stop", "quiet", "none"]:
    out = os.path.join(sys.argv[1], case)
    config = TrainConfig.from_dict({
        "run": {"max_steps": 4 if case != "stop" else 8, "out": out, "progress": "off",
                "device": "cpu", "log_every": 2},
        "precision": {"mode": "fp32"},
        "batch": {"micro": 8},
        "data": {"num_workers": 0},
        "measure": {"system": False},
        "distributed": {"timeout": "60s", "strategy": "ddp"},
    })
    callback = WantsToStop(at=3 if case == "stop" else 0)
    callbacks = [callback] if case != "none" else None
    reduces[0] = 0
    with Trainer(Net(), data, config, callbacks=callbacks) as trainer:
        result = trainer.fit()
    with open(os.path.join(sys.argv[1], f"{case}.{RANK}.json"), "w") as f:
        json.dump({"steps": result.steps, "stop_reason": result.stop_reason,
                   "stop_detail": result.stop_detail, "heard": callback.heard,
                   "reduces": reduces[0]}, f)
"""


@pytest.fixture(scope="module")
def voted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("voted")
    script = folder / "voting.py"
    script.write_text(VOTING)
    dropped = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "tests"), str(REPO / "src")]),
        OMP_NUM_THREADS="1",
        THRIFTY_SPOT_PROVIDER="none",
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(script), str(folder)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return folder


def ranks(folder: Path, case: str) -> list[dict]:
    return [json.loads((folder / f"{case}.{rank}.json").read_text()) for rank in (0, 1)]


def test_one_ranks_vote_stops_both_ranks_at_the_same_step(voted):
    for rank in ranks(voted, "stop"):
        assert rank["steps"] == 3
        assert rank["stop_reason"] == "callback"
        assert rank["stop_detail"] == "rank 1 asked at step 3"
        # Each rank heard the sum: rank 1's 1 at step 3, nobody's before.
        assert rank["heard"] == [[1, 0], [2, 0], [3, 1]]
    summary = json.loads((voted / "stop" / "summary.json").read_text())
    assert summary["stop_reason"] == "callback" and summary["steps"] == 3
    assert summary["stop_detail"] == "rank 1 asked at step 3"


def test_votes_ride_on_the_steps_agreement_with_no_collective_of_their_own(voted):
    quiet, none = ranks(voted, "quiet"), ranks(voted, "none")
    for rank in quiet:
        assert rank["steps"] == 4 and rank["stop_reason"] == "max_steps"
        assert rank["heard"] == [[1, 0], [2, 0], [3, 0], [4, 0]]
    assert [r["reduces"] for r in quiet] == [r["reduces"] for r in none]
    assert none[0]["reduces"] > 4  # counted: at least the steps' agreements
