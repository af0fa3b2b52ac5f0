"""A sweep's trials that fail: each is recorded with the run's own reason (a diverged run as
diverged, whatever its log's last line says), a sweep whose trials all failed exits 1 with one
line naming the failure, and a sweep stops starting trials once the same failure repeats.

Real trials, each a `thrifty train` process of a tiny model (tests/sweep_trust_task.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import optuna

import test_sweep
from sweep_trust_task import BUSY
from test_sweep import CONFIG, sweep_command

here = test_sweep.here  # the fixture

STEPS = 20


def inputs(tmp_path: Path, task: dict[str, str], space: str) -> tuple[Path, Path]:
    text = CONFIG.format(steps=STEPS)
    for key, value in task.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
    config, space_file = tmp_path / "base.toml", tmp_path / "space.toml"
    config.write_text(text)
    space_file.write_text(space)
    return config, space_file


def errors(out: Path) -> dict[int, str]:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "study.journal"))
    )
    study = optuna.load_study(study_name=out.name, storage=storage)
    return {t.number: t.user_attrs.get("thrifty.error") for t in study.get_trials()}


LR = '["optimizer.lr"]\nlow = 0.001\nhigh = 0.3\nlog = true\n'


def test_a_nan_trial_on_a_busy_machine_is_recorded_as_diverged_and_the_sweep_exits_1(
    tmp_path, here
):
    config, space = inputs(
        tmp_path,
        {"model": '"sweep_trust_task:busy_model"', "loss_fn": '"sweep_trust_task:nan_loss"'},
        LR,
    )
    out = tmp_path / "nan"
    code, stdout, stderr = here(sweep_command(config, space, out, "--trials", "1"))
    log = (out / "trials" / "0000" / "train.log").read_text()
    assert log.rstrip().splitlines()[-1] == BUSY  # the run's last line: the busy warning
    assert json.loads((out / "trials" / "0000" / "summary.json").read_text())["stop_reason"] == (
        "diverged"
    )
    assert errors(out) == {0: "the run diverged"}
    assert json.loads((out / "sweep.json").read_text())["trials"][0]["error"] == "the run diverged"
    assert "trial 0: failed (the run diverged)" in stderr
    assert code == 1
    last = stderr.strip().splitlines()[-1]
    assert last == (
        "thrifty: error: every trial failed (1 of 1, alike): the run diverged; no best and no "
        "best.toml: fix that, then run the same command"
    )
    assert stdout == "" and not (out / "best.toml").exists()


def test_a_space_value_that_breaks_the_shapes_stops_the_sweep_after_three_alike_and_exits_1(
    tmp_path, here
):
    config, space = inputs(
        tmp_path,
        {"model": '"sweep_trust_task:model"'},
        '["task.model_args.inputs"]\nchoices = [5, 7, 9, 11, 13, 17]\n',
    )
    text = config.read_text().replace("[task]\n", "[task]\nmodel_args = { inputs = 12 }\n")
    config.write_text(text)
    out = tmp_path / "shapes"
    code, stdout, stderr = here(sweep_command(config, space, out, "--trials", "8"))
    assert code == 1, stderr
    found = errors(out)
    assert sorted(found) == [0, 1, 2]  # three alike, then no trial started: 5 of 8 not spent
    assert all("shapes cannot be multiplied" in e for e in found.values()), found
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(
        "thrifty: error: every trial failed: 3 trials in a row failed alike, so no more were "
        "started: "
    ), last
    assert "shapes cannot be multiplied" in last and last.endswith(
        "; fix that, then run the same command"
    )
    assert "\n" not in last and "Traceback" not in stderr
    assert not (out / "best.toml").exists()
