"""Saving to a local directory: atomic publish, the host copy, retention, corrupt checkpoints."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest
import torch

import thrifty.checkpointing.store.writing as writing_module
from thrifty.checkpointing.store import (
    CheckpointError,
    CheckpointManager,
    CorruptCheckpointError,
    checkpoints_to_keep,
)
from thrifty.errors import ConfigError


def steps_on_disk(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("step-"))


def test_save_then_latest_and_load_return_the_same_state(tmp_path, make_state, check_state):
    with CheckpointManager(str(tmp_path)) as manager:
        manager.save(7, make_state(7), metric=0.5)
        assert manager.wait(timeout=30)
        info = manager.latest()
        assert info is not None
        assert (info.step, info.metric, info.path) == (7, 0.5, str(tmp_path / "step-00000007"))
        check_state(manager.load(info), 7)
        check_state(manager.load(str(tmp_path / "step-00000007")), 7)
        check_state(manager.load(str(tmp_path / "step-00000007" / "manifest.json")), 7)


def test_a_checkpoint_is_a_folder_of_files_and_a_manifest_listing_their_sizes_and_sha256(
    tmp_path, make_state
):
    with CheckpointManager(str(tmp_path)) as manager:
        manager.save(120, make_state(120), metric=1.25)
    folder = tmp_path / "step-00000120"
    assert sorted(os.listdir(folder)) == ["manifest.json", "state.pt"]
    doc = json.loads((folder / "manifest.json").read_text())
    assert doc["step"] == 120 and doc["metric"] == 1.25
    assert doc["torch_version"] == torch.__version__ and doc["thrifty_version"]
    assert doc["created"].endswith("Z")
    [entry] = doc["files"]
    assert entry["name"] == "state.pt"
    assert entry["size"] == (folder / "state.pt").stat().st_size
    assert len(entry["sha256"]) == 64


def test_save_copies_the_state_so_training_can_change_it_right_after(tmp_path, make_state):
    state = make_state(1, size=200_000)
    with CheckpointManager(str(tmp_path)) as manager:
        manager.save(1, state)
        state["model"]["w"].add_(100.0)  # the optimizer step that follows save()
        assert manager.wait(timeout=30)
        loaded = manager.load(manager.latest())
    assert torch.equal(loaded["model"]["w"], torch.full((200_000,), 1.0))
    assert manager.last_stall_seconds > 0 and manager.last_save_seconds > 0


def test_the_manifest_is_written_last_so_a_save_that_dies_before_it_is_never_trusted(
    tmp_path, make_state, check_state, monkeypatch
):
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, make_state(1))
    manager.wait(timeout=30)

    def die(path: str, data: bytes) -> None:
        raise OSError(errno.EIO, "the machine went away")

    monkeypatch.setattr(writing_module, "atomic_write_bytes", die)
    manager.save(2, make_state(2))
    with pytest.raises(CheckpointError, match="step-00000002"):
        manager.wait(timeout=30)
    assert not (tmp_path / "step-00000002").exists()  # a failed save leaves no partial folder
    info = manager.latest()
    assert info is not None and info.step == 1
    check_state(manager.load(info), 1)


def test_save_and_purge_keeps_the_last_k_checkpoints(tmp_path, make_state):
    with CheckpointManager(str(tmp_path), keep_last=3) as manager:
        for step in range(1, 7):
            manager.save(step, make_state(step))
            manager.wait(timeout=30)
            assert len(steps_on_disk(tmp_path)) == min(step, 3)
    assert steps_on_disk(tmp_path) == ["step-00000004", "step-00000005", "step-00000006"]


def test_keep_best_also_keeps_the_checkpoint_with_the_lowest_metric(tmp_path, make_state):
    metrics = {1: 3.0, 2: 1.0, 3: 2.0, 4: 5.0, 5: 4.0}
    with CheckpointManager(str(tmp_path), keep_last=2, keep_best=True) as manager:
        for step, metric in metrics.items():
            manager.save(step, make_state(step), metric=metric)
    assert steps_on_disk(tmp_path) == ["step-00000002", "step-00000004", "step-00000005"]


def test_retention_never_drops_the_newest_checkpoints():
    published = {1: 0.1, 2: None, 3: 9.0}
    assert checkpoints_to_keep(published, keep_last=2, keep_best=False) == {2, 3}
    assert checkpoints_to_keep(published, keep_last=2, keep_best=True) == {1, 2, 3}
    assert checkpoints_to_keep({5: 1.0, 6: 1.0, 7: 2.0, 8: 2.0}, keep_last=2, keep_best=True) == {
        6,
        7,
        8,
    }


def test_an_old_checkpoint_is_deleted_only_after_a_newer_one_is_published(
    tmp_path, make_state, monkeypatch
):
    manager = CheckpointManager(str(tmp_path), keep_last=2)
    for step in (1, 2):
        manager.save(step, make_state(step))
    manager.wait(timeout=30)
    monkeypatch.setattr(writing_module.torch, "save", _fail_with(errno.EIO))
    manager.save(3, make_state(3))
    with pytest.raises(CheckpointError):
        manager.wait(timeout=30)
    assert steps_on_disk(tmp_path) == ["step-00000001", "step-00000002"]
    assert manager.latest().step == 2


def test_purge_deletes_the_manifest_first_so_a_half_deleted_checkpoint_is_never_trusted(
    tmp_path, make_state, monkeypatch
):
    manager = CheckpointManager(str(tmp_path), keep_last=2)
    for step in (1, 2):
        manager.save(step, make_state(step))
    manager.wait(timeout=30)
    deleted: list[str] = []
    real_delete = manager._local.delete

    def delete_manifest_then_die(rel: str) -> None:
        deleted.append(rel)
        if not rel.endswith("manifest.json"):
            raise CheckpointError("killed mid-purge")
        real_delete(rel)

    monkeypatch.setattr(manager._local, "delete", delete_manifest_then_die)
    manager.save(3, make_state(3))
    with pytest.raises(CheckpointError, match="mid-purge"):
        manager.wait(timeout=30)
    assert "step-00000001/manifest.json" in deleted
    assert (tmp_path / "step-00000001" / "state.pt").exists()
    monkeypatch.undo()
    assert [manager.latest().step] == [3]
    assert not (tmp_path / "step-00000001" / "manifest.json").exists()


def test_a_byte_flipped_checkpoint_is_skipped_with_a_warning_naming_it(
    tmp_path, make_state, check_state, caplog
):
    with CheckpointManager(str(tmp_path)) as manager:
        manager.save(1, make_state(1))
        manager.save(2, make_state(2))
    path = tmp_path / "step-00000002" / "state.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="thrifty.checkpointing.store"):
        info = manager.latest()
    assert info is not None and info.step == 1
    check_state(manager.load(info), 1)
    assert "step-00000002" in caplog.text and "sha256" in caplog.text
    with pytest.raises(CorruptCheckpointError, match=r"step-00000002/state\.pt.*sha256"):
        manager.load(str(tmp_path / "step-00000002"))


def test_a_truncated_checkpoint_is_skipped_and_loading_it_names_the_file(
    tmp_path, make_state, caplog
):
    with CheckpointManager(str(tmp_path)) as manager:
        manager.save(1, make_state(1))
        manager.save(2, make_state(2))
    path = tmp_path / "step-00000002" / "state.pt"
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 3)
    with caplog.at_level(logging.WARNING, logger="thrifty.checkpointing.store"):
        assert manager.latest().step == 1
    assert "step-00000002" in caplog.text and "truncated" in caplog.text
    with pytest.raises(CorruptCheckpointError, match=f"is {size // 3} bytes but its manifest"):
        manager.load(str(tmp_path / "step-00000002"))


def test_a_garbled_manifest_is_skipped_with_a_warning(tmp_path, make_state, caplog):
    with CheckpointManager(str(tmp_path)) as manager:
        manager.save(1, make_state(1))
        manager.save(2, make_state(2))
    (tmp_path / "step-00000002" / "manifest.json").write_text('{"format": "thrifty-checkpoint"')
    with caplog.at_level(logging.WARNING, logger="thrifty.checkpointing.store"):
        assert manager.latest().step == 1
    assert "step-00000002" in caplog.text


def test_latest_is_none_for_an_empty_or_missing_directory(tmp_path):
    assert CheckpointManager(str(tmp_path / "nothing-yet")).latest() is None


def test_a_folder_without_a_manifest_is_not_a_checkpoint(tmp_path):
    (tmp_path / "step-00000001").mkdir()
    torch.save({"w": torch.ones(2)}, tmp_path / "step-00000001" / "state.pt")
    manager = CheckpointManager(str(tmp_path))
    assert manager.latest() is None
    with pytest.raises(CheckpointError, match="not a thrifty checkpoint"):
        manager.load(str(tmp_path / "step-00000001"))


def test_keep_last_below_two_is_refused_with_the_field_name(tmp_path):
    with pytest.raises(ConfigError, match="checkpoint.keep_last must be an integer of at least 2"):
        CheckpointManager(str(tmp_path), keep_last=1)


def test_a_url_location_needs_a_local_staging_directory():
    with pytest.raises(ConfigError, match="checkpoint.local_dir is required"):
        CheckpointManager("memory://bucket/run")


def test_a_value_that_is_not_a_tensor_or_plain_is_refused_naming_where_it_is(tmp_path):
    import numpy as np

    with CheckpointManager(str(tmp_path)) as manager:
        with pytest.raises(CheckpointError, match=r"state\['rng'\]\['numpy'\] is a numpy.ndarray"):
            manager.save(1, {"rng": {"numpy": np.zeros(3)}})


def test_a_full_disk_gives_one_line_naming_the_directory_and_the_fix(
    tmp_path, make_state, monkeypatch
):
    manager = CheckpointManager(str(tmp_path))
    monkeypatch.setattr(writing_module.torch, "save", _fail_with(errno.ENOSPC))
    manager.save(1, make_state(1))
    with pytest.raises(CheckpointError) as excinfo:
        manager.wait(timeout=30)
    message = str(excinfo.value)
    assert "\n" not in message
    assert str(tmp_path) in message and "no space left" in message and "keep_last" in message
    assert not (tmp_path / "step-00000001" / "state.pt.tmp").exists()


def test_a_failed_save_of_a_step_saved_before_keeps_the_published_copy(
    tmp_path, make_state, monkeypatch
):
    """A resumed run saves the step it resumed from again (its final save): a full disk then
    must not cost the checkpoint it resumed from."""
    with CheckpointManager(str(tmp_path)) as manager:
        manager.save(6, make_state(6))
    monkeypatch.setattr(writing_module.torch, "save", _fail_with(errno.ENOSPC))
    manager = CheckpointManager(str(tmp_path))
    manager.save(6, make_state(7))
    with pytest.raises(CheckpointError, match="no space left"):
        manager.wait(timeout=30)
    monkeypatch.undo()
    info = manager.latest()
    assert info is not None and info.step == 6
    assert manager.load(info)["step"] == 6
    assert sorted(os.listdir(tmp_path / "step-00000006")) == ["manifest.json", "state.pt"]


def test_a_background_error_surfaces_on_the_next_save(tmp_path, make_state, monkeypatch):
    manager = CheckpointManager(str(tmp_path))
    monkeypatch.setattr(writing_module.torch, "save", _fail_with(errno.EACCES))
    manager.save(1, make_state(1))
    with pytest.raises(CheckpointError, match="not writable"):
        manager.save(2, make_state(2))
    monkeypatch.undo()
    manager.save(3, make_state(3))
    manager.close()
    assert manager.latest().step == 3


def test_wait_with_a_deadline_returns_false_while_a_save_is_in_flight(
    tmp_path, make_state, monkeypatch
):
    import threading

    release = threading.Event()
    real_save = torch.save

    def slow_save(*args, **kwargs):
        release.wait(10)
        real_save(*args, **kwargs)

    monkeypatch.setattr(writing_module.torch, "save", slow_save)
    manager = CheckpointManager(str(tmp_path))
    manager.save(1, make_state(1))
    assert manager.wait(timeout=0.05) is False
    release.set()
    assert manager.wait(timeout=30) is True
    assert manager.close() is True


def _fail_with(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    return fail


def test_load_rechecks_a_checkpoint_that_changed_after_latest_found_it(tmp_path, make_state):
    with CheckpointManager(str(tmp_path)) as manager:
        manager.save(1, make_state(1))
    info = manager.latest()
    path = tmp_path / "step-00000001" / "state.pt"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="no longer matches its manifest"):
        manager.load(info)
