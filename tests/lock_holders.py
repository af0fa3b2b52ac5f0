"""What the run lock tests share: a child process holding a RunLock until SIGKILLed (on this
machine or posing as another one, in an engine job or not), and a real S3 API on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from thrifty.checkpointing.store.storage import open_storage
from thrifty.rundir.lock import LEASE_FILE, Holder, RunInUseError, RunLock

HOST = socket.gethostname()
BUCKET = "thrifty-lock"
# What the engines set in a job's environment: cleared around every lock test, so that a test run
# inside a Slurm job (say) is not taken for an attempt of it.
ENGINE_VARIABLES = (
    "SKYPILOT_TASK_ID",
    "SLURM_JOB_ID",
    "SLURM_CLUSTER_NAME",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
)

# A child process that takes the lock, says "held", and keeps it until killed.
HOLD = """
import json, os, socket, sys, time
args = json.loads(sys.argv[1])
if args.get("host"):  # as if it ran on another machine
    socket.gethostname = lambda: args["host"]
import thrifty.rundir.lock as lock
if args.get("no_flock"):  # as on a network file system without flock
    lock._LocalLock._flock = lambda self: False
lock.RunLock(
    args["run_dir"], args.get("location"), args.get("options"),
    ttl_seconds=args.get("ttl", lock.DEFAULT_TTL_SECONDS), settle_seconds=0.05,
).acquire()
if args.get("fork_for"):  # a forked child (think data loader worker) inherits the lock
    pid = os.fork()
    if pid == 0:
        time.sleep(args["fork_for"])
        os._exit(0)
    print("forked", pid, flush=True)
print("held", flush=True)
time.sleep(300)
"""


def wait_until(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class Holding:
    """A child process holding a RunLock until killed; `env` adds to its environment (an engine
    job's variables), `host` makes it pose as another machine."""

    def __init__(self, env: Mapping[str, str] | None = None, **args: object) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.forked: int | None = None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("forked"):
                self.forked = int(line.split()[1])
            if line.strip() == "held":
                return
        raise AssertionError(f"the child did not take the lock: {self.proc.stderr.read()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no cleanup runs. Reaped at once, as a shell or supervisor would."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        if self.forked is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.forked, signal.SIGKILL)
        self.proc.stdout.close()
        self.proc.stderr.close()


@contextlib.contextmanager
def holders() -> Iterator:
    """A function starting `Holding` children; each is killed and reaped at the end."""
    children: list[Holding] = []

    def start(**args: object) -> Holding:
        children.append(Holding(**args))
        return children[-1]

    try:
        yield start
    finally:
        for child in children:
            child.close()


def no_engine_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENGINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def refusal(run_dir: Path, **kwargs) -> str:
    """The one-line message of the RunInUseError that taking the lock raises."""
    with pytest.raises(RunInUseError) as info:
        RunLock(run_dir, **kwargs).acquire()
    message = str(info.value)
    assert len(message.splitlines()) == 1
    return message


def try_acquire(run_lock: RunLock) -> bool:
    try:
        run_lock.acquire()
    except RunInUseError:
        return False
    return True


def lease_of(url: str, options: dict | None = None) -> Holder | None:
    try:
        return Holder.parse(open_storage(url, options).read_bytes(LEASE_FILE))
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server on a free loopback port, with BUCKET created; yields its endpoint."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def s3_options_for(endpoint: str, monkeypatch: pytest.MonkeyPatch, scratch: Path) -> dict:
    """Credentials for the loopback server only; nothing from this machine's AWS setup."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(scratch / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(scratch / "no-aws-credentials"))
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
