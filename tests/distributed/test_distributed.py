"""Two (and three) real processes with gloo on CPU, launched the way users launch them.

Each run is `thrifty train CONFIG --nprocs N` (torch's elastic launcher) or `torchrun`; the
losses and weights they produce are compared with one process on the same global batch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from thrifty.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
TIMEOUT = 120  # seconds any launch may take before the test fails instead of hanging

CONFIG = """
[run]
max_steps = {steps}
log_every = 1
progress = "off"
seed = 7

[precision]
mode = "fp32"

[batch]
micro = {micro}
effective = {effective}

[optimizer]
grad_clip = 1.0

[data]
num_workers = 0

[eval]
every = 5

[checkpoint]
every = {every}

[measure]
system = false
peak_tflops = 1.0

[distributed]
strategy = "{strategy}"
timeout = "60s"

[task]
model = "dist_task:model"
train_data = "dist_task:train_data"
val_data = "dist_task:val_data"
optimizer = "dist_task:sgd"
loss_fn = "dist_task:cross_entropy"
data_args = {{ ms = {ms} }}
"""


STEPS = 24  # of the runs compared with one process and of the preempted ones
# The samples a step of every run compared with one process: micro 16 × 6 accumulation steps in
# one process, × 3 on each of 2 ranks, × 2 on each of 3 (an FSDP run resharded onto 3).
EFFECTIVE = 96


def write_config(tmp: Path, name: str, **values) -> Path:
    settings = {
        "steps": STEPS,
        "micro": 16,
        "effective": EFFECTIVE,
        "every": '"off"',
        "strategy": "auto",
        "ms": 0.0,
    }
    settings.update(values)
    path = tmp / f"{name}.toml"
    path.write_text(CONFIG.format(**settings))
    return path


def child_env() -> dict[str, str]:
    # Not the separate rendezvous store a `--nprocs` launch run in a test's own process set:
    # torchrun here shares its agent's store with the workers, as it does by default.
    dropped = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO / "src")]),
        OMP_NUM_THREADS="1",
        THRIFTY_SPOT_PROVIDER="none",
    )
    return env


def train(config: Path, out: Path, *args: str, nprocs: int = 1) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(out), *args]
    if nprocs > 1:
        command += ["--nprocs", str(nprocs)]
    return subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT
    )


def torchrun(config: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    """`thrifty train` on 2 processes started by torchrun rather than by --nprocs."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    command += ["2", "-m", "thrifty", "train", str(config), "--out", str(out), *args]
    return subprocess.run(
        command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT
    )


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def losses(run: Path) -> dict[int, float]:
    return losses_of(run / "metrics.jsonl")


def losses_of(metrics: Path) -> dict[int, float]:
    """The loss of each step in a metrics.jsonl (of a step logged twice, the last)."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def val_losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["val_loss"] for r in records if "val_loss" in r}


def newest_checkpoint(run: Path) -> Path:
    return max((run / "checkpoints").glob("step-*"))


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The model of the run's newest checkpoint, whole (gathered from shards for FSDP)."""
    folder = newest_checkpoint(run)
    state = torch.load(folder / "state.pt", weights_only=True)
    if "model" in state:
        return state["model"]
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from thrifty.checkpointing.store.sharded import read_metadata_safely, read_shards

    metadata = read_metadata_safely(str(folder / "shards" / ".metadata"))
    template = {
        "model": {
            key[len("model.") :]: torch.empty(md.size, dtype=md.properties.dtype)
            for key, md in metadata.state_dict_metadata.items()
            if key.startswith("model.") and isinstance(md, TensorStorageMetadata)
        }
    }
    with warnings.catch_warnings():  # no process group: this process reads every shard
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        read_shards(template, str(folder))
    return template["model"]


def assert_same_training(a: Path, b: Path, *, exact: bool) -> None:
    la, lb = losses(a), losses(b)
    assert sorted(la) == sorted(lb) and la
    wa, wb = final_weights(a), final_weights(b)
    assert sorted(wa) == sorted(wb)
    if exact:
        assert la == lb
        for key in wa:
            assert torch.equal(wa[key], wb[key]), key
        return
    for step in la:
        assert la[step] == pytest.approx(lb[step], rel=1e-5, abs=1e-6), step
    va, vb = val_losses(a), val_losses(b)
    assert sorted(va) == sorted(vb)
    for step in va:
        assert va[step] == pytest.approx(vb[step], rel=1e-5), step
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    """One process, micro 16 × 6 accumulation steps: the global batch of 96 every run shares.
    Trained in this process, which has torch loaded already: a process of its own would only
    load it again."""
    from thrifty import cli

    tmp = tmp_path_factory.mktemp("single")
    out = tmp / "run"
    assert cli.main(["train", str(write_config(tmp, "single")), "--out", str(out)]) == 0
    return out


# The runs on 2 processes that test_sigterm_to_one_rank_checkpoints_every_rank_and_the_rerun_
# resumes_exactly preempts, by strategy, with a loader that takes 1 ms an item; never stopped,
# they are the `ddp` and `fsdp` fixtures, which the tests also compare with one process. ddp:
# strategy "auto", micro 16 × 3 steps a rank. fsdp: activation checkpointing on every block as
# well (ARGS), and a checkpoint at step 21 that test_fsdp_resumes_at_another_world_size_by_
# resharding resumes on 3.
PREEMPTED = {
    "ddp": {"strategy": "auto", "ms": 1.0},
    "fsdp": {"strategy": "fsdp", "every": 21, "ms": 1.0},
}
ARGS = {"ddp": (), "fsdp": ("--set", "activation_checkpointing.policy=all")}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The PREEMPTED ddp run, started by `--nprocs 2`, never stopped: its folder and result."""
    tmp = tmp_path_factory.mktemp("ddp")
    out = tmp / "run"
    return out, ok(train(write_config(tmp, "ddp", **PREEMPTED["ddp"]), out, nprocs=2))


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The PREEMPTED fsdp run, started by torchrun, never stopped: its folder and result."""
    tmp = tmp_path_factory.mktemp("fsdp")
    out = tmp / "run"
    return out, ok(torchrun(write_config(tmp, "fsdp", **PREEMPTED["fsdp"]), out, *ARGS["fsdp"]))


def test_ddp_trains_like_one_process_on_the_same_global_batch(single, ddp):
    # micro 16 × 3 steps on each of 2 ranks, strategy "auto" (gradient sync on the last
    # micro-batch only): the same 96 samples per step as the single process. One micro-batch a
    # rank, synchronized every time: test_ddp_without_accumulation_trains_like_one_process.
    out, result = ddp
    assert "ddp over 2 processes" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["strategy"] == "ddp"
    assert summary["effective_batch"] == EFFECTIVE and summary["samples"] == STEPS * EFFECTIVE
    assert summary["accumulation_steps"] == 3
    assert_same_training(single, out, exact=False)
    assert not (out / "rank-1").exists() and "rank 1" not in result.stdout


def test_fsdp_with_activation_checkpointing_trains_like_one_process_under_torchrun(single, fsdp):
    out, result = fsdp
    assert "fsdp over 2 processes" in result.stderr
    assert "activation checkpointing: 2 blocks" in result.stderr
    assert_same_training(single, out, exact=False)
    shards = sorted(p.name for p in (newest_checkpoint(out) / "shards").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    manifest = json.loads((newest_checkpoint(out) / "manifest.json").read_text())
    assert {f["name"] for f in manifest["files"]} == {"state.pt", *(f"shards/{s}" for s in shards)}


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    import psutil

    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "thrifty" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    raise AssertionError(f"rank {rank} not found")


def _steps_logged(run: Path) -> int:
    try:
        return max(losses(run), default=0)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def sigterm_after(
    config: Path, out: Path, steps: int, rank: int | None, *args: str
) -> tuple[int, str, str]:
    """Train on 2 processes, SIGTERM `rank` (None: the launcher) once `steps` steps are logged,
    and wait, bounded, for the job to end. Returns its exit code, stdout and stderr."""
    command = [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(out), *args]
    launcher = subprocess.Popen(
        [*command, "--nprocs", "2"],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while _steps_logged(out) < steps:
            assert launcher.poll() is None and time.monotonic() < deadline, "run ended early"
            time.sleep(0.05)
        pid = launcher.pid if rank is None else _rank_pid(launcher, rank)
        os.kill(pid, signal.SIGTERM)
        stdout, stderr = launcher.communicate(timeout=TIMEOUT)  # none hangs: bounded wait
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return launcher.returncode, stdout, stderr


@pytest.mark.parametrize(("strategy", "signalled_rank"), [("ddp", 1), ("fsdp", 0)])
def test_sigterm_to_one_rank_checkpoints_every_rank_and_the_rerun_resumes_exactly(
    request, tmp_path, strategy, signalled_rank
):
    steps = STEPS
    config = write_config(tmp_path, strategy, **PREEMPTED[strategy])
    reference = request.getfixturevalue(strategy)[0]  # that config's run, uninterrupted

    out = tmp_path / "preempted"
    code, stdout, stderr = sigterm_after(config, out, 4, signalled_rank, *ARGS[strategy])
    assert code == 75, stdout[-2000:] + stderr[-2000:]
    stopped_at = _steps_logged(out)
    assert 4 <= stopped_at < steps
    assert newest_checkpoint(out).name == f"step-{stopped_at:08d}"
    assert not (out / "summary.json").exists()
    assert "preempted at step" in stdout

    resumed = ok(train(config, out, *ARGS[strategy], nprocs=2))
    assert f"resumed from step {stopped_at}" in resumed.stderr
    assert_same_training(reference, out, exact=True)


def test_sigterm_to_the_launcher_reaches_every_rank_and_ends_with_the_resumable_code(tmp_path):
    config = write_config(tmp_path, "ddp", strategy="ddp", steps=400, ms=1.0)
    out = tmp_path / "run"
    code, _, stderr = sigterm_after(config, out, 3, rank=None)
    assert code == 75, stderr[-3000:]
    stopped_at = _steps_logged(out)
    assert newest_checkpoint(out).name == f"step-{stopped_at:08d}"
    assert "saving an emergency checkpoint" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize("launcher", ["--nprocs", "torchrun"])
def test_a_launcher_killed_alone_stops_every_rank_with_its_checkpoint(tmp_path, launcher):
    """The OOM killer's SIGKILL to the launcher alone forwards nothing: each rank gets the
    kernel's SIGTERM instead, saves and ends, and holds no run directory's lock. So for the
    user's own torchrun, whose workers once trained on to the end with nobody to report to."""
    import psutil

    config = write_config(tmp_path, "ddp", strategy="ddp", steps=400, ms=1.0)
    out = tmp_path / "run"
    train_args = ["-m", "thrifty", "train", str(config), "--out", str(out)]
    if launcher == "--nprocs":
        command = [sys.executable, *train_args, "--nprocs", "2"]
    else:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc_per_node", "2", *train_args]
    process = subprocess.Popen(
        command, cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while _steps_logged(out) < 3:
            assert process.poll() is None and time.monotonic() < deadline, "run ended early"
            time.sleep(0.05)
        ranks = [_rank_pid(process, rank) for rank in (0, 1)]
        process.kill()
        process.wait(timeout=30)
        gone, alive = psutil.wait_procs([psutil.Process(pid) for pid in ranks], timeout=TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
    for rank in alive:
        rank.kill()
    assert not alive, "a rank trained on without its launcher"
    stopped_at = _steps_logged(out)
    assert newest_checkpoint(out).name == f"step-{stopped_at:08d}"  # its emergency save
    assert not (out / "summary.json").exists() and stopped_at < 400  # stopped, not finished
    resumed = ok(train(config, out, "--steps", str(stopped_at + 2), nprocs=2))
    assert f"resumed from step {stopped_at}" in resumed.stderr


def killed_before_its_last_save(run: Path, out: Path) -> Path:
    """A copy of the finished `run` as a job killed after its last step, before that step's
    checkpoint: its newest checkpoint is the one before (the fsdp run's, step 21's)."""
    shutil.copytree(run, out)
    (out / "summary.json").unlink()
    shutil.rmtree(newest_checkpoint(out))
    return out


def test_fsdp_resumes_at_another_world_size_by_resharding(fsdp, tmp_path):
    # 96 samples per step: micro 16 × 3 steps on 2 ranks, then micro 16 × 2 steps on 3 ranks.
    config = write_config(tmp_path, "fsdp", **PREEMPTED["fsdp"])
    reference = fsdp[0]
    # The run of 2 processes, step 21's checkpoint resumed by 3 processes for the last 3 steps.
    # Each step logged again after the resume counts with its last loss.
    out = killed_before_its_last_save(reference, tmp_path / "resharded")
    assert newest_checkpoint(out).name == "step-00000021"
    result = ok(train(config, out, *ARGS["fsdp"], nprocs=3))
    assert "resumed from step 21" in result.stderr
    assert "resharding a checkpoint of 2 processes onto 3" in result.stderr
    # The same samples in the same steps: the losses agree to float tolerance.
    la, lb = losses(reference), losses(out)
    assert sorted(la) == sorted(lb) == list(range(1, STEPS + 1))
    for step in la:
        assert la[step] == pytest.approx(lb[step], rel=1e-5), step


# --- bad input: one line from rank 0, every rank exits, none hangs ---------------------------


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("thrifty: error")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def test_a_world_size_that_does_not_divide_the_global_batch_is_one_line_before_a_rank_starts(
    tmp_path, capsys, monkeypatch
):
    from thrifty import cli
    from thrifty.strategies import launcher

    def launch(*args, **kwargs):
        raise AssertionError("the launcher started its ranks")

    monkeypatch.setattr(launcher, "launch", launch)
    config = write_config(tmp_path, "bad", micro=16, effective=80)
    argv = ["train", str(config), "--out", str(tmp_path / "run"), "--nprocs", "2"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("thrifty: error")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "batch.effective = 80 is invalid" in lines[0] and "16 × 2 = 32" in lines[0]


@pytest.mark.parametrize(
    ("micro", "line"),
    [
        ("16", "must be a multiple of batch.micro × world size = 16 × 3 = 48"),
        ("'auto'", "must be a multiple of the world size (3) with batch.micro = 'auto'"),
    ],
)
def test_each_rank_refuses_a_global_batch_its_world_size_does_not_divide(tmp_path, micro, line):
    # The ranks' own check, for jobs started by torchrun rather than by --nprocs.
    from thrifty.config import load_config
    from thrifty.data.geometry import BatchGeometry

    config = load_config(write_config(tmp_path, "bad", micro=micro, effective=64))
    start = 16 if micro == "16" else 1  # with "auto", one sample until measured
    assert BatchGeometry.of(config.batch, 2).accumulation == 64 // (start * 2)
    with pytest.raises(ConfigError) as raised:
        BatchGeometry.of(config.batch, 3)
    assert str(raised.value) == f"batch.effective = 64 is invalid: {line}"


def test_nccl_on_cpu_is_one_line(tmp_path, monkeypatch, capsys):
    # Every rank refuses the backend before it meets the others, and rank 0 says it: here rank
    # 0 of a job of 2, in this process. That a job's ranks end in their one line, the launcher
    # with its exit code: test_ranks_started_with_different_configs_are_refused_in_one_line and
    # test_elastic's refused world sizes.
    from thrifty import cli

    torchrun_env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "1"}
    for name, value in {**torchrun_env, "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, value)
    config = write_config(tmp_path, "nccl")
    argv = ["train", str(config), "--out", str(tmp_path / "run")]
    code = cli.main([*argv, "--set", "distributed.backend=nccl"])
    captured = capsys.readouterr()
    line = one_error_line(subprocess.CompletedProcess(argv, code, captured.out, captured.err))
    assert "distributed.backend = 'nccl'" in line and "use distributed.backend = gloo" in line


def test_ranks_started_with_different_configs_are_refused_in_one_line(tmp_path):
    """Two ranks of one job started by hand (as on two nodes) with different --set."""
    from distributed.ranks_by_hand import rank_envs

    config = write_config(tmp_path, "mismatch", effective=64)  # 16 × 2 and 32 × 2 divide it
    procs = []
    for env, micro in zip(rank_envs(child_env(), 2), (16, 32), strict=True):
        command = [sys.executable, "-m", "thrifty", "train", str(config)]
        command += ["--out", str(tmp_path / "run"), "--set", f"batch.micro={micro}"]
        procs.append(
            subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
        )
    errors = [p.communicate(timeout=TIMEOUT)[1] for p in procs]
    assert [p.returncode for p in procs] == [2, 2]
    assert "rank 1 was started with another config than rank 0: batch.micro is 32" in errors[0]
    assert errors[1].strip() == ""  # the same error, printed by rank 0 only
    assert not (tmp_path / "run").exists()


OOM_ON_RANK_1 = """
import json
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist

from thrifty import Trainer, TrainConfig

RANK = os.environ.get("RANK", "0")  # no RANK: one process, without a process group
WHERE, AFTER, STRIKES = "none", 0, False  # the case running now (see the loop below)


def strikes(x):
    # Rank 1 runs out of memory on micro-batches above 4 samples after its first AFTER forwards
    # (the FLOP count's two, of two samples and three, among them).
    return STRIKES and Tight.calls > AFTER and x.shape[0] > 4


class FailsInBackward(torch.autograd.Function):
    # Backward reaches the last layer's gradients, then fails before the first layer's.
    @staticmethod
    def forward(ctx, h):
        return h.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("injected on rank 1 in backward")


class Tight(torch.nn.Module):
    calls = 0

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(6, 16)
        self.last = torch.nn.Linear(16, 1)

    def forward(self, x):
        Tight.calls += 1
        h = torch.tanh(self.first(x))
        if WHERE == "backward" and strikes(x):
            h = FailsInBackward.apply(h)
        if WHERE == "forward" and strikes(x):
            raise torch.OutOfMemoryError("injected on rank 1 in forward")
        return self.last(h), x.shape[0]


def loss_fn(out, batch):
    # After DDP's forward has returned: its all-reduce is armed, no gradient reached yet.
    pred, n = out
    if WHERE == "loss" and STRIKES and Tight.calls > AFTER and n > 4:
        raise torch.OutOfMemoryError("injected on rank 1 in the loss")
    return ((pred - batch[1]) ** 2).mean()


g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(256, 6, generator=g), torch.randn(256, 1, generator=g))


def another_optimizer(out):
    # FSDP, 4 steps of AdamW checkpointed at step 3; as if preempted after step 3's save (step
    # 4's checkpoint and the summary gone), resumed with SGD and run.allow_config_change.
    def config(max_steps, **optimizer):
        return TrainConfig.from_dict({
            "run": {"max_steps": max_steps, "out": out + "/run", "progress": "off",
                    "device": "cpu", "log_every": 1, "allow_config_change": True},
            "precision": {"mode": "fp32"},
            "batch": {"micro": 8, "effective": 16},
            "optimizer": {"lr": 0.01, **optimizer},
            "schedule": {"decay": "constant"},
            "checkpoint": {"every": 3},
            "data": {"num_workers": 0},
            "measure": {"system": False, "peak_tflops": 1.0},
            "distributed": {"timeout": "60s", "strategy": "fsdp"},
        })

    with Trainer(Tight(), data, config(4), loss_fn=loss_fn) as trainer:
        trainer.fit()
    preempted = out + "/preempted"  # rank 0's word that step 4's checkpoint is gone
    if RANK == "0":
        shutil.copy(out + "/run/metrics.jsonl", out + "/first.jsonl")
        shutil.rmtree(out + "/run/checkpoints/step-00000004")
        os.remove(out + "/run/summary.json")
        open(preempted, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(preempted):
        assert time.monotonic() < deadline, "rank 0 never removed step 4's checkpoint"
        time.sleep(0.05)
    with Trainer(Tight(), data, config(6, name="sgd"), loss_fn=loss_fn) as trainer:
        trainer.fit()


held = []
# A run a case, in turn, in the folder named by the case: each case is a Trainer of its own
# (two for the optimizer change), joining the job's process group and leaving it, so one launch
# serves them all.
for number, case in enumerate(os.environ["OOM_CASES"].split(",")):
    print(f"case {case}", file=sys.stderr, flush=True)
    if case == "another-optimizer":
        WHERE, STRIKES = "none", False
        another_optimizer(os.path.join(sys.argv[1], case))
        continue
    WHERE, effective, after, strategy = (case + "-" + os.environ["OOM_STRATEGY"]).split("-")[:4]
    AFTER, Tight.calls = int(after), 0
    STRIKES = RANK == "1" and WHERE != "none"
    out = os.path.join(sys.argv[1], case)
    config = TrainConfig.from_dict({
        "run": {"max_steps": 4, "out": out + "/run", "progress": "off", "device": "cpu",
                "log_every": 1},
        "precision": {"mode": "fp32"},
        "batch": {"micro": 8, "effective": int(effective)},
        "data": {"num_workers": 0},
        "measure": {"system": False, "peak_tflops": 1.0},
        "distributed": {"timeout": "60s", "strategy": strategy},
    })
    if number == 1 and os.environ.get("RANK") == "0":
        # Rank 0 late to the second Trainer: rank 1 must not take rank 0's address from the
        # first group, still open, and wait there until the timeout.
        time.sleep(3)
    with Trainer(Tight(), data, config, loss_fn=loss_fn) as trainer:
        joined = dist.is_initialized() and trainer.dist.world_size == 2
        held.append(dist.group.WORLD)  # as an error's frames can: the group outlives the Trainer
        result = trainer.fit()
        weights = [p.detach().clone() for p in trainer.model.parameters()]
    rank = dist.get_rank() if dist.is_initialized() else "-"
    print(f"{case}: rank {rank} joined {joined} left {not dist.is_initialized()}", flush=True)
    # One file a rank: two processes printing long lines to one pipe can interleave them.
    with open(out + "/rank." + RANK, "w") as f:
        json.dump({"steps": result.steps, "micro": result.micro_batch,
                   "w": [w.flatten().tolist() for w in weights]}, f)
"""


def launch_oom_cases(
    tmp_path: Path, cases: Sequence[str], strategy: str = "ddp", nprocs: int = 2
) -> subprocess.CompletedProcess[str]:
    """The script's runs, one for each case WHERE-EFFECTIVE-AFTER[-STRATEGY] (or
    "another-optimizer") in turn, on `nprocs` processes (torchrun's) or 1, with `strategy`
    where the case names none; each writes under `tmp_path / CASE`."""
    script = tmp_path / "oom.py"
    script.write_text(OOM_ON_RANK_1)
    command = [sys.executable]
    if nprocs > 1:
        command += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nprocs}"]
    return subprocess.run(
        [*command, str(script), str(tmp_path)],
        env={**child_env(), "OOM_CASES": ",".join(cases), "OOM_STRATEGY": strategy},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,  # a rank left waiting in a collective fails the test here
    )


def oom_ranks(folder: Path, case: str, ranks: int = 2) -> list[dict]:
    return [json.loads((folder / case / f"rank.{r}").read_text()) for r in range(ranks)]


@pytest.fixture(scope="module")
def untouched(tmp_path_factory) -> Path:
    """The runs that never run out of memory, by effective batch, in cases none-16-0 and
    none-32-0 of this folder: one process, on the same global batches (as
    test_ddp_trains_like_one_process_on_the_same_global_batch shows ranks train like one
    process), the two runs in turn. The script runs in this process, which has torch loaded
    already: a process of its own would only load it again."""
    import runpy

    folder = tmp_path_factory.mktemp("untouched")
    script = folder / "oom.py"
    script.write_text(OOM_ON_RANK_1)
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setenv("OOM_CASES", "none-16-0,none-32-0")
        patch.setenv("OOM_STRATEGY", "auto")
        patch.delenv("RANK", raising=False)  # one process, without a process group
        patch.setattr(sys, "argv", [str(script), str(folder)])
        runpy.run_path(str(script), run_name="__main__")
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]
    return folder


# Two micro-batches a window (forwards 1-2 are step 1's, 3-4 step 2's, ...).
REPLAYED = [
    ("forward", 32, 4),  # the synchronizing (last) micro-batch's forward
    ("backward", 32, 4),  # the synchronizing backward part-way, DDP waiting on the rest
    # One micro-batch a window: it is the synchronizing one.
    ("forward", 16, 3),
    ("loss", 16, 3),  # DDP's forward returned (its all-reduce armed), no gradient yet
]
# The cases of the one torchrun job of 2 processes the `replayed` fixture runs, in turn: a
# launch costs more than the cases together. First one that never runs out of memory (DDP
# without accumulation), then REPLAYED, then an FSDP run resumed with another optimizer, then
# FSDP's out of memory, which ends the job.
NO_ACCUMULATION = "none-16-0"
DDP_CASES = [NO_ACCUMULATION, *(f"{w}-{e}-{a}" for w, e, a in REPLAYED)]
ANOTHER_OPTIMIZER = "another-optimizer"
FSDP_CASE = "forward-32-4-fsdp"


@pytest.fixture(scope="module")
def replayed(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """DDP_CASES, ANOTHER_OPTIMIZER, then FSDP_CASE, in one torchrun job of 2 processes
    (strategy ddp where the case names none). FSDP_CASE ends the job, not zero: every DDP case
    before it has its ranks' files once it finished on both."""
    folder = tmp_path_factory.mktemp("replayed")
    return folder, launch_oom_cases(folder, [*DDP_CASES, ANOTHER_OPTIMIZER, FSDP_CASE])


def finished_before_fsdp(folder: Path, result: subprocess.CompletedProcess[str]) -> None:
    """The replayed job's DDP cases all ended on both ranks, without a warning of DDP's
    arguments, and the job went on to its last case."""
    for case in DDP_CASES:
        assert all((folder / case / f"rank.{r}").exists() for r in (0, 1)), result.stderr[-3000:]
    assert (folder / FSDP_CASE / "run").exists(), result.stderr[-3000:]
    # DDP built with this torch's own arguments: no FutureWarning before FSDP's case began.
    assert "FutureWarning" not in result.stderr.split(f"case {FSDP_CASE}")[0]


@pytest.mark.parametrize(
    "where, effective, after",
    [
        # the window's first micro-batch, before any gradient crosses: the same replay as
        # [forward-32-4], one micro-batch earlier in the window: slow
        pytest.param("forward", 32, 5, marks=pytest.mark.slow),
        *REPLAYED,
    ],
)
def test_an_out_of_memory_error_on_one_rank_is_replayed_by_every_rank(
    request, tmp_path, untouched, where, effective, after
):
    case = f"{where}-{effective}-{after}"
    if request.node.get_closest_marker("slow"):  # a launch of its own
        folder, result = tmp_path, launch_oom_cases(tmp_path, [case])
        assert result.returncode == 0, result.stderr[-3000:]
        assert "FutureWarning" not in result.stderr  # DDP built with this torch's own arguments
    else:
        folder, result = request.getfixturevalue("replayed")
        finished_before_fsdp(folder, result)
    ranks = oom_ranks(folder, case)
    assert all(r["steps"] == 4 and r["micro"] == 4 for r in ranks)  # both halved, none hung
    assert ranks[0]["w"] == ranks[1]["w"]  # and they still train one model
    # The same update as runs that never ran out of memory (halves: the sums' rounding).
    expected = oom_ranks(untouched, f"none-{effective}-0", ranks=1)[0]
    assert expected["micro"] == 8
    for got, want in zip(ranks[0]["w"], expected["w"], strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    events = (folder / case / "run" / "metrics.jsonl").read_text()
    assert '"event": "out_of_memory"' in events


def test_ddp_without_accumulation_trains_like_one_process(replayed, untouched):
    # One micro-batch of 8 a rank a step, its gradients synchronized every time: the losses
    # and weights of one process on the same 16 samples a step.
    folder, result = replayed
    finished_before_fsdp(folder, result)
    ranks = oom_ranks(folder, NO_ACCUMULATION)
    assert all(r["steps"] == 4 and r["micro"] == 8 for r in ranks)
    summary = json.loads((folder / NO_ACCUMULATION / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["accumulation_steps"] == 1
    assert ranks[0]["w"] == ranks[1]["w"]
    expected = oom_ranks(untouched, NO_ACCUMULATION, ranks=1)[0]
    for got, want in zip(ranks[0]["w"], expected["w"], strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    la, lb = losses(folder / NO_ACCUMULATION / "run"), losses(untouched / NO_ACCUMULATION / "run")
    assert sorted(la) == sorted(lb) == [1, 2, 3, 4]
    for step in la:
        assert la[step] == pytest.approx(lb[step], rel=1e-5, abs=1e-6), step


def test_a_trainer_used_with_with_leaves_the_process_group_it_joined(replayed):
    # Each case of the replayed job is a Trainer used with `with`, the group it joined held
    # after it (as an error's frames can), rank 0 late to the second: each joined the job's
    # group of 2 and left it, every rank, and the next one joined anew.
    folder, result = replayed
    finished_before_fsdp(folder, result)
    for case in DDP_CASES:
        # Two ranks print to one pipe: count the reports, whatever their interleaving.
        assert result.stdout.count(f"{case}: rank - joined True left True") == 2, result.stdout
        assert result.stdout.count(f"{case}: rank") == 2, result.stdout


def test_an_fsdp_resume_with_another_optimizer_keeps_the_model_and_starts_the_optimizer_anew(
    replayed,
):
    # The replayed job's ANOTHER_OPTIMIZER case: AdamW's state has other keys than SGD's, yet
    # the model's shards are read back and the new optimizer starts from nothing, instead of the
    # load failing on the saved optimizer's keys.
    folder, result = replayed
    finished_before_fsdp(folder, result)
    err = result.stderr
    case = err[err.index(f"case {ANOTHER_OPTIMIZER}") : err.index(f"case {FSDP_CASE}")]
    assert "resumed from step 3" in case
    assert "optimizer.name 'adamw' → 'sgd'" in case
    first = losses_of(folder / ANOTHER_OPTIMIZER / "first.jsonl")
    resumed = losses_of(folder / ANOTHER_OPTIMIZER / "run" / "metrics.jsonl")
    assert sorted(first) == [1, 2, 3, 4] and sorted(resumed) == list(range(1, 7))
    # Step 4's loss is the model after step 3, before the new optimizer's first step: read back
    # from the shards, it is the loss the first run had there.
    assert resumed[4] == pytest.approx(first[4], rel=1e-5)


def test_an_out_of_memory_error_under_fsdp_ends_the_run_on_every_rank_saying_how_to_resume(
    replayed,
):
    # FSDP's collectives run inside forward and backward: no replay, an end without a hang.
    folder, result = replayed
    finished_before_fsdp(folder, result)
    assert result.returncode != 0
    assert "resume with batch.micro halved and --allow-config-change" in result.stderr
    assert not list((folder / FSDP_CASE).glob("rank.*"))  # no rank went past it
