"""S3 through s3fs against a real S3 API server on loopback (moto's server mode)."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from checkpoint.s3_server import BUCKET, free_port, options
from checkpoint.s3_server import FAKE_SECRET as SECRET
from thrifty.checkpointing.store import CheckpointError, CheckpointManager, TransientStorageError
from thrifty.checkpointing.store.storage import FsspecStorage

pytest.importorskip("moto.server")
pytest.importorskip("boto3")
pytest.importorskip("s3fs")


def test_save_uploads_to_the_bucket_and_a_new_machine_resumes_from_it(
    s3, tmp_path, make_state, check_state
):
    url = f"s3://{BUCKET}/resume"
    with CheckpointManager(
        url, local_dir=str(tmp_path / "a"), storage_options=options(s3.endpoint)
    ) as m:
        for step in (10, 20, 30):
            m.save(step, make_state(step))
        assert m.wait(timeout=60) and m.pending_uploads == []
    fresh = CheckpointManager(
        url, local_dir=str(tmp_path / "empty"), storage_options=options(s3.endpoint)
    )
    info = fresh.latest()
    assert info is not None and info.step == 30 and info.uri == f"{url}/step-00000030"
    check_state(fresh.load(info), 30)
    assert sorted(os.listdir(tmp_path / "empty")) == ["step-00000030"]


def test_the_server_going_away_mid_upload_is_retried_with_backoff_until_it_is_back(
    s3, tmp_path, make_state, check_state, monkeypatch, caplog
):
    url = f"s3://{BUCKET}/flaky"
    manager = CheckpointManager(
        url,
        local_dir=str(tmp_path),
        storage_options=options(s3.endpoint),
        retry_backoff=0.2,
        upload_deadline=30,
    )
    real_upload = FsspecStorage.upload
    lost = threading.Event()

    def upload_then_lose_the_server(self, local_path, rel):
        real_upload(self, local_path, rel)
        if not lost.is_set():  # the data file landed, its manifest has not been written
            lost.set()
            s3.stop()
            threading.Timer(1.0, s3.start).start()

    monkeypatch.setattr(FsspecStorage, "upload", upload_then_lose_the_server)
    with caplog.at_level(logging.WARNING, logger="thrifty.checkpointing.store"):
        manager.save(1, make_state(1))
        assert manager.wait(timeout=60)
    monkeypatch.undo()
    assert "retry 1, giving up in" in caplog.text
    assert manager.pending_uploads == []
    fresh = CheckpointManager(
        url, local_dir=str(tmp_path / "b"), storage_options=options(s3.endpoint)
    )
    check_state(fresh.load(fresh.latest()), 1)


def test_while_the_server_is_down_training_goes_on_and_checkpoints_wait_locally(
    s3, tmp_path, make_state, check_state, caplog
):
    url = f"s3://{BUCKET}/outage"
    staging = tmp_path / "staging"
    manager = CheckpointManager(
        url,
        local_dir=str(staging),
        keep_last=2,
        storage_options=options(s3.endpoint),
        upload_retries=1,
        retry_backoff=0.05,
        upload_deadline=1.0,
    )
    manager.save(1, make_state(1))
    assert manager.wait(timeout=60)
    s3.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="thrifty.checkpointing.store"):
            for step in (2, 3):
                manager.save(step, make_state(step))  # no error: training keeps going
                assert manager.wait(timeout=60)
        assert (
            "gave up after checkpoint.upload_deadline" in caplog.text and SECRET not in caplog.text
        )
        # Not confirmed remotely, so both stay on local disk, complete and verifiable.
        for step in (2, 3):
            assert (staging / f"step-0000000{step}" / "manifest.json").exists()
        check_state(manager.load(str(staging / "step-00000003")), 3)
        with pytest.raises(TransientStorageError, match=f"cannot reach {url}"):
            manager.latest()  # resume must not guess while the bucket cannot be listed
    finally:
        s3.start()
    assert manager.pending_uploads == [2, 3]
    manager.save(4, make_state(4))
    assert manager.wait(timeout=60)
    assert manager.pending_uploads == []
    # Retention over everything published: steps 3 and 4; step 2 was never needed remotely.
    assert sorted(os.listdir(staging)) == ["step-00000004"]
    fresh = CheckpointManager(
        url, local_dir=str(tmp_path / "new-machine"), storage_options=options(s3.endpoint)
    )
    info = fresh.latest()
    assert info.step == 4
    check_state(fresh.load(info), 4)
    check_state(fresh.load(f"{url}/step-00000003"), 3)
    with pytest.raises(CheckpointError, match="not a thrifty checkpoint"):
        fresh.load(f"{url}/step-00000001")  # purged once 3 and 4 were published


def test_an_unreachable_endpoint_gives_one_line_naming_the_location_and_the_fix(tmp_path):
    manager = CheckpointManager(
        f"s3://{BUCKET}/run",
        local_dir=str(tmp_path),
        storage_options=options(f"http://127.0.0.1:{free_port()}"),
        upload_retries=1,
        retry_backoff=0.01,
    )
    with pytest.raises(TransientStorageError) as excinfo:
        manager.probe()
    message = str(excinfo.value)
    assert "\n" not in message and SECRET not in message
    assert message.startswith(f"cannot reach s3://{BUCKET}/run/")
    assert "check the endpoint URL" in message


def test_missing_credentials_give_one_line_naming_the_location_and_the_fix(s3, tmp_path):
    manager = CheckpointManager(
        f"s3://{BUCKET}/run",
        local_dir=str(tmp_path),
        storage_options=options(s3.endpoint, with_keys=""),
    )
    with pytest.raises(CheckpointError) as excinfo:
        manager.probe()
    message = str(excinfo.value)
    assert "\n" not in message and not isinstance(excinfo.value, TransientStorageError)
    assert message.startswith(f"no credentials for s3://{BUCKET}/run")
    assert "AWS_ACCESS_KEY_ID" in message


def test_a_missing_bucket_gives_one_line_naming_it_and_the_fix(s3, tmp_path):
    manager = CheckpointManager(
        "s3://no-such-bucket/run", local_dir=str(tmp_path), storage_options=options(s3.endpoint)
    )
    with pytest.raises(
        CheckpointError, match=r"^s3://no-such-bucket/run/.* does not exist .*create the bucket"
    ):
        manager.probe()
