"""A real S3 API server (moto's server mode) on loopback, behind a TCP relay that can drop every
connection at once: what a bucket going away looks like to s3fs. Shared by the tests and
benchmarks/outage.py; nothing here leaves 127.0.0.1."""

from __future__ import annotations

import socket
import threading

BUCKET = "thrifty-ckpt"  # created by the tests' s3 fixture
FAKE_SECRET = "fake-secret-never-logged"


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
        from moto import server as moto_server

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

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=name)


def options(endpoint: str, **credentials: str) -> dict:
    """s3fs storage_options for the loopback server (fake keys unless with_keys="")."""
    return {
        **(
            {"key": "testing", "secret": FAKE_SECRET} if credentials.get("with_keys", "yes") else {}
        ),
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        # Fail fast on a dead endpoint: thrifty does the retrying, with its own backoff.
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 10},
        "skip_instance_cache": True,
    }
