"""A finished run relaunched with the same command (an engine that never saw it succeed) is
done: exit code 0, one plain line, and not a byte of its directory changed. Another config is
still refused, and a larger budget still trains it further."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import TokenDataset, tiny_gpt
from run_dir_helpers import job, train
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import RunAlreadyFinished, ThriftyError, command_line_words, fix


def stamps(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Each file's bytes and modification time (ns): untouched means both are the same."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_same_command_on_a_finished_run_exits_0_and_says_it_is_done(tmp_path, capsys):
    config, run = job(tmp_path, steps=2), tmp_path / "run"
    assert train(capsys, config, run)[0] == 0
    before = stamps(run)
    code, err = train(capsys, config, run)
    assert code == 0
    assert err.splitlines() == [
        f"thrifty: run directory {run} is done: it holds a finished run of this config (2 "
        "steps, stopped by max_steps), so there is nothing to train; --overwrite starts it "
        "over, a larger budget (--steps) trains it further"
    ]
    assert stamps(run) == before


def test_a_finished_run_with_another_config_is_still_refused(tmp_path, capsys):
    config, run = job(tmp_path, steps=2), tmp_path / "run"
    assert train(capsys, config, run)[0] == 0
    before = stamps(run)
    code, err = train(capsys, config, run, "--set", "optimizer.lr=0.5")
    assert code == 2
    assert err.startswith(f"thrifty: error: run directory {run} holds a finished run")
    assert stamps(run) == before
    code, err = train(capsys, config, run, "--steps", "3")  # a larger budget: trained further
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


def test_fit_on_a_finished_run_raises_run_already_finished_with_its_summary(tmp_path):
    def fit() -> None:
        config = TrainConfig.from_dict(
            {
                "run": {"max_steps": 2, "out": str(tmp_path / "run"), "device": "cpu"},
                "batch": {"micro": 4},
            }
        )
        Trainer(tiny_gpt(), TokenDataset(n=16), config).fit()

    fit()
    with pytest.raises(RunAlreadyFinished) as caught:
        fit()
    done = caught.value
    assert isinstance(done, ThriftyError) and done.exit_code == 0
    assert done.run_dir == tmp_path / "run" and done.summary["steps"] == 2
    assert "--" not in str(done) and "RunConfig(overwrite=True)" in str(done)


def test_the_same_refusal_names_flags_on_the_command_line_and_arguments_in_python(tmp_path, capsys):
    config, run = job(tmp_path, steps=2), tmp_path / "run"
    assert train(capsys, config, run)[0] == 0
    code, err = train(capsys, config, run, "--set", "optimizer.lr=0.5")
    assert code == 2
    refused = f"run directory {run} holds a finished run (summary.json): "
    assert err.splitlines() == [
        f"thrifty: error: {refused}choose another --out, or start it over with --overwrite "
        "(run.overwrite = true), or give a larger budget to train it further"
    ]
    api = TrainConfig.from_dict(
        {
            "run": {"max_steps": 2, "out": str(run), "device": "cpu", "progress": "off"},
            "batch": {"micro": 4},
            "optimizer": {"lr": 0.5},
        }
    )
    with pytest.raises(ThriftyError) as caught:
        Trainer(tiny_gpt(), TokenDataset(n=16), api).fit()
    python = (
        f"{refused}give another run directory (RunConfig(out=...)), or start it over with "
        "RunConfig(overwrite=True), or give a larger budget to train it further"
    )
    assert str(caught.value) == python
    # One error, two wordings: what it carries is the keys, kept when it crosses processes.
    shipped = pickle.loads(pickle.dumps(caught.value))
    assert str(shipped) == python
    assert command_line_words(shipped) == err.splitlines()[0].removeprefix("thrifty: error: ")


def test_a_key_without_a_flag_is_named_by_set_on_the_command_line_and_its_key_in_python():
    error = ThriftyError(f"no GPU here: give {fix('run.device', 'cpu')}")
    assert str(error) == "no GPU here: give run.device = cpu"
    assert command_line_words(error) == "no GPU here: give --set run.device=cpu"
    done = RunAlreadyFinished(f"done; {fix('run.overwrite', True)} starts over", Path("r"), {})
    shipped = pickle.loads(pickle.dumps(done))
    assert str(shipped) == "done; RunConfig(overwrite=True) starts over"
    assert command_line_words(shipped) == "done; --overwrite starts over"
    assert shipped.run_dir == Path("r")
    with pytest.raises(KeyError, match="no wording for 'run.out' as 'somewhere'"):
        fix("run.out", phrase="somewhere")


def test_a_finished_run_of_several_processes_relaunched_exits_0_on_every_rank(tmp_path):
    config, run = job(tmp_path, steps=2), tmp_path / "run"
    command = [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(run)]
    command += ["--nprocs", "2"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    before = stamps(run)
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    said = [line for line in again.stderr.splitlines() if "is done" in line or "error" in line]
    assert said == [
        f"thrifty: run directory {run} is done: it holds a finished run of this config (2 "
        "steps, stopped by max_steps), so there is nothing to train; --overwrite starts it "
        "over, a larger budget (--steps) trains it further"
    ]
    assert stamps(run) == before
