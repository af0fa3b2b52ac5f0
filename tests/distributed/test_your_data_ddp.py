"""Your streams on two processes (DDP, gloo on CPU, torchrun): a stream read by 2 loader workers
(torchdata's StatefulDataLoader) and a Hugging Face `datasets` stream over local JSON-lines
files. Each rank's data state rides in every checkpoint, so a job killed outright (SIGKILL to
every process of it at once) and started again ends on the same weights, bit for bit, as a job
never killed; and within a pass the two ranks never read the same sample.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from thrifty.rundir.files import read_metrics

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
TIMEOUT = 120  # seconds any launch may take before the test fails instead of hanging
STEPS = 12
# The killed test's case whose never-killed reference run trains in the split's job.
REFERENCE = ("streams:stream", 2)

CONFIG = """
[run]
max_steps = {steps}
log_every = 1
progress = "off"
seed = 7

[batch]
micro = 4
effective = 16

[data]
num_workers = {workers}

[schedule]
decay = "constant"

[checkpoint]
every = 2

[measure]
breakdown = false
system = false

[spot]
provider = "none"

[task]
model = "thrifty.demo:build_model"
train_data = "{train_data}"
data_args = {data_args}
model_args = {{ n_layer = 1, n_head = 2, n_embd = 32, block_size = 32, dropout = 0.0 }}
"""


def child_env() -> dict[str, str]:
    """torchrun's children find the stream factories, never reach the network, share the cores,
    and share torchrun's store, as by default (a second process group in a job needs it)."""
    dropped = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO / "src")]),
        OMP_NUM_THREADS="1",
        THRIFTY_SPOT_PROVIDER="none",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
    )
    return env


def write_jsonl(folder: Path, files: int = 4, lines: int = 24) -> Path:
    """JSON-lines files for `datasets` to stream (each rank takes whole files): line l of file f
    begins with the tokens f, l, which name the sample; the other tokens are drawn at random."""
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    for f in range(files):
        rows = []
        for line in range(lines):
            x = [f, line, *torch.randint(0, 256, (31,), generator=g).tolist()]
            rows.append(json.dumps({"input_ids": x[:-1], "targets": x[1:]}))
        (folder / f"part-{f}.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]


def write_config(tmp: Path, train_data: str, workers: int) -> Path:
    data_args = "{}"
    if train_data == "streams:hf_stream":
        data_args = f"{{ path = {json.dumps(str(write_jsonl(tmp / 'jsonl')))} }}"
    config = tmp / "job.toml"
    text = CONFIG.format(steps=STEPS, workers=workers, train_data=train_data, data_args=data_args)
    config.write_text(text)
    return config


def train(config: Path, out: Path) -> list[str]:
    return [*torchrun(), "-m", "thrifty", "train", str(config), "--out", str(out)]


def run(command: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def published(run_dir: Path) -> list[int]:
    """The steps of the checkpoints published (their manifest written), oldest first."""
    manifests = (run_dir / "checkpoints").glob("step-*/manifest.json")
    return sorted(int(m.parent.name.split("-")[1]) for m in manifests)


def job_groups(launcher: int) -> tuple[list[int], list[psutil.Process]]:
    """The job's process groups, the launcher's first, and its processes. torch's launcher starts
    every rank in a session of its own (a rank's loader workers join its group): a signal to the
    launcher's group alone would leave the ranks training."""
    processes = psutil.Process(launcher).children(recursive=True)
    pids = {p.pid for p in processes}
    groups = [launcher]
    for p in processes:
        try:
            group = os.getpgid(p.pid)
        except ProcessLookupError:
            continue
        if group in pids and group not in groups:  # a group one of our processes leads
            groups.append(group)
    return groups, processes


def kill_job(job: subprocess.Popen) -> int:
    """SIGKILL every process group of the job, at once, and wait until all its processes are
    gone. Returns how many groups it had."""
    groups, processes = job_groups(job.pid)
    for group in groups:
        os.killpg(group, signal.SIGKILL)
    job.wait(timeout=TIMEOUT)
    _, alive = psutil.wait_procs(processes, timeout=TIMEOUT)
    assert not alive, alive
    return len(groups)


def kill_job_once_saved(command: list[str], run_dir: Path, after: int) -> int:
    """Start `command` in its own process group and SIGKILL the whole job (launcher, ranks,
    loader workers: nothing gets to save or clean up) as soon as a checkpoint of a step beyond
    `after` is published. Returns the newest step published then."""
    log = run_dir.with_name(run_dir.name + ".log")
    with log.open("w") as out:
        job = subprocess.Popen(
            command, cwd=REPO, env=child_env(), stdout=out, stderr=out, start_new_session=True
        )
        try:
            deadline = time.monotonic() + TIMEOUT
            while not any(step > after for step in published(run_dir)):
                assert job.poll() is None, f"the job ended unkilled:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"no checkpoint:\n{log.read_text()[-3000:]}"
                time.sleep(0.01)
        finally:
            killed = job.poll() is None and kill_job(job)
    assert killed == 3, f"the launcher and 2 ranks, each its own group, killed mid-run: {killed}"
    newest = published(run_dir)[-1]
    assert newest < STEPS and not (run_dir / "summary.json").exists(), "killed after its end"
    return newest


def final_state(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[int, float]]:
    """The model in the run's last checkpoint, and the loss of every step logged (a step logged
    again after the resume: its last loss)."""
    last = published(run_dir)[-1]
    state = torch.load(run_dir / "checkpoints" / f"step-{last:08d}" / "state.pt", weights_only=True)
    losses = {r["step"]: r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if "loss" in r}
    return state["model"], losses


@pytest.mark.parametrize(
    ("train_data", "workers"),
    [
        pytest.param("streams:stream", 2, id="stream-in-2-workers"),
        # the same path as [stream-in-2-workers], with the Hugging Face stream that
        # test_your_data.py::test_a_pipeline_killed_mid_pass_resumes_to_the_same_weights[hf]
        # resumes in one process and test_the_ranks_share_a_pass_... splits over 2 ranks: slow
        pytest.param("streams:hf_stream", 2, id="hf-datasets-streaming", marks=pytest.mark.slow),
    ],
)
def test_a_job_killed_outright_resumes_from_its_data_state_to_the_same_weights(
    request, tmp_path, train_data, workers
):
    config = write_config(tmp_path, train_data, workers)
    if (train_data, workers) == REFERENCE:  # the reference trained in the split's job
        reference = request.getfixturevalue("split") / "reference"
    else:
        reference = tmp_path / "reference"
        run(train(config, reference))

    cut = tmp_path / "cut"
    command = train(config, cut)
    step = kill_job_once_saved(command, cut, after=2)
    saved = torch.load(cut / "checkpoints" / f"step-{step:08d}" / "state.pt", weights_only=True)
    assert len(saved["rank_data"]) == 2 and None not in saved["rank_data"]

    resumed = run(command)
    assert f"resumed from step {step}" in resumed.stderr, resumed.stderr[-3000:]
    weights, losses = final_state(cut)
    expected_weights, expected_losses = final_state(reference)
    assert sorted(weights) == sorted(expected_weights)
    for name, tensor in expected_weights.items():
        assert torch.equal(tensor, weights[name]), name
    assert losses == expected_losses and sorted(losses) == list(range(1, STEPS + 1))


SPLIT = """
import json
import sys

import torch

import streams
from thrifty.config import TrainConfig
from thrifty.data.batching import TrainBatches
from thrifty.data.geometry import BatchGeometry
from thrifty.records.stop_signals import parse_signals
from thrifty.records.state import TrainState
from thrifty.strategies.process_group import init_distributed

RUN = {"max_steps": 100, "device": "cpu"}
config = TrainConfig.from_dict({"run": RUN, "distributed": {"timeout": "60s"}})
dist, _ = init_distributed(config.distributed, "cpu")


def first_pass(data, workers):
    # Every sample the trainer's windows hand this rank in pass 0 (its input tokens).
    config = TrainConfig.from_dict({"run": RUN, "data": {"num_workers": workers}})
    world = dist.world_size
    batches = TrainBatches(
        data, BatchGeometry(4, 2, 4 * 2 * world, world), torch.device("cpu"), None,
        loading=config.data, run=config.run, stop_signals=parse_signals(config.spot.signals),
        rank=dist.rank,
    )
    progress, seen = TrainState(), []
    for window in batches.windows(progress, dist):
        if progress.epoch > 0:
            break
        seen += [row for b in window for row in b["input_ids"].tolist()]
    batches.close()
    return seen


# A stream's sample by its tokens; a file's line by its first two (file, line).
index = {tuple(streams.window(i)["input_ids"].tolist()): i for i in range(96)}
passes = {
    "stream": [index[tuple(s)] for s in first_pass(streams.stream(n=96), 2)],
    "hf-2-workers": [s[:2] for s in first_pass(streams.hf_stream(sys.argv[1]), 2)],
    "hf-no-workers": [s[:2] for s in first_pass(streams.hf_stream(sys.argv[1]), 0)],
}
with open(f"{sys.argv[2]}/rank.{dist.rank}.json", "w") as out:
    json.dump(passes, out)
dist.close()

# Then the `thrifty train` command line after those arguments, if any, in this job.
if sys.argv[3:]:
    from thrifty.cli import main

    sys.exit(main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    """One torchrun job of 2 processes that splits a pass of each stream (SPLIT: `rank.R.json`),
    then trains the never-killed reference run of [stream-in-2-workers] (`reference`): one
    launch for both."""
    tmp = tmp_path_factory.mktemp("split")
    script = tmp / "split.py"
    script.write_text(SPLIT)
    files = write_jsonl(tmp / "jsonl")
    reference = ["train", str(write_config(tmp, *REFERENCE)), "--out", str(tmp / "reference")]
    run([*torchrun(), str(script), str(files), str(tmp), *reference])
    return tmp


def test_the_ranks_share_a_pass_of_a_stream_without_a_sample_in_common(split):
    ranks = [json.loads((split / f"rank.{r}.json").read_text()) for r in (0, 1)]

    # Samples 0..95, split among 2 ranks x 2 workers: each read once, none left out.
    first, second = ({*r["stream"]} for r in ranks)
    assert [len(r["stream"]) for r in ranks] == [len(first), len(second)] == [48, 48]
    assert first | second == set(range(96))

    # Hugging Face's split: whole files to each rank, every line read once.
    every_line = {(f, line) for f in range(4) for line in range(24)}
    for how in ("hf-2-workers", "hf-no-workers"):
        first, second = ({tuple(s) for s in r[how]} for r in ranks)
        assert [len(r[how]) for r in ranks] == [len(first), len(second)] == [48, 48], how
        assert first | second == every_line, how
        assert not {f for f, _ in first} & {f for f, _ in second}, how
