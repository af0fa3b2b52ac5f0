"""No secret in what `thrifty tune` writes or prints: trial.toml, winner.toml, tune.json and every
trial's files are redacted as a run's config.toml is, while each trial still receives the
credentials it needs (through a pipe, never a file). The winner then runs with `thrifty train`
once the credentials come the documented way: storage keys from the environment, a secret value
of the task with --set.

Real trials of a model from this file; the winner trains against a real S3 API (moto's server
on loopback)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

from dist_task import Net
from test_tune import CONFIG
from thrifty import cli
from thrifty.config import toml_loads

TESTS = Path(__file__).resolve().parent
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSECRET"
PASSWORD = "hunter2-pass"
SIGNATURE = "f00dfacesig123"
TOKEN = "tok-SECRET-123"
SECRETS = (KEY_ID, SECRET_KEY, PASSWORD, SIGNATURE, TOKEN)
URL = f"https://alice:{PASSWORD}@data.example.com/set?X-Amz-Expires=60&X-Amz-Signature={SIGNATURE}"
BUCKET = "tuned-ckpt"


def credentialed(url: str, token: str) -> torch.nn.Module:
    """A model whose weights come from a signed URL with a token: it refuses to build without
    the real ones, and says what it fetches, as a chatty library would."""
    if PASSWORD not in url or SIGNATURE not in url or token != TOKEN:
        raise ValueError("the model's download was refused: the credentials did not arrive")
    print(f"GET {url} (Authorization: Bearer {token})", file=sys.stderr)
    return Net()


def job(tmp_path: Path, endpoint: str) -> Path:
    config = tmp_path / "job.toml"
    config.write_text(
        CONFIG.format(model="test_tune_redaction:credentialed")
        + f'model_args = {{ url = "{URL}", token = "{TOKEN}" }}\n\n'
        + "[checkpoint]\n"
        + f'location = "s3://{BUCKET}/run"\n'
        + f'storage_options = {{ key = "{KEY_ID}", secret = "{SECRET_KEY}", '
        + f'client_kwargs = {{ endpoint_url = "{endpoint}", region_name = "us-east-1" }} }}\n'
    )
    return config


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch):
    """moto's S3 server on loopback with an empty bucket; no AWS setting of this machine."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("s3fs")
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    yield endpoint, client
    server.stop()


@pytest.fixture
def children_import_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)


def leaks(folder: Path) -> dict[str, list[str]]:
    """The files under `folder` that hold a secret, with the secrets they hold."""
    found = {}
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            held = [s for s in SECRETS if s.encode() in data]
            if held:
                found[str(path.relative_to(folder))] = held
    return found


def test_no_secret_reaches_the_tunes_files_or_screen_and_the_winner_runs(
    tmp_path, capsys, monkeypatch, s3, children_import_tests
):
    endpoint, client = s3
    out = tmp_path / "tune"
    argv = ["tune", str(job(tmp_path, endpoint)), "--levers", "micro", "--micro", "8"]
    assert cli.main([*argv, "--steps", "2", "--out", str(out)]) == 0  # the trial got them
    printed = capsys.readouterr()
    assert not [s for s in SECRETS if s in printed.out + printed.err]
    assert (out / "trials" / "00-baseline" / "train.log").exists()
    assert "GET https://data.example.com/set?X-Amz-Expires=60&X-Amz-Signature=<redacted>" in (
        (out / "trials" / "00-baseline" / "train.log").read_text()
    )
    assert leaks(out) == {}

    winner = toml_loads((out / "winner.toml").read_text())
    assert winner["checkpoint"]["storage_options"] == {}
    assert winner["checkpoint"]["location"] == f"s3://{BUCKET}/run"
    assert winner["task"]["model_args"]["token"] == "<redacted>"

    # The documented way: storage credentials (and the endpoint) from the environment; a
    # secret value of the task with --set.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    train = ["train", str(out / "winner.toml"), "--out", str(tmp_path / "run"), "--steps", "2"]
    secrets = ["--set", f'task.model_args.url="{URL}"', "--set", f'task.model_args.token="{TOKEN}"']
    assert cli.main([*train, *secrets, "--set", "run.progress=off"]) == 0
    saved = client.list_objects_v2(Bucket=BUCKET, Prefix="run/").get("Contents", [])
    assert any(o["Key"].endswith("manifest.json") for o in saved), saved
