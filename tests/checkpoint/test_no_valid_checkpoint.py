"""Checkpoints that all fail verification are not "nothing to resume": thrifty refuses in one
line naming the location, what failed and the choices, and never deletes or overwrites them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import fsspec
import pytest

from thrifty.checkpointing.saving.saves import make_manager, resume_point
from thrifty.checkpointing.store import CheckpointManager, NoValidCheckpointError
from thrifty.config import CheckpointConfig


def fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def damage_every_checkpoint(folder: Path) -> None:
    """Flip a byte in the newest state file, garble the older manifests."""
    [newest, *older] = sorted(folder.glob("step-*"), reverse=True)
    flip_a_byte(newest / "state.pt")
    for step in older:
        (step / "manifest.json").write_text('{"format": "thrifty-checkpoint"')


def test_latest_refuses_when_checkpoints_exist_but_none_verifies(tmp_path, make_state):
    with CheckpointManager(str(tmp_path)) as manager:
        for step in (10, 20):
            manager.save(step, make_state(step))
    damage_every_checkpoint(tmp_path)
    before = fingerprint(tmp_path)
    with pytest.raises(NoValidCheckpointError) as excinfo:
        manager.latest()
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"no valid checkpoint at {tmp_path}: 2 fail verification")
    assert str(tmp_path / "step-00000020" / "state.pt") in message and "sha256" in message
    assert "--resume PATH" in message and "--overwrite" in message
    assert manager.has_checkpoints()
    assert fingerprint(tmp_path) == before


def test_no_checkpoint_at_all_is_still_none(tmp_path):
    (tmp_path / "step-00000001").mkdir()  # a first save killed before its manifest
    manager = CheckpointManager(str(tmp_path))
    assert manager.latest() is None and not manager.has_checkpoints()


def test_a_damaged_remote_with_an_empty_staging_folder_is_refused_and_left_alone(
    tmp_path, make_state
):
    url = "memory://thrifty-tests/no-valid-remote"
    with CheckpointManager(url, local_dir=str(tmp_path / "a")) as manager:
        manager.save(5, make_state(5))
    fs = fsspec.filesystem("memory")
    state = f"{url}/step-00000005/state.pt"
    fs.pipe_file(state, fs.cat_file(state)[:-100])  # truncated in the bucket
    damaged = fs.cat_file(state)
    fresh = CheckpointManager(url, local_dir=str(tmp_path / "b"))
    try:
        with pytest.raises(
            NoValidCheckpointError, match=f"^no valid checkpoint at {url}: the only one fails"
        ):
            fresh.latest()
        assert fs.cat_file(state) == damaged and fs.exists(f"{url}/step-00000005/manifest.json")
    finally:
        fs.rm(url, recursive=True)


def test_resume_never_counts_damaged_checkpoints_as_checkpoints(tmp_path, make_state):
    checkpoints = tmp_path / "run" / "checkpoints"
    with CheckpointManager(str(checkpoints)) as manager:
        manager.save(3, make_state(3))
    (checkpoints / "step-00000003" / "manifest.json").write_text("garbled")
    store = make_manager(CheckpointConfig(resume="never"), tmp_path / "run")
    assert store.has_checkpoints()  # so a fresh start there is refused, not written over
    auto = CheckpointConfig()
    with pytest.raises(NoValidCheckpointError, match="step-00000003/manifest.json is not a valid"):
        resume_point(auto, make_manager(auto, tmp_path / "run"))


JOB = """
[run]
max_steps = 4
log_every = 1
progress = "off"
[batch]
micro = 4
[data]
num_workers = 0
[schedule]
decay = "constant"
[checkpoint]
every = 2
[spot]
provider = "none"
[task]
model = "thrifty.demo:build_model"
train_data = "thrifty.demo:train_dataset"
model_args = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 16 }
data_args = { block_size = 16, max_bytes = 20000 }
"""


def test_thrifty_train_refuses_a_run_whose_every_checkpoint_is_damaged_and_changes_nothing(
    tmp_path, capsys
):
    from thrifty.cli import main

    config = tmp_path / "job.toml"
    config.write_text(JOB)
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out)]) == 0
    (out / "summary.json").unlink()  # as if the machine had been taken away at the end
    checkpoints = out / "checkpoints"
    assert [p.name for p in sorted(checkpoints.glob("step-*"))] == [
        "step-00000002",
        "step-00000004",
    ]
    damage_every_checkpoint(checkpoints)
    before = fingerprint(out)
    capsys.readouterr()

    assert main(["train", str(config), "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"thrifty: error: no valid checkpoint at {checkpoints}: 2 fail")
    assert "--resume PATH" in line and "--overwrite" in line
    assert fingerprint(out) == before  # nothing deleted, overwritten or restarted
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4
