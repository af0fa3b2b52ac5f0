"""A SIGKILL at any moment (mid-save, mid-upload, mid-purge) never makes resume pick a bad one."""

from __future__ import annotations

import logging
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thrifty.checkpointing.store import CheckpointManager

WORKER = str(Path(__file__).with_name("save_forever.py"))
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")


def run_and_kill(args: list[str], delay: float, log_path: Path) -> None:
    """Start the saving child, let it save for `delay` more seconds, then SIGKILL it."""
    with open(log_path, "a") as log:
        child = subprocess.Popen(
            [sys.executable, WORKER, *args], stdout=subprocess.PIPE, stderr=log, text=True
        )
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready and child.stdout.readline().strip() == "ready", log_path.read_text()
        time.sleep(delay)
        assert child.poll() is None, log_path.read_text()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()


def kill_repeatedly(tmp_path, args, check_state, kills: int, *, expect_no_warnings: bool, caplog):
    rng = random.Random(1234)
    reached = []
    for _ in range(kills):
        run_and_kill(args, rng.uniform(0.2, 0.8), tmp_path / "child.log")
        # The "new process" that resumes: it must land on a complete checkpoint.
        location, *local = args
        resume_dir = str(tmp_path / f"resume-{len(reached)}") if local else None
        with caplog.at_level(logging.WARNING, logger="thrifty.checkpointing.store"):
            manager = CheckpointManager(location, local_dir=resume_dir or None)
            info = manager.latest()
        assert info is not None and info.step > max(reached, default=0)
        check_state(manager.load(info), info.step)
        reached.append(info.step)
    if expect_no_warnings:
        assert "skipping" not in caplog.text
    return reached


def test_sigkill_at_random_moments_of_local_saves_and_purges_never_breaks_resume(
    tmp_path, check_state, caplog
):
    location = str(tmp_path / "ckpt")
    kill_repeatedly(
        tmp_path, [location], check_state, kills=3, expect_no_warnings=True, caplog=caplog
    )
    # Retention still holds after all the kills: no more than keep_last + one being written.
    published = [
        name for name in os.listdir(location) if os.path.exists(f"{location}/{name}/manifest.json")
    ]
    assert len(published) <= 3


def test_sigkill_at_random_moments_of_uploads_never_breaks_resume(tmp_path, check_state, caplog):
    # file:// goes through fsspec like s3:// does: stage locally, upload, manifest last.
    remote = (tmp_path / "bucket").as_uri()
    staging = str(tmp_path / "staging")
    kill_repeatedly(
        tmp_path, [remote, staging], check_state, kills=2, expect_no_warnings=False, caplog=caplog
    )
