"""Where checkpoints live: a string URI. Local paths go through `os`; URLs through fsspec.

fsspec (and s3fs, gcsfs, ...) is imported only when a URL is opened, so importing thrifty stays
cheap and local-only users never need it. Every failure leaves here as a `CheckpointError` whose
one-line message names the (redacted) location and the fix; network trouble is a
`TransientStorageError`, which is the only kind the caller retries.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from thrifty.checkpointing.store.errors import CheckpointError, TransientStorageError
from thrifty.errors import MissingDependencyError
from thrifty.redact import redact_known, url_secrets

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Secrets may contain "/", so anything up to an "@" counts (over-redacting a path is harmless).
_USERINFO = re.compile(r"://[^@\s]*@")
_SECRET_QUERY = re.compile(
    r"(?i)([?&][^=&\s]*(?:sig|signature|token|secret|password|passwd|key|credential)[^=&\s]*=)"
    r"[^&\s]*"
)

# Protocol -> the extra that installs its fsspec implementation.
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}

_CREDENTIAL_ERRORS = {
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "DefaultCredentialsError",
    "RefreshError",
}
# Exception class names (from botocore, aiohttp, urllib3, fsspec) that mean "try again later".
# Matched by name so that classifying an error never imports those packages.
_TRANSIENT_ERRORS = {
    "ConnectionError",
    "EndpointConnectionError",
    "ConnectionClosedError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "HTTPClientError",
    "ClientConnectorError",
    "ClientOSError",
    "ServerDisconnectedError",
    "ServerTimeoutError",
    "ClientPayloadError",
    "FSTimeoutError",
    "IncompleteRead",
    "ProtocolError",
    "ResponseParserError",
}
_TRANSIENT_ERRNOS = {
    errno.EAGAIN,
    errno.EBUSY,  # s3fs: SlowDown, ServiceUnavailable (HTTP 503)
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.EHOSTUNREACH,
    errno.ENETDOWN,
    errno.ENETUNREACH,
    errno.EPIPE,
    errno.ETIMEDOUT,
    getattr(errno, "EREMOTEIO", 121),  # s3fs: InternalError (HTTP 500)
}


def is_remote(uri: str) -> bool:
    """True for a URL (`s3://...`, `memory://...`, `file://...`), False for a plain path."""
    return bool(_URL.match(uri))


def redact(text: str) -> str:
    """Remove `user:secret@` and secret-looking query values from every URL in `text`."""
    from thrifty.redact import redact_text  # the one redaction everything written goes through

    return redact_text(text)


class Storage(Protocol):
    """A checkpoint location. `rel` paths are '/'-separated and relative to the root."""

    uri: str

    def list(self, rel: str = "") -> list[str]:
        """Names directly under `rel`; empty when it does not exist."""
        ...

    def read_bytes(self, rel: str) -> bytes:
        """The file's bytes; raises FileNotFoundError when it does not exist."""
        ...

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write a small file; readers see the old file or the whole new one."""
        ...

    def upload(self, local_path: str, rel: str) -> None:
        """Copy a local file to `rel`."""
        ...

    def download(self, rel: str, local_path: str) -> None:
        """Copy `rel` to a local file."""
        ...

    def size(self, rel: str) -> int:
        """Size of `rel` in bytes."""
        ...

    def delete(self, rel: str) -> None:
        """Delete a file or a folder tree; missing is fine."""
        ...


def open_storage(uri: str, storage_options: Mapping[str, Any] | None = None) -> Storage:
    """Open a checkpoint location: a local directory or any fsspec URL."""
    if is_remote(uri):
        return FsspecStorage(uri, storage_options)
    if storage_options:
        raise CheckpointError(
            f"checkpoint.storage_options were given but {uri} is a local path: "
            "drop them or use a URL such as s3://bucket/run"
        )
    return LocalStorage(uri)


# --- local files -------------------------------------------------------------------------------


def fsync_dir(path: str) -> None:
    """Make a rename inside `path` durable (a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[str]:
    """A temporary name beside `path` to write and fsync; then it is renamed over `path` and
    the folder fsynced, so `path` is never seen half written.

    A failed write (a full disk) removes its temporary file: it would hold the space it lacked.
    """
    tmp = f"{path}.tmp"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(path))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically (see `_replacing`)."""
    with _replacing(path) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_copy(src: str, dst: str) -> None:
    """Copy the local file `src` to `dst` atomically (see `_replacing`)."""
    with _replacing(dst) as tmp:
        shutil.copyfile(src, tmp)
        fsync_file(tmp)


def local_error(
    exc: OSError, action: str, path: str, *, needs_bytes: int | None = None
) -> CheckpointError:
    """A one-line error for a failed local file operation, with the fix.

    `needs_bytes` is what the operation was about to write, named on a full disk.
    """
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CheckpointError(
            f"no space left on the disk holding {path} ({_space(path, needs_bytes)}) to {action}: "
            "free space, lower checkpoint.keep_last, or point checkpoint.local_dir at a larger disk"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CheckpointError(
            f"cannot {action}: {path} is not writable ({exc.strerror}): fix its permissions "
            "or choose another checkpoint directory"
        )
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return CheckpointError(
            f"cannot {action} at {path}: {_file_in_the_way(path)} is a file, not a directory: "
            "move it or choose another checkpoint directory"
        )
    return CheckpointError(f"cannot {action} at {path}: {exc.strerror or exc}")


def _space(path: str, needs_bytes: int | None) -> str:
    """`needs 210 MB, 12 MB free`, as far as is known (MB are 10**6 bytes)."""
    parts = [] if needs_bytes is None else [f"needs {_mb(needs_bytes)}"]
    existing = _first_existing(path)
    with contextlib.suppress(OSError):
        parts.append(f"{_mb(shutil.disk_usage(existing).free)} free")
    return ", ".join(parts) or "disk full"


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n < 10_000_000 else f"{n / 1e6:.0f} MB"


def _first_existing(path: str) -> str:
    while path and not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _file_in_the_way(path: str) -> str:
    """The first existing part of `path` (itself or a parent): the file a folder was needed at."""
    existing = _first_existing(path)
    return existing if not os.path.isdir(existing) else path


class LocalStorage:
    """A directory on this machine's file system."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.uri = self.root

    def path(self, rel: str = "") -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def list(self, rel: str = "") -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_bytes(self, rel: str) -> bytes:
        with open(self.path(rel), "rb") as f:
            return f.read()

    def write_bytes(self, rel: str, data: bytes) -> None:
        self._put(rel, "write a checkpoint file", lambda path: atomic_write_bytes(path, data))

    def upload(self, local_path: str, rel: str) -> None:
        self._put(rel, "copy a checkpoint file", lambda path: atomic_copy(local_path, path))

    def _put(self, rel: str, action: str, write: Callable[[str], None]) -> None:
        """Create `rel`'s folder, then `write(path)`; an OSError becomes one line naming `action`."""
        path = self.path(rel)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write(path)
        except OSError as exc:
            raise local_error(exc, action, path) from exc

    def download(self, rel: str, local_path: str) -> None:
        shutil.copyfile(self.path(rel), local_path)

    def size(self, rel: str) -> int:
        return os.path.getsize(self.path(rel))

    def delete(self, rel: str) -> None:
        path = self.path(rel)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise local_error(exc, "delete an old checkpoint", path) from exc


# --- fsspec URLs -------------------------------------------------------------------------------


class FsspecStorage:
    """Any fsspec URL: s3://, gs://, memory://, file://, ...

    `storage_options` go to the fsspec filesystem (e.g. key, secret, client_kwargs); their
    values are never logged or written anywhere.
    """

    def __init__(self, uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.display = redact(self.uri)
        self._secrets = url_secrets(self.uri)
        self.protocol = self.uri.split("://", 1)[0].lower()
        extra = _EXTRAS.get(self.protocol, "s3")
        try:
            import fsspec
            import fsspec.core
        except ImportError as exc:
            raise MissingDependencyError(
                f"checkpoint location {self.display} needs fsspec: pip install 'thrifty[{extra}]'"
            ) from exc
        # A filesystem of its own: fsspec hands back a cached instance for the same options,
        # built under the credentials and endpoint (AWS_ENDPOINT_URL, ...) of its first use.
        options = {"skip_instance_cache": True, **dict(storage_options or {})}
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.uri, **options)
        except ImportError as exc:
            raise MissingDependencyError(
                f"checkpoint location {self.display} needs the {self.protocol}:// filesystem "
                f"({redact_known(str(exc), self._secrets).splitlines()[0]}): "
                f"pip install 'thrifty[{extra}]'"
            ) from exc
        except ValueError as exc:
            raise CheckpointError(
                f"cannot open checkpoint location {self.display}: "
                f"{redact_known(str(exc), self._secrets)}: "
                "use a local path or an fsspec URL such as s3://bucket/run"
            ) from exc
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        # Object stores have no folders; a local file system needs them before a write.
        self._needs_dirs = "file" in protocols or "local" in protocols

    def _path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}" if rel else self.root

    def _where(self, rel: str) -> str:
        return f"{self.display}/{rel}" if rel else self.display

    @contextlib.contextmanager
    def _errors(self, action: str, rel: str, missing: bool = False) -> Iterator[None]:
        """Translate errors; with `missing`, FileNotFoundError passes through as "not there"."""
        try:
            yield
        except CheckpointError:
            raise
        except FileNotFoundError as exc:
            if missing:
                raise
            raise storage_error(
                exc, action, self._where(rel), self.protocol, self._secrets
            ) from exc
        except Exception as exc:
            raise storage_error(
                exc, action, self._where(rel), self.protocol, self._secrets
            ) from exc

    def list(self, rel: str = "") -> list[str]:
        path = self._path(rel)
        with self._errors("list", rel):
            # Another process (the run before a restart) may have written since we last looked.
            self.fs.invalidate_cache(path)
            try:
                entries = self.fs.ls(path, detail=False)
            except (FileNotFoundError, NotADirectoryError):
                return []
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries)

    def read_bytes(self, rel: str) -> bytes:
        with self._errors("read", rel, missing=True):
            try:
                return bytes(self.fs.cat_file(self._path(rel)))
            except IsADirectoryError as exc:
                raise FileNotFoundError(self._where(rel)) from exc

    def write_bytes(self, rel: str, data: bytes) -> None:
        with self._errors("write", rel):
            self.fs.pipe_file(self._writable_path(rel), data)

    def upload(self, local_path: str, rel: str) -> None:
        with self._errors("upload", rel):
            self.fs.put_file(local_path, self._writable_path(rel))

    def _writable_path(self, rel: str) -> str:
        """`rel`'s full path, its folder created first where the file system needs one."""
        path = self._path(rel)
        if self._needs_dirs:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        return path

    def download(self, rel: str, local_path: str) -> None:
        with self._errors("download", rel):
            self.fs.get_file(self._path(rel), local_path)

    def size(self, rel: str) -> int:
        path = self._path(rel)
        with self._errors("inspect", rel):
            self.fs.invalidate_cache(path)
            return int(self.fs.info(path)["size"])

    def delete(self, rel: str) -> None:
        path = self._path(rel)
        with self._errors("delete", rel):
            try:
                self.fs.rm(path, recursive=True)
            except FileNotFoundError:
                pass


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__]


def _credentials_fix(protocol: str) -> str:
    if protocol in ("s3", "s3a"):
        return (
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
            "or pass key and secret in checkpoint.storage_options"
        )
    if protocol in ("gs", "gcs"):
        return "run 'gcloud auth application-default login' or set GOOGLE_APPLICATION_CREDENTIALS"
    return "pass credentials in checkpoint.storage_options"


def storage_error(
    exc: BaseException, action: str, where: str, protocol: str, secrets: tuple[str, ...] = ()
) -> CheckpointError:
    """Classify an fsspec/cloud error into a one-line transient or permanent CheckpointError.
    `secrets`: the location's credentials (`url_secrets`), masked wherever the error quotes
    them."""
    chain = list(_causes(exc))
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    first = next((str(e) for e in chain if str(e)), type(exc).__name__)
    reason = redact_known(" ".join(first.split()), secrets)[:200]
    if names & _CREDENTIAL_ERRORS:
        return CheckpointError(
            f"no credentials for {where} ({reason}): {_credentials_fix(protocol)}"
        )
    transient = bool(names & _TRANSIENT_ERRORS) or any(
        isinstance(e, (ConnectionError, TimeoutError))
        or (isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS)
        for e in chain
    )
    if transient:
        return TransientStorageError(
            f"cannot reach {where} ({reason}): check the endpoint URL and the network, "
            "or checkpoint to a local directory"
        )
    if isinstance(exc, PermissionError):
        return CheckpointError(
            f"access denied to {where} ({reason}): give the credentials the right to read, "
            "write, list and delete there, or choose another checkpoint.location"
        )
    if isinstance(exc, FileNotFoundError):
        return CheckpointError(
            f"{where} does not exist ({reason}): create the bucket or fix checkpoint.location"
        )
    return CheckpointError(f"cannot {action} {where}: {reason}")
