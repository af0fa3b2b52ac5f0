"""A user's callbacks on one process: a stop with its reason in the summary, figures in
metrics.jsonl, the votes of one process, the order of the events, and bad callbacks refused."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from torch import nn

from thrifty import Trainer
from thrifty.callbacks import Callback, StepEnd
from thrifty.checkpointing.store.manifest import MANIFEST
from thrifty.config import TrainConfig
from thrifty.errors import ThriftyError
from thrifty.rundir.files import read_metrics


class Regression(nn.Module):
    """Returns its loss on an (x, y) batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.linear(x) - y) ** 2).mean()


def data(rows: int = 256) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(rows, 6, generator=g), torch.randn(rows, 1, generator=g)
    )


def cfg(tmp_path, **sections) -> TrainConfig:
    base = {
        "run": {
            "max_steps": 12,
            "device": "cpu",
            "out": str(tmp_path / "run"),
            "progress": "off",
            "log_every": 100,  # the stop's flush writes the steps: none is lost to the buffer
        },
        "batch": {"micro": 8},
        "data": {"num_workers": 0},
        "schedule": {"decay": "constant"},
        "measure": {"system": False},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return TrainConfig.from_dict(base)


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, step_info: StepEnd) -> None:
        if step_info.step == self.step:
            step_info.stop(f"enough at step {step_info.step}")


def test_a_callback_stops_the_run_with_its_reason_in_the_summary_and_the_log(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        result = Trainer(Regression(), data(), cfg(tmp_path), callbacks=[StopAt(5)]).fit()
    assert result.steps == 5
    assert result.stop_reason == "callback"
    assert result.stop_detail == "enough at step 5"
    assert result.exit_code == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 5
    assert summary["stop_reason"] == "callback"
    assert summary["stop_detail"] == "enough at step 5"
    lines = [r.getMessage() for r in caplog.records if r.name == "thrifty"]
    assert "a callback stops the run at step 5: enough at step 5" in lines
    steps = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert steps == [1, 2, 3, 4, 5]


def test_a_run_without_a_callback_stop_has_no_stop_detail(tmp_path):
    result = Trainer(Regression(), data(), cfg(tmp_path, run={"max_steps": 3})).fit()
    assert result.stop_reason == "max_steps" and result.stop_detail is None


class OddFigure(Callback):
    """Adds a figure to the records of odd steps only."""

    def on_step_end(self, step_info: StepEnd) -> None:
        if step_info.step % 2:
            step_info.record["my_figure"] = step_info.step * 1.5


def test_a_callbacks_figure_is_in_metrics_of_each_step_it_set_it_on(tmp_path):
    Trainer(
        Regression(),
        data(),
        cfg(tmp_path, run={"max_steps": 6, "log_every": 4}),
        callbacks=[OddFigure()],
    ).fit()
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for record in records:
        if record["step"] % 2:
            assert record["my_figure"] == record["step"] * 1.5
        else:
            assert "my_figure" not in record


class Counts(Callback):
    """Votes its step and 7, and keeps what came back."""

    votes = 2

    def __init__(self) -> None:
        self.heard: list[list[int]] = []

    def vote(self, step: int) -> list[int]:
        return [step, 7]

    def on_step_end(self, step_info: StepEnd) -> None:
        self.heard.append(list(step_info.votes))


class Silent(Callback):
    def __init__(self) -> None:
        self.heard: list[list[int]] = []

    def on_step_end(self, step_info: StepEnd) -> None:
        self.heard.append(list(step_info.votes))


def test_with_one_process_a_callbacks_votes_come_back_as_given(tmp_path):
    silent, counts = Silent(), Counts()
    Trainer(
        Regression(), data(), cfg(tmp_path, run={"max_steps": 3}), callbacks=[silent, counts]
    ).fit()
    assert counts.heard == [[1, 7], [2, 7], [3, 7]]
    assert silent.heard == [[], [], []]


class Journal(Callback):
    """Writes down each event as it comes, with whether a saved checkpoint is on disk."""

    def __init__(self, stop_at: int) -> None:
        self.events: list[tuple] = []
        self.stop_at = stop_at

    def on_fit_start(self, run) -> None:
        self.events.append(("fit_start", run.state.step))

    def on_evaluation_end(self, step: int, val_loss: float | None) -> None:
        self.events.append(("evaluation_end", step, val_loss is not None))

    def on_save(self, step: int, location: str | None) -> None:
        assert location is not None
        written = os.path.exists(os.path.join(location, MANIFEST))
        self.events.append(("save", step, os.path.basename(location), written))

    def on_step_end(self, step_info: StepEnd) -> None:
        self.events.append(("step_end", step_info.step))
        if step_info.step == self.stop_at:
            step_info.stop("the journal is full")

    def on_stop(self, step: int, reason: str) -> None:
        self.events.append(("stop", step, reason))

    def on_fit_end(self, result) -> None:
        self.events.append(("fit_end", result.steps, result.stop_reason))


def test_at_a_step_that_saves_the_save_comes_before_a_callbacks_stop(tmp_path):
    journal = Journal(stop_at=4)
    config = cfg(tmp_path, checkpoint={"every": 2}, eval={"every": 2})
    result = Trainer(Regression(), data(), config, val_data=data(64), callbacks=[journal]).fit()
    assert result.steps == 4 and result.stop_reason == "callback"
    assert journal.events == [
        ("fit_start", 0),
        ("evaluation_end", 0, True),
        ("step_end", 1),
        ("evaluation_end", 2, True),
        ("save", 2, "step-00000002", True),  # on disk when the callback hears of it
        ("step_end", 2),
        ("step_end", 3),
        ("evaluation_end", 4, True),
        ("save", 4, "step-00000004", True),
        ("step_end", 4),  # the stop, after the save of its step
        ("stop", 4, "callback"),
        ("save", 4, "step-00000004", True),  # the final checkpoint
        ("fit_end", 4, "callback"),
    ]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["checkpoint"]["newest_step"] == 4


def test_an_object_that_is_not_a_callback_is_refused_in_one_line(tmp_path):
    with pytest.raises(ThriftyError, match=r"^callbacks\[0\] is a str, not a callback: subclass"):
        Trainer(Regression(), data(), cfg(tmp_path), callbacks=["print"])


def test_a_vote_of_the_wrong_length_is_refused_in_one_line(tmp_path):
    class Short(Counts):
        def vote(self, step: int) -> list[int]:
            return [step]

    with pytest.raises(ThriftyError, match=r"Short.vote\(1\) returned \[1\]: it must return a"):
        Trainer(Regression(), data(), cfg(tmp_path), callbacks=[Short()]).fit()


class StopBelow(Callback):
    """Stops the run from an evaluation once the validation loss is below `target`."""

    def __init__(self, target: float) -> None:
        self.target = target

    def on_evaluation_end(self, step: int, val_loss: float | None) -> str | None:
        if step > 0 and val_loss is not None and val_loss < self.target:
            return f"val_loss {val_loss:.3f} below {self.target}"
        return None


def test_a_callback_stops_the_run_from_an_evaluation_and_the_run_saves_that_step(tmp_path):
    config = cfg(tmp_path, eval={"every": 3})
    result = Trainer(
        Regression(), data(), config, val_data=data(64), callbacks=[StopBelow(100.0)]
    ).fit()
    assert result.steps == 3 and result.stop_reason == "callback"  # the first evaluation past 0
    assert result.stop_detail.startswith("val_loss ") and result.stop_detail.endswith(
        " below 100.0"
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["checkpoint"]["newest_step"] == 3


def test_thrifty_own_behaviours_are_the_runs_callbacks_around_the_users(tmp_path):
    """The loop calls one list: the preemption notice, the budget, the evaluation and the
    checkpoint saver, the user's callbacks in the order given, and the guard, which records."""
    first, second = OddFigure(), StopAt(99)
    trainer = Trainer(Regression(), data(), cfg(tmp_path), callbacks=[first, second])
    names = [type(c).__name__ for c in trainer.events.items]
    assert names == [
        "PreemptionNotice",
        "BudgetCheck",
        "Evaluation",
        "CheckpointSaver",
        "OddFigure",
        "StopAt",
        "Guard",
    ]
    assert trainer.events.items[4] is first and trainer.events.items[5] is second


def test_a_stop_reason_with_a_newline_and_a_secret_is_one_line_without_the_secret(tmp_path):
    class Leaky(Callback):
        def on_step_end(self, step_info: StepEnd) -> None:
            if step_info.step == 2:
                step_info.stop("bucket s3://key:hunter2@bucket gone\nretry later")

    result = Trainer(Regression(), data(), cfg(tmp_path), callbacks=[Leaky()]).fit()
    assert result.stop_reason == "callback" and result.steps == 2
    summary = (tmp_path / "run" / "summary.json").read_text()
    detail = json.loads(summary)["stop_detail"]
    assert "hunter2" not in summary and "\n" not in detail
    assert detail.endswith("gone\\nretry later")
