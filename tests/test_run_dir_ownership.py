"""`thrifty train --out DIR` never writes over or deletes what thrifty did not write: a folder
holding someone's files where a run would write is refused in one line naming them, with or
without --overwrite, and every byte of it is left as it was; a thrifty run (of this version or
an earlier one) is still resumed and started over."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from helpers import TokenDataset, tiny_gpt
from run_dir_helpers import job, snapshot, train
from thrifty import Trainer
from thrifty.checkpointing.store import CheckpointError, CheckpointManager
from thrifty.checkpointing.store.manifest import Manifest, step_dir
from thrifty.checkpointing.store.retention import purge
from thrifty.checkpointing.store.storage import LocalStorage
from thrifty.config import TrainConfig
from thrifty.errors import ThriftyError
from thrifty.rundir.files import read_metrics
from thrifty.rundir.own_files import CONFIG_HEADER, REPORT_MARK


def one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("thrifty: error: "), err
    return lines[0]


@pytest.fixture
def users_folder(tmp_path: Path) -> Path:
    """A folder of someone's work that happens to use the names a run writes."""
    folder = tmp_path / "mine"
    (folder / "checkpoints" / "step-00000010").mkdir(parents=True)
    (folder / "config.toml").write_text("[model]\nwidth = 512  # my settings\n")
    (folder / "report.html").write_text("<html><body>my notes on the experiment</body></html>")
    (folder / "checkpoints" / "step-00000010" / "weights.bin").write_bytes(b"\x00my weights")
    (folder / "checkpoints" / "mymodel.pt").write_bytes(b"\x01my model")
    return folder


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "with-overwrite"])
def test_a_folder_of_someone_elses_files_is_refused_and_left_byte_identical(
    tmp_path, capsys, users_folder, overwrite
):
    before = snapshot(users_folder)
    code, err = train(capsys, job(tmp_path), users_folder, *(["--overwrite"] if overwrite else []))
    assert code == 2
    line = one_error(err)
    # checkpoints/mymodel.pt is in the way only of --overwrite, which empties the folder.
    mine = "checkpoints/mymodel.pt, " if overwrite else ""
    why = (
        ": --overwrite replaces a thrifty run but never files thrifty did not write;"
        if overwrite
        else " and would write over:"
    )
    assert line == (
        f"thrifty: error: run directory {users_folder} holds config.toml, report.html, "
        f"{mine}checkpoints/step-00000010/, which thrifty did not write{why} move them away, "
        "or choose another --out"
    )
    assert snapshot(users_folder) == before


def test_a_folder_named_like_a_save_is_refused_on_its_own(tmp_path, capsys):
    folder = tmp_path / "run"
    (folder / "checkpoints" / "step-00000002").mkdir(parents=True)
    (folder / "checkpoints" / "step-00000002" / "notes.txt").write_text("mine")
    before = snapshot(folder)
    code, err = train(capsys, job(tmp_path), folder)
    assert code == 2
    assert "holds checkpoints/step-00000002/, which thrifty did not write" in one_error(err)
    assert snapshot(folder) == before


def test_overwrite_of_a_thrifty_run_refuses_a_file_it_did_not_write_in_checkpoints(
    tmp_path, capsys
):
    config, run = job(tmp_path), tmp_path / "run"
    assert train(capsys, config, run)[0] == 0
    (run / "checkpoints" / "mymodel.pt").write_bytes(b"\x01my model")
    before = snapshot(run)
    code, err = train(capsys, config, run, "--overwrite")
    assert code == 2
    assert one_error(err) == (
        f"thrifty: error: run directory {run} holds checkpoints/mymodel.pt, which thrifty did "
        "not write: --overwrite replaces a thrifty run but never files thrifty did not write; "
        "move it away, or choose another --out"
    )
    assert snapshot(run) == before


def test_overwrite_starts_an_earlier_thrifty_run_over_and_leaves_other_files_alone(
    tmp_path, capsys
):
    config, run = job(tmp_path), tmp_path / "run"
    assert train(capsys, config, run, "--steps", "2")[0] == 0
    assert (run / "config.toml").read_text().startswith(CONFIG_HEADER)
    assert REPORT_MARK in (run / "report.html").read_text()
    (run / "train.log").write_text("the output of the first attempt\n")  # a shell's redirect
    code, err = train(capsys, config, run, "--overwrite")
    assert code == 0, err
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r] == [1, 2, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000003"]
    assert (run / "train.log").read_text() == "the output of the first attempt\n"


def test_a_run_written_before_the_marks_existed_is_still_thrifty_s(tmp_path, capsys):
    config, run = job(tmp_path), tmp_path / "run"
    assert train(capsys, config, run, "--steps", "2")[0] == 0
    # As the previous version wrote them: no header line, no generator mark.
    text = (run / "config.toml").read_text()
    (run / "config.toml").write_text(text.split("\n", 1)[1])
    (run / "report.html").write_text((run / "report.html").read_text().replace(REPORT_MARK, ""))
    code, err = train(capsys, config, run, "--overwrite")
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["steps"] == 3


def test_a_thrifty_config_copied_alone_into_a_folder_is_the_users_config(tmp_path, capsys):
    config, run = job(tmp_path), tmp_path / "run"
    assert train(capsys, config, run, "--steps", "1")[0] == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.toml").write_bytes((run / "config.toml").read_bytes())
    before = snapshot(mine)
    code, err = train(capsys, mine / "config.toml", mine)
    assert code == 2 and "holds config.toml, which thrifty did not write" in one_error(err)
    assert snapshot(mine) == before


def test_the_python_api_names_its_own_way_out(tmp_path, users_folder):
    config = TrainConfig.from_dict(
        {
            "run": {"max_steps": 1, "out": str(users_folder), "device": "cpu", "progress": "off"},
            "batch": {"micro": 4},
        }
    )
    with pytest.raises(ThriftyError) as caught:
        Trainer(tiny_gpt(), TokenDataset(n=8), config).fit()
    message = str(caught.value)
    assert "holds config.toml" in message and "RunConfig(out=...)" in message
    assert "--" not in message


def _publish(storage: LocalStorage, step: int) -> None:
    folder = Path(storage.path(step_dir(step)))
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_bytes(Manifest(step, (), "2024-01-01T00:00:00Z").to_json())


def test_retention_never_deletes_a_folder_named_like_a_save_that_holds_other_files(tmp_path):
    storage = LocalStorage(str(tmp_path))
    for step in (1, 5):
        _publish(storage, step)
    theirs, killed = tmp_path / step_dir(2), tmp_path / step_dir(3)
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    killed.mkdir()
    (killed / "state.pt.tmp").write_bytes(b"half a save")
    published = {1: None, 5: None}
    purge(storage, published, keep={5}, orphans=[2, 3])
    assert (theirs / "notes.txt").read_text() == "mine"
    assert not killed.exists() and not (tmp_path / step_dir(1)).exists()


def test_a_save_never_writes_into_a_folder_named_like_it_that_holds_someone_elses_files(
    tmp_path,
):
    theirs = tmp_path / step_dir(3)
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with CheckpointManager(str(tmp_path), keep_last=2) as manager:
        manager.save(2, {"w": torch.zeros(2)})
        manager.save(3, {"w": torch.ones(2)})
        with pytest.raises(CheckpointError, match=r"step-00000003 holds notes.txt, which thrifty"):
            manager.wait()
        for step in (4, 5):  # later saves, and the retention after them, leave it be
            manager.save(step, {"w": torch.ones(2)})
    assert sorted(os.listdir(theirs)) == ["notes.txt"]
    assert (theirs / "notes.txt").read_text() == "mine"


def test_retention_keeps_a_published_save_someone_put_a_file_into(tmp_path, caplog):
    storage = LocalStorage(str(tmp_path))
    for step in (1, 2, 5):
        _publish(storage, step)
    (tmp_path / step_dir(1) / "eval.txt").write_text("my evaluation of step 1")
    published = {1: None, 2: None, 5: None}
    with caplog.at_level("WARNING", logger="thrifty"):
        purge(storage, published, keep={5}, orphans=[])
        purge(storage, {1: None, 5: None}, keep={5}, orphans=[])  # the next save's: said once
    assert (tmp_path / step_dir(1) / "eval.txt").read_text() == "my evaluation of step 1"
    assert (tmp_path / step_dir(1) / "manifest.json").is_file()  # kept whole, still a save
    assert not (tmp_path / step_dir(2)).exists()
    said = [r.getMessage() for r in caplog.records if "eval.txt" in r.getMessage()]
    assert len(said) == 1 and "which thrifty did not write" in said[0]


def test_a_tensorboard_folder_of_someone_elses_is_refused_where_a_run_would_start_it_over(
    tmp_path, capsys
):
    folder = tmp_path / "mine"
    (folder / "tensorboard").mkdir(parents=True)
    (folder / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"my other runs")
    before = snapshot(folder)
    config = job(tmp_path)
    code, err = train(capsys, config, folder, "--set", "log.tensorboard=true")
    assert code == 2
    assert one_error(err) == (
        f"thrifty: error: run directory {folder} holds tensorboard/, which thrifty did not "
        f"write and would write over: move it away, or choose another --out"
    )
    assert snapshot(folder) == before
    # Off, the folder is not thrifty's to touch: the run goes ahead beside it.
    assert train(capsys, config, folder)[0] == 0
    assert (folder / "tensorboard" / "events.out.tfevents.1.host").read_bytes() == b"my other runs"
