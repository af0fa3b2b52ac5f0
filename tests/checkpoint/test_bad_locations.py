"""A full disk during a save, and locations that cannot hold checkpoints, on real file systems:
one line naming the place and the fix, nothing half-written left behind, older checkpoints kept.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from checkpoint.s3_server import BUCKET, options
from thrifty.checkpointing.saving.saves import make_manager
from thrifty.checkpointing.store import CheckpointError, CheckpointManager
from thrifty.config import CheckpointConfig

MiB = 1 << 20


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.tmp"))


def test_a_full_disk_says_how_much_was_needed_leaves_no_tmp_and_keeps_older_checkpoints(
    tmpfs, make_state, check_state
):
    disk = tmpfs(1 * MiB)
    manager = CheckpointManager(str(disk), keep_last=2)
    for step in (1, 2):
        manager.save(step, make_state(step, size=20_000))  # 160 kB each
    assert manager.wait(timeout=30)
    manager.save(3, make_state(3, size=100_000))  # 800 kB: more than is left
    with pytest.raises(CheckpointError) as excinfo:
        manager.wait(timeout=30)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"no space left on the disk holding {disk / 'step-00000003'} (")
    assert "needs 0.8 MB" in message and "lower checkpoint.keep_last" in message
    assert leftovers(disk) == [] and not (disk / "step-00000003").exists()
    assert manager.latest().step == 2
    check_state(manager.load(str(disk / "step-00000001")), 1)
    manager.save(4, make_state(4, size=20_000))  # what fits still saves
    manager.close()
    assert sorted(os.listdir(disk)) == ["step-00000002", "step-00000004"]


def test_a_full_disk_during_thrifty_train_exits_2_with_one_line(tmp_path, tmpfs, capsys):
    from thrifty.cli import main

    config = tmp_path / "job.toml"
    config.write_text(
        JOB.format(location=tmp_path / "measure", every=2, steps=2)  # one checkpoint's size
    )
    assert main(["train", str(config), "--out", str(tmp_path / "measure-run")]) == 0
    [size] = [p.stat().st_size for p in (tmp_path / "measure").rglob("state.pt")]
    disk = tmpfs(int(2.5 * size) + 64 * 1024)  # two checkpoints fit, a third does not
    config.write_text(JOB.format(location=disk, every=2, steps=12))
    capsys.readouterr()

    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"thrifty: error: no space left on the disk holding {disk}/step-")
    assert "(needs " in line and " MB" in line
    assert leftovers(disk) == []
    steps = sorted(os.listdir(disk))
    assert len(steps) == 2  # the two before the full disk, intact
    latest = CheckpointManager(str(disk)).latest()
    assert latest is not None and latest.path == str(disk / steps[-1])


JOB = """
[run]
max_steps = {steps}
log_every = 1
progress = "off"
[batch]
micro = 4
[data]
num_workers = 0
[schedule]
decay = "constant"
[checkpoint]
location = "{location}"
every = {every}
[spot]
provider = "none"
[task]
model = "thrifty.demo:build_model"
train_data = "thrifty.demo:train_dataset"
model_args = {{ n_layer = 1, n_head = 2, n_embd = 32, block_size = 16 }}
data_args = {{ block_size = 16, max_bytes = 20000 }}
"""


# --- the location is probed before training --------------------------------------------------


def test_a_read_only_directory_fails_the_probe_naming_it_and_the_fix(tmpfs):
    read_only = tmpfs(MiB, read_only=True)
    manager = CheckpointManager(str(read_only / "ckpt"))
    with pytest.raises(CheckpointError) as excinfo:
        manager.probe()
    assert str(excinfo.value) == (
        f"checkpoint.location {read_only / 'ckpt'} is not writable (Read-only file system): "
        "fix its permissions or choose another checkpoint.location"
    )


def test_a_location_that_is_a_file_fails_the_probe(tmp_path):
    taken = tmp_path / "checkpoints"
    taken.write_text("not a folder")
    for location in (taken, taken / "inside"):
        with pytest.raises(CheckpointError) as excinfo:
            CheckpointManager(str(location)).probe()
        assert str(excinfo.value) == (
            f"checkpoint.location {location} cannot be a directory: {taken} is a file: "
            "choose another checkpoint.location or move the file"
        )
    assert taken.read_text() == "not a folder"


def test_a_staging_directory_that_is_a_file_is_named_as_local_dir(tmp_path):
    (tmp_path / "staging").write_text("")
    manager = CheckpointManager("memory://thrifty-tests/probe", local_dir=str(tmp_path / "staging"))
    with pytest.raises(CheckpointError, match=r"^checkpoint\.local_dir .* is a file"):
        manager.probe()


def test_the_probe_leaves_nothing_behind(tmp_path):
    CheckpointManager(str(tmp_path / "ckpt")).probe()
    assert os.listdir(tmp_path / "ckpt") == []


def test_the_guard_probes_a_missing_bucket_before_any_step(s3, tmp_path):
    config = CheckpointConfig(
        location="s3://no-such-bucket/run",
        local_dir=str(tmp_path / "staging"),
        storage_options=options(s3.endpoint),
    )
    store = make_manager(config, tmp_path / "run")
    with pytest.raises(CheckpointError) as excinfo:
        store.probe()
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("s3://no-such-bucket/run/")
    assert "does not exist" in message and "create the bucket" in message
    make_manager(
        CheckpointConfig(
            location=f"s3://{BUCKET}/probed",
            local_dir=str(tmp_path / "staging"),
            storage_options=options(s3.endpoint),
        ),
        tmp_path / "run",
    ).probe()


def test_thrifty_train_fails_on_a_bad_location_before_step_1(tmp_path, capsys):
    """Passes once the Trainer probes the location right after building its checkpoint store."""
    from thrifty.cli import main

    taken = tmp_path / "taken"
    taken.write_text("")
    config = tmp_path / "job.toml"
    config.write_text(JOB.format(location=taken, every=2, steps=4))
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"thrifty: error: checkpoint.location {taken} cannot be a directory: {taken} is a file: "
        "choose another checkpoint.location or move the file"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
