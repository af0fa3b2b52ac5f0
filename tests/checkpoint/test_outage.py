"""A slow or absent bucket never stalls training: saves never wait for an upload, retries stop
at a deadline, staging stays bounded, and the end of a run says where the newest checkpoint is.

Against a real S3 API server on loopback whose every connection is dropped for the outage.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import fsspec
import pytest

from checkpoint.s3_server import BUCKET, options
from thrifty.checkpointing.saving.saves import finish_uploads, make_manager
from thrifty.checkpointing.store import CheckpointManager
from thrifty.checkpointing.store.storage import FsspecStorage
from thrifty.config import CheckpointConfig

pytest.importorskip("s3fs")


def published(folder: Path) -> list[int]:
    """Steps in `folder` that have a manifest (checkpoints, not saves in progress)."""
    return sorted(
        int(p.name.split("-")[1]) for p in folder.glob("step-*") if (p / "manifest.json").exists()
    )


def remote_steps(s3, prefix: str) -> list[str]:
    fs = fsspec.filesystem(
        "s3", **{k: v for k, v in options(s3.endpoint).items() if k != "skip_instance_cache"}
    )
    fs.invalidate_cache()
    return sorted(os.path.basename(p) for p in fs.ls(f"{BUCKET}/{prefix}", detail=False))


def test_saves_never_wait_for_an_upload_stuck_in_an_outage_and_the_newest_wins(
    s3, tmp_path, make_state, check_state, monkeypatch
):
    uploaded: set[str] = set()
    real_upload = FsspecStorage.upload

    def spy(self, local_path, rel):
        real_upload(self, local_path, rel)
        uploaded.add(rel.split("/")[0])

    monkeypatch.setattr(FsspecStorage, "upload", spy)
    staging = tmp_path / "staging"
    manager = CheckpointManager(
        f"s3://{BUCKET}/short-outage",
        local_dir=str(staging),
        keep_last=2,
        storage_options=options(s3.endpoint),
        retry_backoff=0.2,
        upload_deadline=120,
    )
    manager.save(1, make_state(1))
    assert manager.wait(timeout=60) and manager.pending_uploads == []
    s3.stop()
    try:
        for step in range(2, 8):
            manager.save(step, make_state(step))  # returns although no upload can finish
            # Staging obeys retention even though nothing can be uploaded.
            assert len(published(staging)) <= manager.keep_last + 1
        # Every save returned while the upload of step 2 was still retrying: none waited for it.
        assert manager.wait(timeout=0.5) is False
        assert manager.pending_uploads[-1] == 7
    finally:
        s3.start()
    # The outage was shorter than the deadline: the same upload attempt got through.
    assert manager.wait(timeout=90) and manager.pending_uploads == []
    assert remote_steps(s3, "short-outage") == ["step-00000006", "step-00000007"]
    # The newest superseded the older pending ones: they were never sent.
    assert uploaded == {"step-00000001", "step-00000006", "step-00000007"}
    assert published(staging) == [7]
    fresh = CheckpointManager(
        f"s3://{BUCKET}/short-outage",
        local_dir=str(tmp_path / "new-machine"),
        storage_options=options(s3.endpoint),
    )
    check_state(fresh.load(fresh.latest()), 7)


def test_an_outage_past_the_deadline_ends_the_upload_naming_the_location_and_keeps_the_copy(
    s3, tmp_path, make_state, check_state, caplog
):
    staging = tmp_path / "staging"
    url = f"s3://{BUCKET}/long-outage"
    manager = CheckpointManager(
        url,
        local_dir=str(staging),
        storage_options=options(s3.endpoint),
        retry_backoff=0.1,
        upload_deadline=1.0,
    )
    s3.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="thrifty.checkpointing.store"):
            manager.save(3, make_state(3))
            assert manager.wait(timeout=60)  # the attempt ended: no hang, no error
        status = manager.upload_status()
    finally:
        s3.start()
    gave_up = [r.getMessage() for r in caplog.records if "gave up" in r.getMessage()]
    assert len(gave_up) == 1 and "\n" not in gave_up[0]
    assert f"upload to {url} gave up after checkpoint.upload_deadline (1 s)" in gave_up[0]
    assert "check the endpoint URL" in gave_up[0] and str(staging / "step-00000003") in gave_up[0]
    assert manager.pending_uploads == [3]
    assert status["newest_step"] == 3 and status["uploaded"] is False
    assert status["local_path"] == str(staging / "step-00000003")
    assert status["error"].startswith(f"cannot reach {url}")
    check_state(manager.load(str(staging / "step-00000003")), 3)
    manager.save(4, make_state(4))  # the endpoint is back: the next save uploads
    assert manager.close() is True
    assert manager.upload_status() == {
        "newest_step": 4,
        "uploaded": True,
        "local_path": str(staging / "step-00000004"),
        "location": url,
        "error": None,
    }


def test_the_end_of_a_run_waits_only_the_upload_deadline_and_says_the_checkpoint_is_local_only(
    s3, tmp_path, make_state, caplog
):
    url = f"s3://{BUCKET}/end-of-run"
    config = CheckpointConfig(
        location=url,
        local_dir=str(tmp_path / "staging"),
        upload_deadline="1s",
        storage_options=options(s3.endpoint),
    )
    manager = make_manager(config, tmp_path / "run")
    s3.stop()
    try:
        manager.save(12, make_state(12), metric=None)
        with caplog.at_level(logging.WARNING, logger="thrifty"):
            finish_uploads(manager, config)
    finally:
        s3.start()
    status = manager.upload_status()
    assert status is not None and status["uploaded"] is False and status["newest_step"] == 12
    folder = str(tmp_path / "staging" / "step-00000012")
    [line] = [r.getMessage() for r in caplog.records if "only on this machine" in r.getMessage()]
    assert line.startswith(
        f"the newest checkpoint (step 12) exists only on this machine, in {folder}, not at {url}"
    )
    assert (Path(folder) / "manifest.json").exists()
