"""No secret reaches disk: config.toml, checkpoints' configs, metrics, summaries and log lines."""

from __future__ import annotations

import json
import logging

import pytest

from thrifty.checkpointing.store.storage import redact
from thrifty.config import TrainConfig, dump_toml, load_config
from thrifty.redact import (
    REDACTED,
    RedactingFilter,
    install_log_redaction,
    is_secret_name,
    redact_text,
    redact_value,
)
from thrifty.rundir.files import MetricsLog, read_metrics, write_json

AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = "FwoGZXIvYXdzEJr//////////wEaDOQ7xyz+abc=="
PRESIGNED = (
    "https://ckpt.s3.amazonaws.com/run/step-1/state.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    f"&X-Amz-Credential={AWS_KEY_ID}%2F20240101%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    "&X-Amz-Security-Token=FwoGZXIvYXdzEJr%2F%2F%2Fsessiontoken"
    "&X-Amz-Signature=5f2a9c0e1b7d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f"
)
GCS_SIGNED = (
    "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256"
    "&X-Goog-Credential=svc%40proj.iam.gserviceaccount.com%2F20240101"
    "&X-Goog-Signature=0a1b2c3d4e5f60718293a4b5c6d7e8f9"
)
AZURE_SAS = (
    "https://acct.blob.core.windows.net/ckpt/run?sv=2022-11-02&ss=b&srt=co&sp=rwl"
    "&se=2030-01-01T00:00:00Z&sig=Zm9vYmFyYmF6cXV4%2Bc2VjcmV0%3D"
)
# Every secret the tests plant; none may appear in anything written.
SECRETS = [
    AWS_KEY_ID,
    AWS_SECRET,
    SESSION_TOKEN,
    "5f2a9c0e1b7d3e4f",
    "sessiontoken",
    "0a1b2c3d4e5f",
    "Zm9vYmFyYmF6",
    "p/ss:w@rd",
    "hunter2",
    "s3cr3t",
]


def assert_no_secret(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"leaked {leaked} in {text!r}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3://AKIA:se/cr+et@bucket/run", "s3://bucket/run"),
        ("https://user:p/ss:w@rd@host.example/path?x=1", "https://host.example/path?x=1"),
        ("memory://hunter2@bucket/a", "memory://bucket/a"),
        ("/plain/local/path", "/plain/local/path"),
        ("s3://bucket/runs/a", "s3://bucket/runs/a"),
        (
            "error at https://u:p@host/x?X-Amz-Signature=abc&a=1",
            f"error at https://host/x?X-Amz-Signature={REDACTED}&a=1",
        ),
        (f"using key {AWS_KEY_ID} for s3", f"using key {REDACTED} for s3"),
        (f"aws_secret_access_key={AWS_SECRET} next", f"aws_secret_access_key={REDACTED} next"),
        (f'AWS_SESSION_TOKEN="{SESSION_TOKEN}"', f'AWS_SESSION_TOKEN="{REDACTED}"'),
        (
            "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=s3cr3t+/==;Suffix=x",
            f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={REDACTED};Suffix=x",
        ),
        (
            '{"password": "hunter2", "region": "eu"}',
            f'{{"password": "{REDACTED}", "region": "eu"}}',
        ),
        ("Authorization: Bearer abcdef123456", f"Authorization: {REDACTED} {REDACTED}"),
        # Not secrets: counts of tokens, tokenizer settings, ordinary prose.
        ("tokens: 1234, max_tokens=5", "tokens: 1234, max_tokens=5"),
        ("pad_token=<pad>", "pad_token=<pad>"),
        ("precision: bf16 (native on this GPU)", "precision: bf16 (native on this GPU)"),
    ],
)
def test_redact_text_masks_credentials_and_leaves_everything_else(text, expected):
    assert redact_text(text) == expected
    assert redact_text(expected) == expected  # redacting twice changes nothing


@pytest.mark.parametrize("url", [PRESIGNED, GCS_SIGNED, AZURE_SAS])
def test_signed_urls_keep_their_shape_and_lose_their_signature(url):
    redacted = redact_text(f"downloading {url} failed")
    assert_no_secret(redacted)
    assert redacted.startswith("downloading https://") and redacted.endswith(" failed")
    assert "X-Amz-Expires=3600" in redacted or "X-Goog-Algorithm" in redacted or "sv=" in redacted


def test_checkpoint_storage_redact_is_the_same_function():
    for text in (PRESIGNED, "s3://AKIA:se/cr+et@bucket/run", f"key {AWS_KEY_ID}"):
        assert redact(text) == redact_text(text)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("key", True),
        ("secret", True),
        ("token", True),
        ("aws_access_key_id", True),
        ("aws_secret_access_key", True),
        ("aws_session_token", True),
        ("AWSAccessKeyId", True),
        ("X-Amz-Security-Token", True),
        ("AccountKey", True),
        ("account_key", True),
        ("sas_token", True),
        ("connection_string", True),
        ("password", True),
        ("Authorization", True),
        ("sig", True),
        ("tokens", False),
        ("max_tokens", False),
        ("tokens_per_second", False),
        ("pad_token", False),
        ("key_dim", False),
        ("text_key", False),
        ("keep_last", False),
        ("endpoint_url", False),
        ("region_name", False),
    ],
)
def test_which_names_are_secrets(name, secret):
    assert is_secret_name(name) is secret


@pytest.mark.parametrize(
    "options",
    [
        {"key": AWS_KEY_ID, "secret": AWS_SECRET, "token": SESSION_TOKEN},
        {"client_kwargs": {"aws_access_key_id": AWS_KEY_ID, "aws_secret_access_key": AWS_SECRET}},
        {"profile": "prod", "config_kwargs": {"hunter2": "s3cr3t"}},  # a secret under any name
        {"account_name": "a", "account_key": "s3cr3t", "sas_token": AZURE_SAS},
        {"token": {"type": "service_account", "private_key": "s3cr3t"}},
        {"headers": {"Authorization": "Bearer hunter2hunter2"}},
    ],
)
def test_storage_options_of_every_shape_are_written_as_an_empty_table(options):
    redacted = redact_value({"checkpoint": {"storage_options": options, "keep_last": 3}})
    assert redacted == {"checkpoint": {"storage_options": {}, "keep_last": 3}}


def test_redact_value_masks_secret_named_strings_and_keeps_numbers_and_model_arguments():
    value = {
        "task": {
            "model_args": {"key_dim": 64, "pad_token": "<pad>", "api_key": "hunter2"},
            "data_args": {"text_key": "content", "urls": [PRESIGNED], "token": {"a": "s3cr3t"}},
        },
        "tokens": 1234,
        "use_credentials": True,
    }
    assert redact_value(value) == {
        "task": {
            "model_args": {"key_dim": 64, "pad_token": "<pad>", "api_key": REDACTED},
            "data_args": {
                "text_key": "content",
                "urls": [redact_text(PRESIGNED)],
                "token": REDACTED,
            },
        },
        "tokens": 1234,
        "use_credentials": True,
    }


def secret_config() -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {"max_steps": 10},
            "checkpoint": {
                "location": "s3://AKIAIOSFODNN7EXAMPLE:p/ss:w@rd@ckpt/run",
                "resume": PRESIGNED,
                "storage_options": {"key": AWS_KEY_ID, "secret": AWS_SECRET},
            },
            "task": {"data_args": {"url": GCS_SIGNED, "api_key": "hunter2", "n": 3}},
            "spot": {"metadata_url": "http://user:s3cr3t@169.254.169.254"},
        }
    )


def test_saved_config_holds_no_secret_and_still_loads(tmp_path):
    config = secret_config()
    saved = config.to_dict(secrets=False)
    text = dump_toml(saved)
    assert_no_secret(text)
    path = tmp_path / "config.toml"
    path.write_text(text)
    loaded = load_config(path)
    assert loaded.checkpoint.location == "s3://ckpt/run"
    assert loaded.checkpoint.storage_options == {}
    assert loaded.task.data_args["n"] == 3 and loaded.task.data_args["api_key"] == REDACTED
    assert config.to_dict()["checkpoint"]["storage_options"]["secret"] == AWS_SECRET  # in memory


def test_summary_and_metrics_files_are_redacted(tmp_path):
    write_json(tmp_path / "summary.json", {"run_dir": "s3://u:hunter2@b/r", "steps": 3})
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write([{"step": 1, "loss": 2.5, "tokens": 64}, {"step": 1, "note": f"key {AWS_KEY_ID}"}])
    log.close()
    assert_no_secret((tmp_path / "summary.json").read_text())
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "run_dir": "s3://b/r",
        "steps": 3,
    }
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records == [
        {"step": 1, "loss": 2.5, "tokens": 64},
        {"step": 1, "note": f"key {REDACTED}"},
    ]


def test_a_log_record_stays_one_line_whatever_its_arguments_hold(caplog):
    from thrifty.redact import one_line

    assert one_line("runs/a\nb\rc\x1b[2J\td") == "runs/a\\nb\\rc\\x1b[2J\td"  # a tab stays
    caplog.handler.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, logger="thrifty"):
        logging.getLogger("thrifty").info("written to %s", "runs/x\nthrifty: forged")
    assert caplog.messages == ["written to runs/x\\nthrifty: forged"]


def test_log_records_are_redacted_by_the_handler_filter(caplog):
    caplog.handler.addFilter(RedactingFilter())
    logger = logging.getLogger(
        "thrifty.checkpointing.store"
    )  # a child: its records reach the handler
    with caplog.at_level(logging.INFO, logger="thrifty"):
        logger.info("uploading to %s with %s", PRESIGNED, f"aws_secret_access_key={AWS_SECRET}")
        try:
            raise RuntimeError(f"cannot open s3://{AWS_KEY_ID}:hunter2@bucket")
        except RuntimeError:
            logger.exception("upload failed")
    assert_no_secret(caplog.text)
    assert "uploading to https://ckpt.s3.amazonaws.com/run/step-1/state.pt?" in caplog.text
    assert "RuntimeError: cannot open s3://bucket" in caplog.text


def test_install_log_redaction_filters_each_handler_once():
    handler = logging.StreamHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        install_log_redaction()
        install_log_redaction()
        assert sum(isinstance(f, RedactingFilter) for f in handler.filters) == 1
    finally:
        root.removeHandler(handler)


@pytest.mark.parametrize(
    "path", ["my_secrets:build_model", "lab.auth.models:make", "token_data.sources:stream"]
)
def test_a_factory_path_whose_module_names_a_secret_word_is_kept_whole(path):
    # config.toml names the task's factories by import path: masking one would leave a run
    # directory whose config cannot be trained again.
    assert redact_text(path) == path
    assert redact_value({"task": {"model": path}}) == {"task": {"model": path}}


def test_a_secret_pair_in_prose_is_still_masked_next_to_a_factory_path():
    text = "model my_pkg:build failed: password: hunter2"
    assert "hunter2" not in redact_text(text)
    assert "hunter2" not in redact_text("password:hunter2")  # one word before the colon: a pair


def test_a_urls_credentials_quoted_without_the_scheme_are_removed():
    """s3fs takes `KEY:SECRET@bucket` of s3://KEY:SECRET@bucket/p for a bucket name and its
    error quotes it: `thrifty runs` and the checkpoint storage printed the secret."""
    said = 'Invalid bucket name "AKIAXXXX:secretpart@bucket": Bucket name must match'
    assert redact_text(said) == 'Invalid bucket name "bucket": Bucket name must match'
    for kept in ("git@github.com:owner/repo", "user@example.com", "pkg.mod:build_model"):
        assert redact_text(kept) == kept


def test_thrifty_runs_on_a_url_with_credentials_shows_no_secret(tmp_path, capsys, monkeypatch):
    from thrifty.cli import main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.chdir(tmp_path)
    assert main(["runs", "s3://AKIAXXXX:secretpart@bucket/p"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("thrifty: error: ") and len(err.strip().splitlines()) == 1
    assert "secretpart" not in err and "AKIAXXXX" not in err


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        (f"s3://{AWS_KEY_ID}:{AWS_SECRET}@bucket/p", AWS_SECRET.split("/")[0]),
        ("s3://myuser:hun/ter2@bucket/p", "hun"),
    ],
    ids=["aws-secret-with-slashes", "short-part-before-a-slash"],
)
def test_a_password_cut_at_its_slash_by_the_storage_library_is_still_masked(
    tmp_path, capsys, monkeypatch, url, secret
):
    """s3fs takes `KEY:SEC` of s3://KEY:SEC/RET@bucket/p for the bucket (cut at the password's
    first `/`): botocore's error quotes it with no `@` after it, so no pattern can know it is
    a password; the location's own credentials are masked wherever the error quotes them."""
    from thrifty.cli import main

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.chdir(tmp_path)
    assert main(["runs", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("thrifty: error: ") and len(err.strip().splitlines()) == 1
    assert 'Invalid bucket name "<redacted>"' in err  # the error is still the library's
    assert secret not in err and "myuser" not in err and AWS_KEY_ID not in err


def test_checkpoint_storage_errors_mask_the_locations_own_password(monkeypatch):
    from thrifty.checkpointing.store import CheckpointError
    from thrifty.checkpointing.store.storage import FsspecStorage

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    storage = FsspecStorage(f"s3://{AWS_KEY_ID}:{AWS_SECRET}@bucket/p")
    with pytest.raises(CheckpointError) as caught:
        storage.read_bytes(".thrifty-lease.json")
    said = str(caught.value)
    assert "Invalid bucket name" in said
    assert all(part not in said for part in (AWS_KEY_ID, *AWS_SECRET.split("/")))
