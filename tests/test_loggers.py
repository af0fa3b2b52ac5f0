"""TensorBoard and MLflow get the figures of metrics.jsonl: read back with TensorBoard's event
reader and the MLflow client and compared, point by point, with the file."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import MissingDependencyError
from thrifty.measure.loggers import IntervalScalars
from thrifty.rundir.files import read_metrics

LOG_EVERY = 2


def cfg(tmp_path: Path, **log: Any) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {
                "max_steps": 4,
                "device": "cpu",
                "out": str(tmp_path / "run"),
                "progress": "off",
                "log_every": LOG_EVERY,
            },
            "batch": {"micro": 4},
            "data": {"num_workers": 0},
            "schedule": {"decay": "constant"},
            "eval": {"every": 2},
            "checkpoint": {"every": "off"},
            "cost": {"usd_per_gpu_hour": 2.0},
            "task": {"model_args": {"api_token": "hunter2"}},
            "log": log,
        }
    )


class SigtermAt(torch.nn.Module):
    """tiny_gpt that sends this process SIGTERM (a preemption notice) on its `at`-th
    training forward."""

    def __init__(self, at: int | None) -> None:
        super().__init__()
        self.inner, self.at, self.calls = tiny_gpt(), at, 0

    def forward(self, **batch: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
        return self.inner(**batch)


def fit(config: TrainConfig, at: int | None = None) -> Any:
    torch.manual_seed(0)
    data = TokenDataset(n=32)
    return Trainer(SigtermAt(at), data, config, val_data=TokenDataset(n=8, seed=1)).fit()


def expected_points(run_dir: Path) -> dict[str, dict[int, float]]:
    """metrics.jsonl's figures as the loggers plot them: each flush (its last record holds the
    interval's MFU) one point at its last step; each evaluation one point."""
    points: dict[str, dict[int, float]] = {}
    interval: list[dict[str, Any]] = []
    previous: dict[str, Any] = {"step": 0, "tokens": 0}
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r.get("val_loss") is not None:
            points.setdefault("val/loss", {})[r["step"]] = r["val_loss"]
        if "step_seconds" not in r:
            continue
        r["new_tokens"] = r["tokens"] - previous["tokens"]
        previous = r
        interval.append(r)
        if "mfu" not in r:
            continue
        seconds = sum(s["step_seconds"] for s in interval)
        figures = {
            "train/loss": sum(s["loss"] for s in interval) / len(interval),
            "train/grad_norm": sum(s["grad_norm"] for s in interval) / len(interval),
            "train/lr": r["lr"],
            "throughput/tokens_per_second": sum(s["new_tokens"] for s in interval) / seconds,
            "throughput/mfu": r["mfu"],
            "cost/usd": r["cost"]["usd"],
            "cost/projected_usd": r["cost"]["projected"]["total_usd"],
            **{
                f"breakdown/{phase}": sum(s["breakdown"][phase] for s in interval) / seconds
                for phase in r["breakdown"]
            },
        }
        for tag, value in figures.items():
            points.setdefault(tag, {})[r["step"]] = value
        interval = []
    return points


def tensorboard_points(run_dir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def mlflow_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for a file store
    return MlflowClient(tracking_uri=mlflow_uri(tmp_path))


def mlflow_uri(tmp_path: Path) -> str:
    return (tmp_path / "mlruns").as_uri()


def mlflow_points(client: Any, run_id: str) -> dict[str, dict[int, float]]:
    """Each metric's newest value at each step."""
    keys = client.get_run(run_id).data.metrics
    return {k: {m.step: m.value for m in client.get_metric_history(run_id, k)} for k in keys}


def assert_same(got: dict[str, dict[int, float]], want: dict[str, dict[int, float]], rel: float):
    assert sorted(got) == sorted(want)
    for tag, values in want.items():
        assert got[tag] == pytest.approx(values, rel=rel), tag


def test_tensorboard_and_mlflow_hold_the_figures_of_metrics_jsonl(tmp_path, monkeypatch):
    result = fit(cfg(tmp_path, tensorboard=True, mlflow=mlflow_uri(tmp_path)))
    run_dir = Path(result.run_dir)
    want = expected_points(run_dir)
    assert want["train/loss"].keys() == {2, 4} and want["val/loss"].keys() == {0, 2, 4}
    assert_same(tensorboard_points(run_dir), want, rel=1e-6)  # TensorBoard keeps float32

    client = mlflow_client(tmp_path, monkeypatch)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    assert_same(mlflow_points(client, run_id), want, rel=1e-12)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "thrifty"
    params = run.data.params
    assert params["run.max_steps"] == "4" and params["schedule.decay"] == "constant"
    assert params["task.model_args.api_token"] == "<redacted>"
    assert "hunter2" not in str(params)
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert artifacts == {"summary.json", "report.html"}


def test_a_preempted_run_reports_and_its_resume_continues_the_same_mlflow_run(
    tmp_path, monkeypatch
):
    config = cfg(tmp_path, tensorboard=True, mlflow=mlflow_uri(tmp_path))
    first = fit(config, at=3)
    assert first.stop_reason == "preempted"
    run_dir = Path(first.run_dir)
    client = mlflow_client(tmp_path, monkeypatch)
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    assert client.get_run(run_id).info.status == "KILLED"
    assert {a.path for a in client.list_artifacts(run_id)} == {"report.html"}

    second = fit(config)
    assert second.stop_reason == "max_steps"
    assert (run_dir / "mlflow_run_id").read_text().strip() == run_id
    assert len(client.search_runs([client.get_run(run_id).info.experiment_id])) == 1
    assert client.get_run(run_id).info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(run_id)} == {"summary.json", "report.html"}
    want = expected_points(run_dir)
    assert want["train/loss"].keys() == {2, first.steps, 4}
    for got in (mlflow_points(client, run_id), tensorboard_points(run_dir)):
        for tag in ("train/loss", "val/loss", "cost/usd"):
            assert got[tag] == pytest.approx(want[tag], rel=1e-6), tag


def test_steps_trained_again_after_a_resume_replace_the_lost_ones_in_tensorboard(tmp_path):
    """An attempt that ran past its newest checkpoint: the steps after it are trained again,
    and TensorBoard shows the new attempt's figures at those steps, as metrics.jsonl does."""
    config = cfg(tmp_path, tensorboard=True).replace(**{"checkpoint.every": "2"})
    run_dir = Path(fit(config).run_dir)
    lost = {r["step"]: r["mfu"] for r in read_metrics(run_dir / "metrics.jsonl") if "mfu" in r}
    shutil.rmtree(run_dir / "checkpoints" / "step-00000004")  # as if killed before saving it
    (run_dir / "summary.json").unlink()
    fit(config)  # resumes from step 2
    kept = {r["step"]: r["mfu"] for r in read_metrics(run_dir / "metrics.jsonl") if "mfu" in r}
    assert any(kept.get(step) != mfu for step, mfu in lost.items() if step > 2)
    assert tensorboard_points(run_dir)["throughput/mfu"] == pytest.approx(kept, rel=1e-6)


@pytest.mark.parametrize("package", ["tensorboard", "mlflow"])
def test_a_missing_logger_package_stops_the_run_before_training_with_the_pip_line(
    tmp_path, monkeypatch, package
):
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now fails
    log = {"tensorboard": True} if package == "tensorboard" else {"mlflow": mlflow_uri(tmp_path)}
    with pytest.raises(MissingDependencyError) as raised:
        fit(cfg(tmp_path, **log))
    assert f"pip install 'thrifty[{package}]'" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_mlflow_server_is_one_warning_and_training_goes_on(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        result = fit(cfg(tmp_path, mlflow=f"http://127.0.0.1:{closed_port()}"))
    assert result.stop_reason == "max_steps" and result.steps == 4
    assert (tmp_path / "run" / "summary.json").exists()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    failed = [w for w in warnings if "logging failed" in w]
    assert len(failed) == 1, warnings
    assert re.match(r"MLflow logging failed \(.+\): training goes on without it$", failed[0])
    assert not [r for r in caplog.records if r.name.startswith("urllib3")]  # no retry chatter


def test_a_tensorboard_directory_that_cannot_be_written_is_one_warning(tmp_path, caplog):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").write_text("a file where the directory goes")
    with caplog.at_level(logging.WARNING):
        result = fit(cfg(tmp_path, tensorboard=True))
    assert result.stop_reason == "max_steps"
    failed = [r.getMessage() for r in caplog.records if "logging failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].startswith("TensorBoard logging failed (")
    assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) > 4


def test_the_interval_mean_leaves_out_a_skipped_step_and_a_nan_loss():
    steps = [
        {"step": 1, "loss": 2.0, "grad_norm": 1.0, "tokens": 10, "step_seconds": 1.0},
        {
            "step": 2,
            "loss": 9.0,
            "grad_norm": 5.0,
            "tokens": 20,
            "step_seconds": 1.0,
            "skipped": True,
        },
        {"step": 3, "loss": float("nan"), "grad_norm": None, "tokens": 30, "step_seconds": 2.0},
        {"step": 4, "loss": 4.0, "grad_norm": 3.0, "tokens": 40, "step_seconds": 1.0, "lr": 0.1},
    ]
    [(step, values)] = IntervalScalars().points(steps)
    assert step == 4
    assert values == {
        "train/loss": 3.0,
        "train/grad_norm": 2.0,
        "train/lr": 0.1,
        "throughput/tokens_per_second": 40 / 5.0,
    }
