"""Bad input that used to end in a traceback: each gets one line naming the problem and the fix
(exit code 2 on the command line), checked before anything reads from the data."""

from __future__ import annotations

import pytest
import torch

from helpers import TokenDataset, tiny_gpt
from test_cli import run_cli
from thrifty import Trainer
from thrifty.checkpointing.store import CheckpointManager
from thrifty.config import TrainConfig
from thrifty.errors import ConfigError, ThriftyError
from thrifty.run.trainer import resolve_device

PROJECT = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.lin = nn.Linear(width, 2)
    def forward(self, x, y):
        return nn.functional.mse_loss(self.lin(x), y)

def model(width=4):
    return Net(width)

def frozen():
    net = Net()
    net.requires_grad_(False)
    return net

def not_a_model():
    return {"lin": 1}

def data(n=32):
    return torch.utils.data.TensorDataset(torch.randn(n, 4), torch.randn(n, 2))

def empty():
    return data(0)

def tiny():
    return data(3)

def a_generator():
    return (i for i in range(10))

COLLATED = []

def pairs():
    # Samples a default collate cannot batch: the task's collate_fn must be the one used.
    return [{"x": torch.randn(4).tolist(), "y": [0.0, 1.0]} for _ in range(32)]

def collate(samples):
    COLLATED.append(len(samples))
    x = torch.tensor([s["x"] for s in samples])
    y = torch.tensor([s["y"] for s in samples])
    return x, y
"""


class Unreadable(torch.utils.data.Dataset):
    """Fails the test if anything reads a sample: the checks must come first."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        raise AssertionError("a sample was read before the dataset was checked")


def cfg(tmp_path, **run) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {"max_steps": 2, "device": "cpu", "out": str(tmp_path / "r"), **run},
            "batch": {"micro": 4},
            "data": {"num_workers": 0},
            "schedule": {"decay": "constant"},
        }
    )


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "badinputproj.py").write_text(PROJECT)
    config = tmp_path / "job.toml"
    config.write_text(
        '[run]\nmax_steps = 2\nprogress = "off"\n[batch]\nmicro = 4\n[data]\nnum_workers = 0\n'
        '[schedule]\ndecay = "constant"\n[task]\nmodel = "badinputproj:model"\n'
        'train_data = "badinputproj:data"\n'
    )
    monkeypatch.chdir(tmp_path)
    return config


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "task.train_data=badinputproj:empty"], "is empty: it has 0 samples"),
        (
            ["--set", "task.train_data=badinputproj:tiny"],
            "has 3 samples, fewer than one micro-batch (batch.micro = 4): set batch.micro to 3",
        ),
        (["--set", "task.model=badinputproj:frozen"], "has no trainable parameters"),
        (
            ["--set", "task.model=badinputproj:not_a_model"],
            "what task.model = 'badinputproj:not_a_model' returned is a dict, not a torch.nn.Module",
        ),
        (
            ["--set", "task.train_data=badinputproj:a_generator"],
            "what task.train_data = 'badinputproj:a_generator' returned is a generator: pass a "
            "map-style Dataset",
        ),
        (
            ["--set", "task.model_args={depth = 3}"],
            "task.model_args does not fit task.model = badinputproj:model: got an unexpected "
            "keyword argument 'depth'; it takes (width)",
        ),
        (
            ["--set", "task.data_args={rows = 3}"],
            "task.data_args does not fit task.train_data = badinputproj:data",
        ),
        (["--set", "run.device=gpu"], "run.device = 'gpu' is invalid"),
        (["--set", "run.device=cuda:1"], "run.device = 'cuda:1' is invalid"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, project, tmp_path, args, message):
    code, _, err = run_cli(capsys, "train", str(project), "--out", str(tmp_path / "r"), *args)
    assert code == 2, err
    assert err.startswith("thrifty: error: ") and message in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_datasets_are_checked_before_any_sample_is_read(tmp_path):
    with pytest.raises(ThriftyError, match="train_data has 3 samples, fewer than one micro"):
        Trainer(tiny_gpt(), Unreadable(3), cfg(tmp_path))
    with pytest.raises(ThriftyError, match="val_data is empty"):
        Trainer(tiny_gpt(), TokenDataset(n=16), cfg(tmp_path), val_data=Unreadable(0))


def test_a_model_with_nothing_to_train_is_refused(tmp_path):
    model = tiny_gpt().requires_grad_(False)
    with pytest.raises(ThriftyError, match="GPT\\) has no trainable parameters"):
        Trainer(model, TokenDataset(n=16), cfg(tmp_path))


def test_a_checkpoint_without_a_model_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "foreign"
    with CheckpointManager(str(folder)) as manager:
        manager.save(1, {"weights": torch.zeros(3)})
    config = cfg(tmp_path).replace(**{"checkpoint.resume": str(folder / "step-00000001")})
    with pytest.raises(ThriftyError, match="the checkpoint holds no model, optimizer"):
        Trainer(tiny_gpt(), TokenDataset(n=16), config).fit()


class FakeCuda:
    """Two visible CUDA devices, for the device checks on a machine without one."""

    def __init__(self, monkeypatch) -> None:
        self.current = 0
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "set_device", self.set_device)

    def set_device(self, device) -> None:
        self.current = torch.device(device).index


def test_a_second_cuda_device_becomes_the_current_one(monkeypatch):
    fake = FakeCuda(monkeypatch)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert fake.current == 1  # events, streams, memory figures now follow cuda:1
    assert resolve_device("cuda") == torch.device("cuda", 1)  # plain "cuda" is the current one
    with pytest.raises(ConfigError, match="sees 2 CUDA device\\(s\\), cuda:0 to cuda:1"):
        resolve_device("cuda:2")


def test_grad_norm_is_recorded_with_clipping_off(tmp_path):
    from thrifty.rundir.files import read_metrics

    config = cfg(tmp_path, log_every=1, progress="off").replace(**{"optimizer.grad_clip": "0"})
    Trainer(tiny_gpt(), TokenDataset(n=16), config).fit()
    steps = [r for r in read_metrics(tmp_path / "r" / "metrics.jsonl") if "loss" in r]
    assert len(steps) == 2
    assert all(isinstance(r["grad_norm"], float) and r["grad_norm"] > 0 for r in steps)


def test_fit_from_python_shows_the_same_lines_and_summary(tmp_path, capfd, monkeypatch):
    import logging

    # A notebook: nobody configured logging (pytest's capture handler taken away).
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(logging.getLogger("thrifty"), "handlers", [])
    result = Trainer(tiny_gpt(), TokenDataset(n=16), cfg(tmp_path, progress="off")).fit()
    out, err = capfd.readouterr()
    assert f"thrifty: precision: {result.precision} (" in err  # what auto chose on this CPU
    assert "thrifty run summary" in out
    assert not logging.getLogger("thrifty").handlers  # the handler was only for fit()


def test_fit_stays_quiet_when_the_caller_configured_logging(tmp_path, capfd, monkeypatch):
    import logging

    handler = logging.NullHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    Trainer(tiny_gpt(), TokenDataset(n=16), cfg(tmp_path, progress="off")).fit()
    out, err = capfd.readouterr()
    assert "thrifty run summary" not in out and "thrifty:" not in err


def test_collate_fn_comes_from_the_task(capsys, project, tmp_path):
    import sys

    code, _, err = run_cli(
        capsys,
        "train",
        str(project),
        "--out",
        str(tmp_path / "r"),
        "--set",
        "task.train_data=badinputproj:pairs",
        "--set",
        "task.collate_fn=badinputproj:collate",
    )
    assert code == 0, err
    assert sys.modules["badinputproj"].COLLATED and set(sys.modules["badinputproj"].COLLATED) == {4}


def test_a_profile_uses_the_tasks_collate_fn_and_its_own_breakdown(capsys, project):
    import sys

    # The job's own config leaves the breakdown off; the profile is made of it.
    project.write_text(project.read_text() + "[measure]\nbreakdown = false\n")
    seen = getattr(sys.modules.get("badinputproj"), "COLLATED", [])
    before = len(seen)
    code, out, err = run_cli(
        capsys,
        "profile",
        str(project),
        "--steps",
        "8",
        "--set",
        "task.train_data=badinputproj:pairs",
        "--set",
        "task.collate_fn=badinputproj:collate",
        "--set",
        "run.max_epochs=100",
    )
    assert code == 0, err
    assert len(sys.modules["badinputproj"].COLLATED) > before
    assert "bottleneck:" in out  # the breakdown the job's config may leave off
