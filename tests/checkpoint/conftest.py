"""Shared fixtures: small training states, a metadata server on loopback, and real small or
read-only file systems (tmpfs, mounted when running as root)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch


def training_state(step: int, size: int = 1000) -> dict[str, Any]:
    """A state whose every value says which step it belongs to."""
    return {
        "step": step,
        "model": {"w": torch.full((size,), float(step)), "b": torch.full((3,), float(step))},
        "optimizer": {"state": {0: {"exp_avg": torch.full((size,), float(step))}}, "lr": 0.1},
        "rng": torch.tensor([step], dtype=torch.int64),
        "extra": [step, "text", None, (True, 2.5)],
    }


def assert_state_of_step(state: dict[str, Any], step: int) -> None:
    assert state["step"] == step
    assert torch.equal(state["model"]["w"], torch.full_like(state["model"]["w"], float(step)))
    assert torch.equal(state["optimizer"]["state"][0]["exp_avg"], state["model"]["w"])
    assert state["extra"] == [step, "text", None, (True, 2.5)]


@pytest.fixture
def make_state() -> Callable[..., dict[str, Any]]:
    return training_state


@pytest.fixture
def check_state() -> Callable[[dict[str, Any], int], None]:
    return assert_state_of_step


@dataclass
class Route:
    """A canned answer; `require` lists request headers without which the server says 401."""

    status: int = 200
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    require: dict[str, str] = field(default_factory=dict)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: MetadataServer  # type: ignore[assignment]

    def _answer(self) -> None:
        self.server.requests.append((self.command, self.path, self.headers))
        route = self.server.routes.get((self.command, self.path), Route(404, "Not Found"))
        if any(self.headers.get(k) != v for k, v in route.require.items()):
            route = Route(401, "Unauthorized")
        body = route.body.encode()
        self.send_response(route.status)
        for key, value in route.headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetadataServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[tuple[str, str], Route] = {}
        self.requests: list[tuple[str, str, Any]] = []  # headers: case-insensitive
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def answer(
        self,
        method: str,
        path: str,
        status: int = 200,
        body: str = "",
        *,
        headers: dict[str, str] | None = None,
        require: dict[str, str] | None = None,
    ) -> None:
        """Answer `method path` with `status` and `body`; 401 when `require`d headers lack."""
        self.routes[(method, path)] = Route(status, body, headers or {}, require or {})

    def answer_json(self, method: str, path: str, doc: Any, **kwargs: Any) -> None:
        self.answer(method, path, 200, json.dumps(doc), **kwargs)


@pytest.fixture
def metadata_server() -> Iterator[MetadataServer]:
    """An HTTP server on 127.0.0.1 that answers from `routes`; stopped after the test."""
    server = MetadataServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def tmpfs(tmp_path) -> Iterator[Callable[..., Path]]:
    """`tmpfs(size_bytes, read_only=False)` mounts a real tmpfs and returns its folder: a disk
    that really fills (ENOSPC) or really refuses writes (EROFS, which root cannot bypass).
    Skips where mounting is not allowed (not root, or no CAP_SYS_ADMIN)."""
    mounted: list[Path] = []

    def mount(size_bytes: int, read_only: bool = False) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        folder = tmp_path / f"tmpfs{len(mounted)}"
        folder.mkdir()
        options = f"size={size_bytes}" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


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
    """moto's S3 server on loopback with the bucket BUCKET, behind a link a test can cut."""
    pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    from checkpoint.s3_server import BUCKET, S3Server

    server = S3Server()
    server.create_bucket(BUCKET)
    yield server
    server.close()
