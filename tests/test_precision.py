from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import thrifty.levers.precision as precision
from helpers import RecordingSGD
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.levers.precision import NoScaler, resolve_precision


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def config(tmp_path, mode: str, **extra) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {
                "max_steps": 1,
                "device": "cpu",
                "out": str(tmp_path / mode),
                "progress": "off",
            },
            "precision": {"mode": mode},
            "batch": {"micro": 8},
            "data": {"num_workers": 0},
            "schedule": {"decay": "constant"},
            **extra,
        }
    )


def test_bf16_runs_the_matmuls_in_bf16_and_the_loss_in_fp32(tmp_path):
    model = Classifier()
    seen: list[torch.dtype] = []
    for layer in model.net:
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    losses: list[torch.dtype] = []

    def loss_fn(output, batch):
        loss = F.cross_entropy(output, batch[1])
        losses.append(loss.dtype)
        return loss

    result = Trainer(model, Pairs(), config(tmp_path, "bf16"), loss_fn=loss_fn).fit()
    assert result.precision == "bf16"
    assert seen and set(seen) == {torch.bfloat16}
    assert losses and set(losses) == {torch.float32}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_fp32_runs_the_matmuls_in_fp32(tmp_path):
    model = Classifier()
    seen: list[torch.dtype] = []
    model.net[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    Trainer(
        model, Pairs(), config(tmp_path, "fp32"), loss_fn=lambda o, b: F.cross_entropy(o, b[1])
    ).fit()
    assert seen and set(seen) == {torch.float32}


def test_only_fp16_gets_a_grad_scaler():
    cpu = torch.device("cpu")
    assert isinstance(resolve_precision("fp16", cpu).make_scaler(), torch.amp.GradScaler)
    assert isinstance(resolve_precision("bf16", cpu).make_scaler(), NoScaler)
    assert isinstance(resolve_precision("fp32", cpu).make_scaler(), NoScaler)


def test_fp16_clips_and_reports_the_unscaled_gradient_norm(tmp_path):
    optimizer_holder = {}

    def make(model):
        optimizer_holder["opt"] = RecordingSGD(model.parameters(), lr=0.1)
        return optimizer_holder["opt"]

    model = Classifier()
    trainer = Trainer(
        model,
        Pairs(),
        config(tmp_path, "fp16", optimizer={"grad_clip": 1e6}),
        optimizer=make(model),
        loss_fn=lambda o, b: F.cross_entropy(o, b[1]),
    )
    trainer.fit()
    assert isinstance(trainer.scaler, torch.amp.GradScaler)
    assert trainer.scaler.get_scale() > 1000  # the loss really was scaled
    applied = torch.linalg.vector_norm(
        torch.stack([g.norm() for g in optimizer_holder["opt"].seen])
    )
    record = json.loads((tmp_path / "fp16" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["grad_norm"] == pytest.approx(float(applied), rel=1e-4)
    assert record["grad_norm"] < 100  # not multiplied by the 65536 loss scale


def test_auto_picks_bf16_on_a_cpu_with_amx(monkeypatch):
    monkeypatch.setenv(precision.CPU_FLAGS_ENV, "amx_bf16 avx2")
    chosen = resolve_precision("auto", torch.device("cpu"))
    assert chosen.name == "bf16" and "amx_bf16" in chosen.reason


def test_auto_picks_fp32_on_a_cpu_without_native_bf16(monkeypatch):
    monkeypatch.setenv(precision.CPU_FLAGS_ENV, "avx2")
    chosen = resolve_precision("auto", torch.device("cpu"))
    assert chosen.name == "fp32" and "emulated" in chosen.reason


def test_the_cpu_flags_come_from_proc_cpuinfo_unless_thrifty_cpu_flags_is_set(monkeypatch):
    monkeypatch.delenv(precision.CPU_FLAGS_ENV, raising=False)
    monkeypatch.setattr(precision, "_proc_cpu_flags", lambda: frozenset({"avx512_bf16"}))
    chosen = resolve_precision("auto", torch.device("cpu"))
    assert (chosen.name, chosen.reason) == ("bf16", "CPU has avx512_bf16")
    monkeypatch.setenv(precision.CPU_FLAGS_ENV, "")  # a CPU said to have none
    chosen = resolve_precision("auto", torch.device("cpu"))
    assert chosen.name == "fp32"
    assert chosen.reason == (
        "CPU has no AMX or AVX512-BF16 (as THRIFTY_CPU_FLAGS says): bf16 would be emulated"
    )


def test_a_run_on_a_cpu_said_to_have_amx_trains_in_bf16(tmp_path, monkeypatch):
    # How the suite runs as on such a CPU: THRIFTY_CPU_FLAGS reaches a whole run's auto.
    monkeypatch.setenv(precision.CPU_FLAGS_ENV, "amx_bf16")
    model = Classifier()
    loss_fn = lambda o, b: F.cross_entropy(o, b[1])  # noqa: E731
    result = Trainer(model, Pairs(), config(tmp_path, "auto"), loss_fn=loss_fn).fit()
    assert result.precision == "bf16"


@pytest.mark.parametrize(
    ("capability", "expected"), [((8, 0), "bf16"), ((9, 0), "bf16"), ((7, 0), "fp16")]
)
def test_auto_on_cuda_follows_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    chosen = resolve_precision("auto", torch.device("cuda"))
    assert chosen.name == expected
    assert f"{capability[0]}.{capability[1]}" in chosen.reason
