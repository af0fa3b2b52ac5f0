"""The summary's final val loss is one measured after training began: a run evaluated only
before its first step reports none (and says why), not its initial loss as a final one."""

from __future__ import annotations

import json

from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.reporting.end_of_run import print_summary


def fit(tmp_path, name: str, **run):
    config = TrainConfig.from_dict(
        {
            "run": {"device": "cpu", "out": str(tmp_path / name), "progress": "off", **run},
            "batch": {"micro": 4},
            "data": {"num_workers": 0},
            "eval": {"every": 100},  # never due within these runs: only the initial one
            "log": {"report": False},
        }
    )
    val = TokenDataset(n=8, seed=1)
    with Trainer(tiny_gpt(n_layer=1), TokenDataset(n=16), config, val_data=val) as trainer:
        return trainer.fit()


def test_a_run_evaluated_only_at_step_0_has_no_final_val_loss(tmp_path, capsys):
    result = fit(tmp_path, "epoch", max_epochs=1)  # the data runs out: no closing evaluation
    assert result.stop_reason == "data_exhausted" and result.steps == 4
    assert result.initial_val_loss is not None
    assert result.val_loss is None
    summary = json.loads((tmp_path / "epoch" / "summary.json").read_text())
    assert summary["final_val_loss"] is None
    assert summary["initial_val_loss"] == result.initial_val_loss
    capsys.readouterr()
    print_summary(result)
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in _rows(capsys)}
    assert rows["final val loss"] == "not measured (no evaluation after step 0)"


def test_a_closing_evaluation_is_the_final_val_loss(tmp_path):
    result = fit(tmp_path, "steps", max_steps=4)  # the budget's last step is evaluated
    assert result.val_loss is not None and result.val_loss != result.initial_val_loss
    summary = json.loads((tmp_path / "steps" / "summary.json").read_text())
    assert summary["final_val_loss"] == result.val_loss


def _rows(capsys) -> list[str]:
    return [line for line in capsys.readouterr().out.splitlines() if line.count("│") == 3]
