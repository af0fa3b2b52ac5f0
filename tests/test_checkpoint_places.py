"""Where a run's saves are: never given to two runs at once, never outranked by an earlier
run's, never left behind by a relaunch that names another place; and each save's step is in
metrics.jsonl before the next step starts."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers import TokenDataset, tiny_gpt
from run_dir_helpers import job, snapshot, train
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.rundir.files import read_metrics
from thrifty.rundir.lock import RunLock


def one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("thrifty: error: "), err
    return lines[0].removeprefix("thrifty: error: ")


def saved(folder: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in folder.glob("step-*/manifest.json"))


def unfinished(run: Path) -> None:
    """The run as a kill after its last save leaves it: no summary.json."""
    (run / "summary.json").unlink()


def saving(*more: str) -> tuple[str, ...]:
    return ("--set", "checkpoint.every=2", *more)


def test_overwrite_refuses_a_location_that_holds_an_earlier_runs_saves(tmp_path, capsys):
    config, run, place = job(tmp_path, steps=4), tmp_path / "run", tmp_path / "place"
    at_place = ("--set", f"checkpoint.location={place}")
    assert train(capsys, config, run, *saving(*at_place))[0] == 0
    before = snapshot(place)
    assert saved(place) == [2, 4]
    code, err = train(capsys, config, run, "--steps", "2", "--overwrite", *saving(*at_place))
    assert code == 2
    assert one_error(err) == (
        f"checkpoint.location {place} holds checkpoints of an earlier run, which --overwrite "
        "does not delete and the new run would resume in place of its own: delete them, or "
        "choose another checkpoint.location"
    )
    assert snapshot(place) == before  # nothing deleted, nothing written
    # Emptied by hand, the place takes the new run, whose saves are then the newest there.
    for step in saved(place):
        for f in (place / f"step-{step:08d}").iterdir():
            f.unlink()
        (place / f"step-{step:08d}").rmdir()
    assert train(capsys, config, run, "--steps", "2", "--overwrite", *saving(*at_place))[0] == 0
    assert saved(place) == [2]


def test_overwrite_still_empties_the_runs_own_checkpoints(tmp_path, capsys):
    config, run = job(tmp_path, steps=4), tmp_path / "run"
    assert train(capsys, config, run, *saving())[0] == 0
    assert train(capsys, config, run, "--steps", "2", "--overwrite", *saving())[0] == 0
    assert saved(run / "checkpoints") == [2]


def test_a_relaunch_naming_another_location_is_refused_not_started_over(tmp_path, capsys):
    config, run = job(tmp_path, steps=4), tmp_path / "run"
    assert train(capsys, config, run, *saving())[0] == 0
    unfinished(run)
    metrics = (run / "metrics.jsonl").read_bytes()
    elsewhere = tmp_path / "elsewhere"
    code, err = train(capsys, config, run, *saving("--set", f"checkpoint.location={elsewhere}"))
    assert code == 2
    own = run / "checkpoints"
    assert one_error(err) == (
        f"run directory {run} holds an unfinished run that saved its checkpoints to {own}, not "
        f"to {elsewhere}: give checkpoint.location = {str(own)!r} to resume it, or start it "
        "over with --overwrite"
    )
    assert (run / "metrics.jsonl").read_bytes() == metrics  # its records are kept
    assert saved(own) == [2, 4]


def test_a_relaunch_that_forgets_its_location_is_refused_and_the_right_one_resumes(
    tmp_path, capsys
):
    config, run, place = job(tmp_path, steps=4), tmp_path / "run", tmp_path / "place"
    at_place = ("--set", f"checkpoint.location={place}")
    assert train(capsys, config, run, *saving(*at_place))[0] == 0
    unfinished(run)
    code, err = train(capsys, config, run, *saving())
    assert code == 2
    assert f"saved its checkpoints to {place}, not to {run / 'checkpoints'}" in one_error(err)
    code, err = train(capsys, config, run, "--steps", "6", *saving(*at_place))
    assert code == 0, err
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6]  # resumed at 4, not started over


def test_a_run_directorys_checkpoints_are_not_another_runs_location_while_it_runs(tmp_path, capsys):
    first = tmp_path / "first"
    with RunLock(first, saves=first / "checkpoints"):  # `first` training now
        code, err = train(
            capsys,
            job(tmp_path),
            tmp_path / "second",
            "--set",
            f"checkpoint.location={first / 'checkpoints'}",
        )
    assert code == 2
    assert one_error(err).startswith(
        f"checkpoint location {first / 'checkpoints'} is in use by pid "
    )
    assert one_error(err).endswith("wait for it to end, or use another checkpoint.location")


def test_two_runs_never_stage_a_urls_saves_in_one_local_dir(tmp_path, capsys):
    staging = tmp_path / "staging"
    with RunLock(tmp_path / "first", "memory://bucket/first", saves=staging):
        code, err = train(
            capsys,
            job(tmp_path),
            tmp_path / "second",
            "--set",
            "checkpoint.location=memory://bucket/second",
            "--set",
            f"checkpoint.local_dir={staging}",
        )
    assert code == 2
    assert one_error(err).startswith(f"checkpoint folder {staging} is in use by pid ")
    assert one_error(err).endswith("or use another checkpoint.local_dir")


def test_a_run_that_never_saves_leaves_no_checkpoints_folder(tmp_path, capsys):
    run = tmp_path / "run"
    assert train(capsys, job(tmp_path), run, "--set", "checkpoint.final=false")[0] == 0
    assert not (run / "checkpoints").exists()  # its lock took the folder, and gave it back


class Watching(TokenDataset):
    """Reads the steps in the run's metrics.jsonl each time a sample is fetched."""

    def __init__(self, metrics: Path) -> None:
        super().__init__(n=64, block=16)
        self.metrics, self.seen = metrics, set()

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.metrics.exists():
            lines = self.metrics.read_text().splitlines()
            self.seen |= {r["step"] for r in map(json.loads, lines) if "loss" in r}
        return super().__getitem__(i)


def test_a_saved_steps_record_is_on_disk_before_the_next_step(tmp_path):
    run = tmp_path / "run"
    data = Watching(run / "metrics.jsonl")
    config = TrainConfig.from_dict(
        {
            "run": {"out": str(run), "max_steps": 5, "log_every": 100, "progress": "off"},
            "batch": {"micro": 4},
            "data": {"num_workers": 0},
            "checkpoint": {"every": 3},
            "spot": {"provider": "none"},
        }
    )
    Trainer(tiny_gpt(n_layer=1), data, config=config).fit()
    # Read while steps 4 and 5 fetched their data: a SIGKILL then loses no saved step's record.
    assert data.seen == {1, 2, 3}
    assert saved(run / "checkpoints") == [3, 5]
