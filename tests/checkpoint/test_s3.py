"""S3 through s3fs against a real S3 API server on loopback (moto's server mode)."""

from __future__ import annotations

import logging
import os
import socket
import threading

import pytest

from thrifty.checkpoint import CheckpointError, CheckpointManager, TransientStorageError
from thrifty.checkpoint.storage import FsspecStorage

moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")

BUCKET = "thrifty-ckpt"
SECRET = "fake-secret-never-logged"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Link:
    """A TCP relay on loopback that a test can cut and restore.

    Cutting drops every open connection and refuses new ones, so an outage is
    immediate and certain: stopping the server itself would leave pooled
    keep-alive connections still served by its handler threads.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            doomed, self._sockets = [self._listener, *self._sockets], set()
            self._listener = None
        for sock in doomed:
            if sock is not None:
                _close(sock)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    _close(client), _close(upstream)
                    return
                self._sockets |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._sockets -= {src, dst}
        _close(src), _close(dst)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv or accept
    except OSError:
        pass
    sock.close()


class S3Server:
    """moto on 127.0.0.1 behind a Link, so a test can take it away and bring it back (data survives)."""

    def __init__(self) -> None:
        self._server = moto_server.ThreadedMotoServer(
            ip_address="127.0.0.1", port=free_port(), verbose=False
        )
        self._server.start()
        self._link = Link(self._server.get_host_and_port()[1])
        self.endpoint = f"http://127.0.0.1:{self._link.port}"

    def stop(self) -> None:
        self._link.cut()

    def start(self) -> None:
        self._link.restore()

    def close(self) -> None:
        self._link.cut()
        self._server.stop()


@pytest.fixture(autouse=True)
def no_real_aws(monkeypatch, tmp_path):
    """No credentials, config or instance metadata from this machine: nothing leaves loopback."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket=BUCKET)
    yield server
    server.close()


def options(endpoint: str, **credentials: str) -> dict:
    return {
        **({"key": "testing", "secret": SECRET} if credentials.get("with_keys", "yes") else {}),
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        # Fail fast on a dead endpoint: thrifty does the retrying, with its own backoff.
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10},
        "skip_instance_cache": True,
    }


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
        upload_retries=6,
        retry_backoff=0.2,
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
    with caplog.at_level(logging.WARNING, logger="thrifty.checkpoint"):
        manager.save(1, make_state(1))
        assert manager.wait(timeout=60)
    monkeypatch.undo()
    assert "retry 1 of 6" in caplog.text
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
    )
    manager.save(1, make_state(1))
    assert manager.wait(timeout=60)
    s3.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="thrifty.checkpoint"):
            for step in (2, 3):
                manager.save(step, make_state(step))  # no error: training keeps going
                assert manager.wait(timeout=60)
        assert "stay in" in caplog.text and SECRET not in caplog.text
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
        manager.check()
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
        manager.check()
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
        manager.check()
