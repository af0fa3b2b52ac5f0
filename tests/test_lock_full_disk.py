"""A run directory on a full disk: the lock says so in one line, not a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from thrifty.errors import ThriftyError
from thrifty.rundir.lock import RunLock


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 64 KiB tmpfs (mounting needs root), filled to the last byte; unmounted after."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    (disk / "run").mkdir()
    try:
        with open(disk / "filler", "wb") as f:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
    except OSError:
        pass
    yield disk
    if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_lock_on_a_full_disk_is_one_line_naming_the_disk_and_the_fix(full_disk):
    with pytest.raises(ThriftyError) as caught:
        RunLock(full_disk / "run").acquire()
    message = str(caught.value)
    assert "\n" not in message
    assert "No space left on device" in message and "free space on the disk" in message
