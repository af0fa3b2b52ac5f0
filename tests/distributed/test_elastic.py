"""A full-model (single or DDP) checkpoint resumes at another world size: the global batch is
kept, the accumulation absorbs the change, and the run continues as the uninterrupted one.

The model has no dropout, so the only difference is the order in which the global batch's
gradients are summed: the losses agree to rtol 1e-5. The samples are compared exactly: every
fetch of the training loader is recorded, and the whole run's indices (a multiset: the run
spans several epochs) equal the uninterrupted run's, so none is skipped or repeated at the
switch.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distributed.ranks_by_hand import run_ranks
from distributed.test_distributed import (
    REPO,
    TESTS,
    TIMEOUT,
    final_weights,
    losses,
    ok,
    one_error_line,
)
from thrifty.cli import main

STEPS = 10  # 4 steps an epoch
# Where each part of a run of 2 (or 3) parts ends: every switch falls in the middle of an epoch.
SWITCHES = {2: (6, STEPS), 3: (3, 6, STEPS)}
LOSS_RTOL = 1e-5

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
{effective}

[schedule]
decay = "constant"  # the same lr whatever run.max_steps the first part ran with

[data]
num_workers = 0

[eval]
every = 5

[checkpoint]
every = 3

[measure]
system = false
peak_tflops = 1.0

[task]
model = "dist_task:model"
train_data = "elastic_task:train_data"
val_data = "elastic_task:val_data"
optimizer = "dist_task:sgd"
loss_fn = "dist_task:cross_entropy"
data_args = {{ rows = 256, record = "{record}" }}
"""


def write_config(folder: Path, *, effective: int | None = 64) -> Path:
    """The run's config; its samples are recorded under `folder/record`."""
    folder.mkdir(parents=True, exist_ok=True)
    line = "" if effective is None else f"effective = {effective}"
    text = CONFIG.format(steps=STEPS, effective=line, record=folder / "record")
    path = folder / "config.toml"
    path.write_text(text)
    return path


def train(config: Path, out: Path, *args: str, nprocs: int = 1) -> subprocess.CompletedProcess:
    """`thrifty train` on `nprocs` processes: more than one started by hand (env:// rendezvous,
    no launcher process), one trained in this process (a process of its own costs more to start
    than its run here)."""
    argv = ["train", str(config), "--out", str(out), *args]
    if nprocs == 1:
        return train_here(argv)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    paths = [str(TESTS), str(TESTS / "distributed"), str(REPO / "src")]
    env.update(PYTHONPATH=os.pathsep.join(paths), OMP_NUM_THREADS="1")
    return run_ranks([sys.executable, "-m", "thrifty", *argv], env, nprocs, REPO, TIMEOUT)


def train_here(argv: list[str]) -> subprocess.CompletedProcess:
    """`thrifty ARGV` in this process: its exit code, and what it printed and logged (its lines
    as the command line shows them), as a child process's would be."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("thrifty: %(message)s"))
    logger = logging.getLogger("thrifty")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    sys.path.insert(0, str(TESTS / "distributed"))  # elastic_task, as PYTHONPATH has it
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        sys.path.remove(str(TESTS / "distributed"))
        logger.removeHandler(handler)
        logger.setLevel(level)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def samples_seen(folder: Path) -> list[int]:
    """Every training sample the run's ranks fetched, sorted (each epoch fetches each once)."""
    seen = [int(i) for path in (folder / "record").glob("*.txt") for i in path.read_text().split()]
    return sorted(seen)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def switched(tmp: Path, worlds: tuple[int, ...]) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """A run started by `worlds[0]` processes and resumed by each next count in turn, the
    part of each ending at its step of SWITCHES, the last one's at the end. Returns the
    resumed parts' results. A copy of the run as each part but the last left it (made
    resumable) is kept beside it, in `run-at-<step>`."""
    folder = tmp / "-to-".join(map(str, worlds))
    config = write_config(folder)
    out = folder / "run"
    ends = SWITCHES[len(worlds)]
    ok(train(config, out, "--steps", str(ends[0]), nprocs=worlds[0]))
    results = []
    for world, start, end in zip(worlds[1:], ends[:-1], ends[1:], strict=True):
        (out / "summary.json").unlink()  # a finished run made resumable for more steps
        shutil.copytree(out, folder / f"run-at-{start}")
        steps = ("--steps", str(end)) if end < STEPS else ()
        results.append(ok(train(config, out, *steps, nprocs=world)))
    return folder, results


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The reference: one process, all the steps in one go."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    ok(train(write_config(folder), folder / "run"))
    return folder


@pytest.fixture(scope="module")
def one_two_one(tmp_path_factory) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """The run of [1-2-1]: its checkpoint of 1 process (`run-at-3`) and of 2 (`run-at-6`) are
    the ones the refusals below resume."""
    return switched(tmp_path_factory.mktemp("switched"), (1, 2, 1))


@pytest.mark.parametrize(
    "worlds",
    [
        pytest.param((1, 2, 1), id="1-2-1"),
        # the same switches as [1-2-1], one a run: slow
        pytest.param((2, 1), id="2-1", marks=pytest.mark.slow),
        pytest.param((1, 2), id="1-2", marks=pytest.mark.slow),
    ],
)
def test_a_ddp_run_resumed_at_another_world_size_continues_the_uninterrupted_run(
    request, uninterrupted, tmp_path, worlds
):
    if worlds == (1, 2, 1):
        folder, results = request.getfixturevalue("one_two_one")
    else:
        folder, results = switched(tmp_path, worlds)
    starts = SWITCHES[len(worlds)][:-1]
    for before, after, start, resumed in zip(worlds[:-1], worlds[1:], starts, results, strict=True):
        assert f"resumed from step {start}" in resumed.stderr
        assert f"resuming a checkpoint of {before} process(es) on {after}" in resumed.stderr
        assert "not bit-exact: each rank's random streams (dropout)" in resumed.stderr
    reference, run = uninterrupted / "run", folder / "run"
    # The steps and samples are exact: the same samples, none skipped or repeated.
    assert summary(run)["steps"] == summary(reference)["steps"] == STEPS
    assert summary(run)["samples"] == summary(reference)["samples"] == STEPS * 64
    assert len(samples_seen(uninterrupted)) == STEPS * 64
    assert samples_seen(folder) == samples_seen(uninterrupted)
    # The same global batches, summed in another order: the losses and weights agree.
    la, lb = losses(reference), losses(run)
    assert sorted(la) == sorted(lb) == list(range(1, STEPS + 1))
    for step in la:
        assert lb[step] == pytest.approx(la[step], rel=LOSS_RTOL), step
    wa, wb = final_weights(reference), final_weights(run)
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=1e-4, atol=1e-6)


def resumed(run: Path, tmp: Path, *args: str, effective: int | None = 64):
    """`run` (a resumable copy of it) resumed in this process; `args`: more of the command line."""
    out = tmp / "run"
    shutil.copytree(run, out)
    return train_here(
        ["train", str(write_config(tmp, effective=effective)), "--out", str(out), *args]
    )


def test_a_world_size_the_global_batch_does_not_divide_is_refused_on_resume(
    one_two_one, tmp_path, monkeypatch
):
    # --nprocs refuses it before it starts a rank: in this process, a launch would fail the test.
    from thrifty.strategies import launcher

    def launch(*args, **kwargs):
        raise AssertionError("the launcher started its ranks")

    monkeypatch.setattr(launcher, "launch", launch)
    checkpointed = one_two_one[0] / "run-at-3"  # by 1 process
    line = one_error_line(resumed(checkpointed, tmp_path / "fixed", "--nprocs", "3"))
    assert line == (
        "thrifty: error: batch.effective = 64 is invalid: must be a multiple of batch.micro × "
        "world size = 16 × 3 = 48"
    )
    auto = resumed(checkpointed, tmp_path / "auto", "--set", "batch.micro=auto", "--nprocs", "3")
    assert one_error_line(auto) == (
        "thrifty: error: batch.effective = 64 is invalid: must be a multiple of the world size "
        "(3) with batch.micro = 'auto'"
    )


def test_a_global_batch_that_followed_the_process_count_is_refused_at_another(
    one_two_one, tmp_path
):
    # The checkpoint of 2 processes with batch.effective = 64 (2 micro-batches of 16 on each),
    # resumed by 1 process without batch.effective: 1 process of 16 makes 16, not 64.
    line = one_error_line(resumed(one_two_one[0] / "run-at-6", tmp_path, effective=None))
    assert "written by 2 process(es) with an effective batch of 64" in line
    assert "this run of 1 has 16 (batch.micro × world size)" in line
    assert "set batch.effective = 64 to resume at another world size" in line
