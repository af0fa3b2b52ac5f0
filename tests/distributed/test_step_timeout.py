"""A rank that dies mid-run ends the job within `distributed.step_timeout`, not the start-up
`distributed.timeout`, and the ranks left exit with 75 so that running the job again resumes.

The ranks are started directly with env:// rendezvous, as torchrun starts them on separate
machines: nobody tells the ranks left that one died, as when a node fails. (thrifty's own
`--nprocs` launcher and torchrun's agent on a single machine see a worker die within their
monitor interval and stop the others themselves.) SIGKILL closes the dead rank's connections,
which the others see at once; SIGSTOP leaves them open and silent, like a machine that fell off
the network, so only the short timeout ends the wait.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from distributed.ranks_by_hand import rank_envs, run_ranks
from distributed.test_distributed import (
    REPO,
    TIMEOUT,
    _steps_logged,
    child_env,
    newest_checkpoint,
    ok,
)
from thrifty.config import DistributedConfig
from thrifty.strategies.process_group import Distributed
from thrifty.strategies.timeouts import CollectiveTimeouts, lost_rank_error

STEPS, KILL_AFTER = 24, 5  # the short timeout is in force from step 3 (steady_after)
# A healthy step here takes well under a second, and a machine whose cores other jobs hold
# can make it take a few: the step timeout is far above what a busy machine can reach, yet
# its end comes long before the start-up timeout (10m) and TIMEOUT, the bound on the wait.
STEP_TIMEOUT = "20s"

CONFIG = """
[run]
max_steps = {steps}
log_every = 1
progress = "off"
seed = 7

[precision]
mode = "fp32"

[batch]
micro = 16
effective = 96  # 3 micro-batches on each of 2 ranks, 2 on each of 3

[data]
num_workers = 0

[checkpoint]
every = 2

[measure]
system = false
peak_tflops = 1.0

[distributed]
timeout = "10m"
step_timeout = "{step_timeout}"

[task]
model = "dist_task:model"
train_data = "dist_task:train_data"
optimizer = "dist_task:sgd"
loss_fn = "dist_task:cross_entropy"
data_args = {{ ms = 3.0 }}
"""


def command(config: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(out)]


def start_ranks(config: Path, out: Path, world: int) -> list[subprocess.Popen]:
    """`world` ranks of one job, started by hand as on `world` machines."""
    return [
        subprocess.Popen(
            command(config, out),
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for env in rank_envs(child_env(), world)
    ]


def lose_a_rank(config: Path, out: Path, world: int, how: signal.Signals) -> list[tuple[int, str]]:
    """Start `world` ranks, stop the last one with `how` once KILL_AFTER steps are logged, and
    return the others' (exit code, stderr). Their wait is bounded: an exit later than TIMEOUT
    (a fifth of distributed.timeout) fails the test."""
    ranks = start_ranks(config, out, world)
    try:
        deadline = time.monotonic() + TIMEOUT
        while _steps_logged(out) < KILL_AFTER:
            assert all(r.poll() is None for r in ranks), "a rank ended early"
            assert time.monotonic() < deadline, "the run did not start"
            time.sleep(0.05)
        os.kill(ranks[-1].pid, how)
        left = [(r.wait(timeout=TIMEOUT), r.stderr.read().decode()) for r in ranks[:-1]]
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
            r.wait()
            r.stderr.close()
    return left


@pytest.mark.parametrize(
    ("world", "how", "resume_on"),
    [
        # A silent rank: only the step timeout ends the others' wait.
        (2, signal.SIGSTOP, 2),
        # A rank gone: the others see the connection drop at once. Slow: the same end as the
        # silent rank's, and test_pieces' test_a_rank_killed_outright_... covers its exit code.
        pytest.param(2, signal.SIGKILL, 2, marks=pytest.mark.slow),
        # The lost machine does not come back: the job goes on with 2. Slow: the same path
        # with one rank more.
        pytest.param(3, signal.SIGKILL, 2, marks=pytest.mark.slow),
    ],
)
def test_a_rank_lost_mid_run_ends_the_job_resumably_and_the_rerun_finishes(
    tmp_path, world, how, resume_on
):
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(steps=STEPS, step_timeout=STEP_TIMEOUT))
    out = tmp_path / "run"
    left = lose_a_rank(config, out, world, how)
    saved = int(newest_checkpoint(out).name.removeprefix("step-"))
    assert saved >= 2
    lost = world - 1
    said = (
        f"rank {lost} stopped answering within distributed.step_timeout = {STEP_TIMEOUT} (its "
        f"process or machine is gone; the ranks left cannot save without it): run the job again "
        f"to resume from the checkpoint of step {saved} (exit code 75)"
    )
    for rank, (code, stderr) in enumerate(left):
        prefix = "thrifty: error: " if rank == 0 else f"thrifty: error: rank {rank}: "
        assert code == 75, stderr[-3000:]
        assert prefix + said in stderr.splitlines(), stderr[-3000:]
        assert "Traceback" not in stderr
    # The job run again as it was started, by hand (no launcher process to start).
    resumed = ok(run_ranks(command(config, out), child_env(), resume_on, REPO, TIMEOUT))
    assert f"resumed from step {saved}" in resumed.stderr
    assert json.loads((out / "summary.json").read_text())["steps"] == STEPS


# --- the pieces, in one process ----------------------------------------------------------------


@pytest.fixture
def one_process_group(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    start_up = datetime.timedelta(minutes=10)  # distributed.timeout, as thrifty joins with it
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1, timeout=start_up)
    yield dist.group.WORLD
    dist.destroy_process_group()


def timeout_seconds(group) -> float:
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def test_the_wait_drops_after_steady_after_steps_of_this_attempt_and_not_where_rank_0_works(
    one_process_group,
):
    group = one_process_group
    config = DistributedConfig(timeout="10m", step_timeout="5s", steady_after=3)
    timeouts = CollectiveTimeouts(config, [group])
    timeouts.begin(10)  # resumed at step 10: steps 11 to 13 are this attempt's first three
    timeouts.step_done(11)
    timeouts.step_done(12)
    assert timeout_seconds(group) == 600 and timeouts.describe() == "distributed.timeout = 10m"
    timeouts.step_done(13)
    assert timeout_seconds(group) == 5 and timeouts.describe() == "distributed.step_timeout = 5s"
    during: list[float] = []
    timeouts.wait_for_main(1, lambda: during.append(timeout_seconds(group)))
    timeouts.wait_for_main(0, lambda: during.append(timeout_seconds(group)))
    assert during == [600, 5]  # another rank waits long for rank 0's write; rank 0 does not
    assert timeout_seconds(group) == 5
    timeouts.end(1)
    timeouts.step_done(14)
    assert timeout_seconds(group) == 600


def test_a_collective_that_lost_its_peer_is_one_line_with_the_exit_code_to_resume_with():
    gone = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:23458: Connection reset by peer")
    d = Distributed(strategy="ddp", rank=0, world_size=2)
    fresh = lost_rank_error(gone, d, newest_step=None)
    assert fresh is not None and fresh.exit_code == 1
    assert str(fresh) == (
        "rank 1 stopped answering within distributed.timeout = 10m (its process or machine is "
        "gone) before this run saved a checkpoint: running the job again starts it over"
    )
    saved = lost_rank_error(gone, d, newest_step=8)
    assert saved is not None and saved.exit_code == 75 and "step 8 (exit code 75)" in str(saved)
    assert lost_rank_error(RuntimeError("shape mismatch"), d, newest_step=8) is None
    assert lost_rank_error(gone, Distributed(), newest_step=8) is None  # one process
