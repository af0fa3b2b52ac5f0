"""A stop signal after the last step (while the final checkpoint is finished, while the summary
and report are written) finds the run done: `thrifty train` finishes its outputs and exits 0,
saying in one line that the signal came and nothing was left to save. Before, a SIGTERM while
the outputs were written killed the process (exit -15, no summary)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from stop_probe import sigterm_not_for_thrifty  # noqa: F401 (a fixture)
from thrifty.checkpointing.saving.checkpointer import RunCheckpointer
from thrifty.cli import main
from thrifty.run import trainer as trainer_module

JOB = """
[run]
max_steps = 3
progress = "off"
[batch]
micro = 4
[data]
num_workers = 0
[checkpoint]
every = "off"
[spot]
provider = "none"
[measure]
breakdown = false
[log]
report = false
[task]
model = "thrifty.demo:build_model"
train_data = "helpers:augmented_tokens"
model_args = { n_layer = 1, n_head = 2, n_embd = 32, block_size = 32 }
"""


def sigterm_before(owner, name: str, monkeypatch) -> None:
    """Make `owner.name` send this process a SIGTERM before it runs."""
    original = getattr(owner, name)

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, signalled)


@pytest.mark.parametrize(
    ("owner", "name"),
    [(RunCheckpointer, "finish"), (trainer_module, "write_outputs")],
    ids=["while-the-final-checkpoint-is-finished", "while-the-summary-is-written"],
)
@pytest.mark.usefixtures("sigterm_not_for_thrifty")
def test_a_sigterm_after_the_last_step_exits_0_with_one_line(
    tmp_path: Path, monkeypatch, capsys, owner, name
):
    config = tmp_path / "job.toml"
    config.write_text(JOB)
    sigterm_before(owner, name, monkeypatch)
    code = main(["train", str(config), "--out", str(tmp_path / "run")])
    stderr = capsys.readouterr().err
    assert code == 0, stderr
    assert [line for line in stderr.splitlines() if "SIGTERM" in line] == [
        "thrifty: received SIGTERM after the last step (step 3): the run is finished, nothing "
        "left to save (exit code 0)"
    ]
    assert (tmp_path / "run" / "summary.json").exists()
    assert (tmp_path / "run" / "checkpoints" / "step-00000003" / "manifest.json").exists()
