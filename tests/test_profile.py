"""The loop's own measurements: step-time breakdown, MFU, cost, trace, and the diagnosis of
workloads whose bottleneck is known."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from helpers import Costed, TokenDataset, VirtualClock, time_trainer_with, tiny_gpt
from thrifty import Trainer
from thrifty.cli import main
from thrifty.config import TrainConfig
from thrifty.rundir.files import read_metrics

PHASES = {"data_wait", "host_to_device", "forward", "backward", "optimizer", "checkpoint", "other"}


def cfg(tmp_path, steps=8, **sections) -> TrainConfig:
    base = {
        "run": {
            "max_steps": steps,
            "device": "cpu",
            "out": str(tmp_path / "run"),
            "progress": "off",
            "log_every": 4,
        },
        "batch": {"micro": 4},
        "data": {"num_workers": 0},
        "schedule": {"decay": "constant"},
        "checkpoint": {"every": "off"},
        "spot": {"provider": "none"},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return TrainConfig.from_dict(base)


def test_every_step_records_a_breakdown_that_adds_up_to_the_step(tmp_path):
    trainer = Trainer(tiny_gpt(), TokenDataset(), cfg(tmp_path, measure={"peak_tflops": 2.0}))
    result = trainer.fit()
    steps = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert len(steps) == 8
    for r in steps:
        assert set(r["breakdown"]) == PHASES
        assert sum(r["breakdown"].values()) == pytest.approx(r["step_seconds"], rel=1e-6)
        assert r["breakdown"]["backward"] > 0 and r["breakdown"]["forward"] > 0
    # MFU: the model's FLOPs per step over the mean step, against the peak given
    assert result.mfu == pytest.approx(trainer.flops.flops / result.step_seconds / 2e12)
    assert any("mfu" in r for r in steps)


def test_breakdown_off_records_none(tmp_path):
    result = Trainer(tiny_gpt(), TokenDataset(), cfg(tmp_path, measure={"breakdown": False})).fit()
    steps = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert all("breakdown" not in r for r in steps)
    assert result.mfu is None


def test_cost_meter_reports_dollars_and_the_on_demand_equivalent(tmp_path):
    config = cfg(
        tmp_path,
        cost={
            "usd_per_gpu_hour": 1.2,
            "gpus": 8,
            "pricing": "spot",
            "on_demand_usd_per_gpu_hour": 4.1,
        },
    )
    result = Trainer(tiny_gpt(), TokenDataset(), config).fit()
    c = result.cost
    assert c["gpu_hours"] == pytest.approx(8 * c["seconds"] / 3600)
    assert c["usd"] == pytest.approx(c["gpu_hours"] * 1.2)
    assert c["on_demand_usd"] == pytest.approx(c["gpu_hours"] * 4.1)
    last = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "cost" in r][-1]
    assert last["cost"]["usd"] > 0 and last["cost"]["usd_per_million_tokens"] > 0
    assert "projected" in last["cost"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cost"]["usd"] == pytest.approx(c["usd"])


def test_trace_writes_a_profiler_trace(tmp_path):
    Trainer(
        tiny_gpt(),
        TokenDataset(),
        cfg(tmp_path, measure={"trace": str(tmp_path / "trace"), "trace_steps": 2}),
    ).fit()
    assert list((tmp_path / "trace").glob("*.json"))


# --- workloads with a known bottleneck ----------------------------------------------------
# Timed on a VirtualClock (see helpers): each workload says what its data and its compute cost,
# the Trainer measures it as it would a real one, and the verdict is the same on any machine.


class SlowItems(torch.utils.data.Dataset):
    """Each item takes 20 ms to produce (a slow disk, a heavy decode), waiting, not computing."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int):
        self.clock.advance(0.0, wall=0.02)
        return torch.randn(16), torch.randn(1)


class Regressor(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, 1)

    def forward(self, x, y):
        return ((self.lin(x) - y) ** 2).mean()


class TinyOps(nn.Module):
    """Hundreds of tiny ops: launch and interpreter overhead is all there is."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(150))

    def forward(self, x, y):
        for layer in self.layers:
            x = torch.tanh(layer(x)) * 0.5 + x
        return ((x.sum(1, keepdim=True) - y) ** 2).mean()


class BigMatmuls(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(4)))

    def forward(self, x, y):
        return ((self.net(x).sum(1, keepdim=True) - y) ** 2).mean()


class Vectors(torch.utils.data.Dataset):
    def __init__(self, width: int, n: int = 4096) -> None:
        self.x = torch.randn(n, width)
        self.y = torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def diagnosed(tmp_path, model, data, micro, steps=6):
    """The trained Trainer, its diagnosis set; the peak is 1 TFLOP/s."""
    config = cfg(
        tmp_path,
        steps=steps,
        batch={"micro": micro},
        precision={"mode": "fp32"},
        optimizer={"name": "sgd", "lr": 1e-3},
        measure={"peak_tflops": 1.0},
    )
    trainer = Trainer(model, data, config)
    trainer.fit()
    return trainer


def test_slow_items_are_diagnosed_as_data_loading(tmp_path, monkeypatch):
    clock = VirtualClock()
    time_trainer_with(monkeypatch, clock)
    # 8 CPUs on any machine: one worker alone, 160 ms a batch, would not shorten the step.
    monkeypatch.setattr("thrifty.measure.instruments.available_cpus", lambda: 8)
    model = Costed(Regressor(16), clock, forward=0.5e-3, backward=1e-3)
    d = diagnosed(tmp_path, model, SlowItems(clock), micro=8).diagnosis
    assert d.bottleneck == "data_loading"
    assert d.breakdown["data_wait"] == pytest.approx(0.160 / 0.1615)  # 8 items x 20 ms a batch
    assert d.recommendations[0].area == "data" and "num_workers" in d.recommendations[0].text


def test_many_tiny_ops_are_diagnosed_as_overhead_bound(tmp_path, monkeypatch):
    clock = VirtualClock()
    time_trainer_with(monkeypatch, clock)
    model = Costed(TinyOps(), clock, forward=0.75e-3, backward=1.5e-3)  # 5 and 10 µs a layer
    d = diagnosed(tmp_path, model, Vectors(4), micro=2).diagnosis
    assert d.bottleneck == "overhead_bound"
    assert d.measured.seconds_per_op == pytest.approx(2.25e-3 / d.measured.aten_ops_per_step)


def test_big_matmuls_are_compute_bound_on_a_machine_busy_with_other_work(tmp_path, monkeypatch):
    """Compute runs at half the peak while the run holds the core; a neighbour holds it 3/4 of
    the time, so the wall clock says an eighth. Judged on the time it held, it is compute-bound."""
    clock = VirtualClock()
    time_trainer_with(monkeypatch, clock)
    width, micro = 256, 64
    forward_flops = 2 * micro * width * width * 4
    held = forward_flops / 0.5e12  # seconds of forward at half of the 1 TFLOP/s peak
    model = Costed(BigMatmuls(width), clock, forward=held, backward=2 * held, slowdown=4.0)
    trainer = diagnosed(tmp_path, model, Vectors(width), micro=micro, steps=4)
    d = trainer.diagnosis
    assert d.bottleneck == "compute_bound", d.evidence
    assert d.measured.compute_mfu == pytest.approx(trainer.flops.flops / (3 * held) / 1e12)
    assert d.mfu == pytest.approx(trainer.flops.flops / (4 * 3 * held) / 1e12)  # the wall's


# --- the command ------------------------------------------------------------------------------


def test_profile_json_names_the_bottleneck(capsys, tmp_path):
    code = main(
        [
            "profile",
            "--steps",
            "4",
            "--json",
            "--set",
            "data.num_workers=0",
            "--set",
            "task.model_args={ n_layer = 2, n_head = 2, n_embd = 32, block_size = 32 }",
            "--set",
            "task.data_args={ block_size = 32, max_bytes = 100000 }",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    for key in ("bottleneck", "evidence", "recommendations", "breakdown", "mfu"):
        assert key in report
    assert sum(report["breakdown"].values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "--steps", "0"], "a profile needs at least 1 step"),
        (["profile", "--steps", "2", "--set", "cost.instance=p9.mega"], "p9.mega"),
        (["profile", "--steps", "2", "--set", "cost.usd_per_gpu_hour=-3"], "cost.usd_per_gpu_hour"),
    ],
)
def test_profile_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_gpu_utilization_samples_reach_the_diagnosis(tmp_path):
    from thrifty.measure.monitor import RunMonitor
    from thrifty.measure.progress import ProgressBar
    from thrifty.measure.timing import CpuTimer
    from thrifty.rundir.files import MetricsLog

    class FakeSampler:
        def summary_and_reset(self):
            return {"gpu_util_percent_mean": 35.0, "gpu_util_percent_std": 40.0}

        def stop(self):
            pass

    timer = CpuTimer()
    monitor = RunMonitor(
        MetricsLog(tmp_path / "m.jsonl"),
        ProgressBar(None, "off"),
        timer,
        exclude_steps=0,
        flops_per_step=None,
        peak=None,
        sampler=FakeSampler(),
    )
    for step in (1, 2):
        timer.start()
        timer.mark("forward")
        record = {
            "step": step,
            "loss": torch.tensor(1.0),
            "grad_norm": None,
            "step_seconds": 0.01,
            "samples_in_step": 4,
            "tokens_in_step": 0,
        }
        monitor.add(record, timer.finish())
    monitor.flush(0.02, 8, 0)
    diagnosis = monitor.diagnose(device_type="cuda")
    monitor.close()
    assert diagnosis.measured.gpu_util_mean == 35.0 and diagnosis.measured.gpu_util_std == 40.0
