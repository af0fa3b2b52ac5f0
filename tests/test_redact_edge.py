"""Redaction at the edge: every line thrifty prints passes one redaction, which also knows a
secret percent-encoded, once or twice, inside a URL another library quotes."""

from __future__ import annotations

import io
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from thrifty.console import say
from thrifty.redact import REDACTED, redact_text, redacted_log_records

SIGNATURE = "5f2a9c0e1b7d3e4fEDGESIG"
CREDENTIAL = "AKIAEDGECREDENTIAL/20240101/us-east-1/s3/aws4_request"
PASSWORD = "hunter2/edge"
TOKEN = "tok+EDGE/secret=="


def encodings(secret: str) -> list[str]:
    """A secret as printed plain, percent-encoded once and twice."""
    once = quote(secret, safe="")
    return [secret, once, quote(once, safe=""), secret.split("/")[0]]


def assert_hidden(text: str, *secrets: str) -> None:
    for secret in secrets:
        for form in encodings(secret):
            assert form not in text, f"{form!r} printed in {text!r}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (  # botocore's endpoint URL: the query written into the object key, encoded
            'Could not connect to the endpoint URL: "http://127.0.0.1:9/bucket/prefix'
            f"%3FX-Amz-Signature%3D{SIGNATURE}%26X-Amz-Credential%3D{quote(CREDENTIAL, safe='')}"
            '/.thrifty-lease.json"',
            'Could not connect to the endpoint URL: "http://127.0.0.1:9/bucket/prefix'
            f'%3FX-Amz-Signature%3D{REDACTED}%26X-Amz-Credential%3D{REDACTED}"',
        ),
        (  # the same URL encoded once more
            f"key prefix%253FX-Amz-Signature%253D{SIGNATURE}%2526X-Amz-Date%253D20240101",
            f"key prefix%253FX-Amz-Signature%253D{REDACTED}%2526X-Amz-Date%253D20240101",
        ),
        (
            f"redirect=https%3A%2F%2Fuser%3A{quote(PASSWORD, safe='')}%40host.example%2Fx end",
            "redirect=https%3A%2F%2Fhost.example%2Fx end",
        ),
        (
            f"u=https%253A%252F%252Fuser%253A{quote(quote(PASSWORD, safe=''), safe='')}%2540h",
            "u=https%253A%252F%252Fh",
        ),
        (f"GET /a?token%3D{quote(TOKEN, safe='')}&page=2", f"GET /a?token%3D{REDACTED}&page=2"),
        (f"GET /a%3Fpage%3D2%26token%3D{TOKEN}", f"GET /a%3Fpage%3D2%26token%3D{REDACTED}"),
        # A name encoded too: no pattern foresees it, its decoded form gives it away.
        (f"at X%2DAmz%2DSignature%3D{SIGNATURE} now", f"at {REDACTED} now"),
        # Not secrets: encoded paths and counts of tokens stay as written.
        ("s3://b/runs/a%20b/step-1 max_tokens%3D5", "s3://b/runs/a%20b/step-1 max_tokens%3D5"),
        ("GET /a?token%3D&page=2", "GET /a?token%3D&page=2"),
    ],
)
def test_percent_encoded_secrets_are_redacted_and_the_rest_kept(text, kept):
    assert redact_text(text) == kept
    assert redact_text(kept) == kept  # redacting twice changes nothing
    assert_hidden(redact_text(text), SIGNATURE, PASSWORD, TOKEN)


def test_a_log_record_is_redacted_whichever_handler_prints_it():
    # A handler of a library's own, with no filter of thrifty's: what the command line's
    # record redaction covers, and a filter on thrifty's handlers alone would not.
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("some_library")
    logger.addHandler(handler)
    try:
        with redacted_log_records():
            logger.warning("retrying %s", f"/b/p%3FX-Amz-Signature%3D{SIGNATURE}")
            logger.warning("failed", exc_info=ValueError(f"?token%3D{quote(TOKEN, safe='')}"))
        logger.warning("after: %s", "plain")
    finally:
        logger.removeHandler(handler)
    printed = stream.getvalue()
    assert f"/b/p%3FX-Amz-Signature%3D{REDACTED}" in printed and "after: plain" in printed
    assert_hidden(printed, SIGNATURE, TOKEN)


def test_a_progress_line_is_redacted(capsys):
    say("sweep", f"storage at postgresql%3A%2F%2Fuser%3A{quote(PASSWORD, safe='')}%40db/x")
    err = capsys.readouterr().err
    assert err == "thrifty sweep: storage at postgresql%3A%2F%2Fdb/x\n"


def tiny_job(tmp_path: Path, location: str, endpoint: str) -> Path:
    config = tmp_path / "job.toml"
    config.write_text(
        '[run]\nmax_steps = 3\nlog_every = 1\nprogress = "off"\n'
        '[batch]\nmicro = 4\n[data]\nnum_workers = 0\n[schedule]\ndecay = "constant"\n'
        f'[checkpoint]\nevery = "off"\nlocation = "{location}"\n'
        "[checkpoint.storage_options]\n"
        f'key = "testing"\nsecret = "fake"\nclient_kwargs = {{ endpoint_url = "{endpoint}" }}\n'
        "config_kwargs = { retries = { max_attempts = 1 }, connect_timeout = 2 }\n"
        '[spot]\nprovider = "none"\n'
        '[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "thrifty.demo:train_dataset"\n'
        "model_args = { n_layer = 2, n_head = 2, n_embd = 32, block_size = 32 }\n"
        "data_args = { block_size = 32, max_bytes = 100000 }\n"
    )
    return config


def test_a_signed_prefix_whose_endpoint_is_down_prints_and_writes_no_secret(tmp_path):
    # botocore quotes the URL it built, the prefix's query percent-encoded into the key: that
    # copy of the signature once reached the screen beside thrifty's redacted one.
    location = f"s3://thrifty-ckpt/runs/a?X-Amz-Signature={SIGNATURE}&X-Amz-Credential={CREDENTIAL}"
    config = tiny_job(tmp_path, location, f"http://127.0.0.1:{closed_port()}")
    out = tmp_path / "run"
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
    done = subprocess.run(
        [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 2, printed
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("thrifty: error: cannot reach s3://thrifty-ckpt/runs/a?"), error
    assert "Could not connect to the endpoint URL" in error  # botocore's words, kept
    assert f"X-Amz-Signature%3D{REDACTED}" in error
    assert_hidden(printed, SIGNATURE, CREDENTIAL)
    written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    for path in written:
        assert_hidden(path.read_bytes().decode(errors="replace"), SIGNATURE, CREDENTIAL)


def test_a_run_saving_under_a_signed_prefix_prints_and_writes_no_secret(tmp_path):
    from checkpoint.s3_server import BUCKET, S3Server

    server = S3Server()
    try:
        server.create_bucket(BUCKET)
        location = f"s3://{BUCKET}/runs/a?X-Amz-Signature={SIGNATURE}"
        config = tiny_job(tmp_path, location, server.endpoint)
        out = tmp_path / "run"
        done = subprocess.run(
            [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "AWS_EC2_METADATA_DISABLED": "true"},
            cwd=tmp_path,
        )
    finally:
        server.close()
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed
    assert f"s3://{BUCKET}/runs/a?X-Amz-Signature={REDACTED}" in printed
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "state.pt" for p in written)  # the staged save is searched too
    for path in written:
        assert_hidden(path.read_bytes().decode(errors="replace"), SIGNATURE)
    assert_hidden(printed, SIGNATURE)
