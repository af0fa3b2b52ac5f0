"""Remote locations through fsspec (memory:// here), redaction, and cheap imports."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import fsspec
import pytest

from thrifty.checkpointing.store import CheckpointManager, open_storage, redact
from thrifty.checkpointing.store.storage import FsspecStorage, LocalStorage
from thrifty.errors import MissingDependencyError


@pytest.fixture
def bucket(request):
    """A fresh memory:// location, emptied after the test."""
    url = f"memory://thrifty-tests/{request.node.name}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def remote_steps(url: str) -> list[str]:
    fs = fsspec.filesystem("memory")
    return sorted(os.path.basename(p) for p in fs.ls(url, detail=False)) if fs.exists(url) else []


def test_a_memory_url_stages_locally_uploads_and_resumes_on_a_new_machine(
    tmp_path, bucket, make_state, check_state
):
    with CheckpointManager(bucket, local_dir=str(tmp_path / "a"), keep_last=2) as manager:
        for step in (1, 2, 3):
            manager.save(step, make_state(step))
        assert manager.wait(timeout=30) and manager.pending_uploads == []
    assert remote_steps(bucket) == ["step-00000002", "step-00000003"]
    # Uploaded copies leave local disk; the newest stays for a restart on the same machine.
    assert sorted(os.listdir(tmp_path / "a")) == ["step-00000003"]

    fresh = CheckpointManager(bucket, local_dir=str(tmp_path / "new-machine"))
    info = fresh.latest()
    assert info is not None and info.step == 3 and info.uri == f"{bucket}/step-00000003"
    check_state(fresh.load(info), 3)
    check_state(fresh.load(f"{bucket}/step-00000002"), 2)


def test_the_remote_manifest_is_uploaded_after_the_files(tmp_path, bucket, make_state, monkeypatch):
    order: list[str] = []
    real_upload, real_write = FsspecStorage.upload, FsspecStorage.write_bytes
    monkeypatch.setattr(
        FsspecStorage, "upload", lambda s, src, rel: (order.append(rel), real_upload(s, src, rel))
    )
    monkeypatch.setattr(
        FsspecStorage, "write_bytes", lambda s, rel, d: (order.append(rel), real_write(s, rel, d))
    )
    with CheckpointManager(bucket, local_dir=str(tmp_path)) as manager:
        manager.save(1, make_state(1))
    assert order == ["step-00000001/state.pt", "step-00000001/manifest.json"]


def test_a_corrupt_remote_checkpoint_is_skipped_and_the_previous_one_downloaded(
    tmp_path, bucket, make_state, check_state, caplog
):
    with CheckpointManager(bucket, local_dir=str(tmp_path / "a")) as manager:
        manager.save(1, make_state(1))
        manager.save(2, make_state(2))
    fs = fsspec.filesystem("memory")
    data = bytearray(fs.cat_file(f"{bucket}/step-00000002/state.pt"))
    data[100] ^= 0x01
    fs.pipe_file(f"{bucket}/step-00000002/state.pt", bytes(data))
    fresh = CheckpointManager(bucket, local_dir=str(tmp_path / "b"))
    with caplog.at_level(logging.WARNING, logger="thrifty.checkpointing.store"):
        info = fresh.latest()
    assert info is not None and info.step == 1
    check_state(fresh.load(info), 1)
    assert f"{bucket}/step-00000002" in caplog.text
    assert not os.path.exists(tmp_path / "b" / "step-00000002" / "manifest.json")


def test_credentials_in_the_url_never_reach_logs_errors_or_manifests(tmp_path, make_state, caplog):
    url = "memory://AKIAEXAMPLE:TopSecret42@thrifty-tests/redaction"
    with caplog.at_level(logging.DEBUG, logger="thrifty"):
        with CheckpointManager(url, local_dir=str(tmp_path)) as manager:
            manager.save(1, make_state(1))
        info = manager.latest()
    assert info is not None
    seen = " ".join([caplog.text, repr(manager), manager.location, info.uri])
    for path in tmp_path.rglob("manifest.json"):
        seen += path.read_text()
    assert "TopSecret42" not in seen and "AKIAEXAMPLE" not in seen
    fsspec.filesystem("memory").rm(url.split("://")[1].split("/")[0], recursive=True)


def test_redact_strips_user_and_secret_and_signed_query_values():
    assert redact("s3://AKIA:se/cr+et@bucket/run") == "s3://bucket/run"
    signed = redact("error at https://u:p@host/x?X-Amz-Signature=abc&a=1")
    assert signed.startswith("error at https://host/x?X-Amz-Signature=") and signed.endswith("&a=1")
    assert "abc" not in signed and "u:p" not in signed
    assert redact("/plain/local/path") == "/plain/local/path"


def test_open_storage_picks_os_for_paths_and_fsspec_for_urls(tmp_path):
    assert isinstance(open_storage(str(tmp_path)), LocalStorage)
    assert isinstance(open_storage("memory://x/y"), FsspecStorage)


def test_importing_thrifty_checkpoint_does_not_import_fsspec():
    code = (
        "import sys, thrifty.checkpointing.store, thrifty.checkpointing.saving.preemption; "
        "print(sorted(m for m in ('fsspec', 's3fs', 'botocore') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_missing_fsspec_says_the_exact_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'thrifty\[s3\]'"):
        open_storage("s3://bucket/run")


def test_each_location_gets_a_filesystem_of_its_own_not_fsspecs_cached_one():
    """fsspec hands back the instance it cached for the same options, built under the
    environment of its first use: a location opened after AWS_ENDPOINT_URL changed went to
    the first endpoint (to AWS itself, where the first use had none)."""
    pytest.importorskip("s3fs")
    from thrifty.checkpointing.store.storage import FsspecStorage

    first, second = FsspecStorage("s3://bucket/run"), FsspecStorage("s3://bucket/run")
    assert first.fs is not second.fs
