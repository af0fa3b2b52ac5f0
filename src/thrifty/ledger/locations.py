"""What a checkpoint location keeps: its objects' bytes, its published checkpoints, its lease.

thrifty writes, under a location, one folder per checkpoint, `step-NNNNNNNN/` (state.pt, or
a sharded checkpoint's shards/, and manifest.json written last), and in a bucket the lease
`.thrifty-lease.json`. The ledger lists those keys with their sizes (a listing, not a
download) and reads only the manifests and the lease, which are small. A prefix holding
several runs' locations (`s3://bucket/runs/`) is searched for every folder holding step
folders: each is one location.

Errors reaching a bucket come out as the checkpoint storage's one-line messages (credentials
redacted, with the fix).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from thrifty.checkpoint.errors import CheckpointError
from thrifty.checkpoint.manifest import MANIFEST
from thrifty.checkpoint.storage import is_remote, redact, storage_error
from thrifty.redact import url_secrets

LEASE = ".thrifty-lease.json"  # thrifty.run.holder.LEASE_FILE
_STEP = re.compile(r"^step-(\d{8,})$")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One step folder: its step, whether its manifest is there (published), when the
    manifest says it was written, the bytes of every object in it, and the cost record the
    manifest carries (what the run had paid at this save; None: none)."""

    step: int
    published: bool
    created: datetime | None
    bytes: int
    keys: tuple[str, ...]  # relative to the location
    record: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Location:
    """A checkpoint location: `url` (redacted) or an absolute path, its checkpoints by step,
    every byte thrifty keeps there, and who holds its lease (None: none, or local)."""

    url: str
    checkpoints: dict[int, Checkpoint]
    bytes: int
    holder: str | None = None
    other_keys: tuple[str, ...] = field(default=())

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0].lower() if is_remote(self.url) else "file"

    @property
    def bucket_and_prefix(self) -> tuple[str, str]:
        """("bucket", "path/inside/") of a URL location."""
        rest = self.url.split("://", 1)[1]
        bucket, _, prefix = rest.partition("/")
        return bucket, f"{prefix.rstrip('/')}/" if prefix else ""

    @property
    def published(self) -> list[int]:
        return sorted(s for s, c in self.checkpoints.items() if c.published)

    @property
    def newest_record(self) -> dict[str, Any] | None:
        """The cost record of the newest published checkpoint that has one."""
        for step in reversed(self.published):
            if self.checkpoints[step].record is not None:
                return self.checkpoints[step].record
        return None


def read_location(where: str, storage_options: Mapping[str, Any] | None = None) -> Location | None:
    """The location at `where` (a path or a URL); None when nothing thrifty wrote is there."""
    found = find_locations(where, storage_options, search=False)
    return found[0] if found else None


def find_locations(
    where: str, storage_options: Mapping[str, Any] | None = None, *, search: bool = True
) -> list[Location]:
    """Every location at or under `where` (with `search`; else `where` itself only)."""
    fs, root, display = _open(where, storage_options)
    sizes = _sizes(fs, root, display, url_secrets(where))
    groups: dict[str, dict[str, int]] = {}
    for key, size in sizes.items():
        parts = key.split("/")
        for i, part in enumerate(parts[:-1]):
            if _STEP.match(part) or (i == len(parts) - 2 and part == LEASE):
                break
        else:
            if parts[-1] != LEASE:
                continue
            i = len(parts) - 1
        base = "/".join(parts[:i])
        if base and not search:
            continue
        groups.setdefault(base, {})["/".join(parts[i:])] = size
    return [
        _location(fs, root, display, base, objects) for base, objects in sorted(groups.items())
    ]


def _open(where: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str, str]:
    """The file system (fsspec's for a URL, this machine's for a path), the root path in it,
    and the location as it may be shown."""
    if not is_remote(where):
        root = os.path.abspath(where)
        return _LocalFiles(), root, root
    from thrifty.checkpoint.storage import FsspecStorage

    storage = FsspecStorage(where, storage_options)
    return storage.fs, storage.root.rstrip("/"), storage.display


class _LocalFiles:
    """The three calls the ledger makes of a file system, on this machine's (no fsspec)."""

    def invalidate_cache(self, path: str) -> None:
        pass

    def find(self, root: str, detail: bool = True) -> dict[str, dict[str, Any]]:
        if not os.path.isdir(root):
            raise FileNotFoundError(root)
        found = {}
        for folder, _, files in os.walk(root):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    found[path] = {"type": "file", "size": os.path.getsize(path)}
                except OSError:
                    continue  # removed while listing: a save being pruned
        return found

    def cat_file(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()


def _sizes(fs: Any, root: str, display: str, secrets: tuple[str, ...]) -> dict[str, int]:
    """Every object under `root` and its size, by path relative to it (`secrets`: the URL's
    credentials, masked wherever an error quotes them)."""
    try:
        fs.invalidate_cache(root)
        listing = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    except Exception as exc:
        raise storage_error(exc, "list", display, display.split("://")[0], secrets) from exc
    sizes = {}
    for path, info in listing.items():
        if info.get("type") == "directory":
            continue
        rel = posixpath.relpath(str(path), root) if str(path) != root else ""
        if rel and not rel.startswith(".."):
            sizes[rel] = int(info.get("size") or 0)
    return sizes


def _location(fs: Any, root: str, display: str, base: str, objects: dict[str, int]) -> Location:
    where = f"{root}/{base}" if base else root
    url = f"{display}/{base}" if base else display
    steps: dict[int, list[str]] = {}
    other = []
    for key in objects:
        match = _STEP.match(key.split("/", 1)[0])
        if match is None:
            other.append(key)
        else:
            steps.setdefault(int(match.group(1)), []).append(key)
    checkpoints = {
        step: _checkpoint(fs, where, step, keys, objects) for step, keys in sorted(steps.items())
    }
    holder = _holder(fs, f"{where}/{LEASE}") if LEASE in objects else None
    return Location(url, checkpoints, sum(objects.values()), holder, tuple(sorted(other)))


def _checkpoint(fs: Any, where: str, step: int, keys: list[str], objects: dict[str, int]) -> Checkpoint:
    folder = keys[0].split("/", 1)[0]
    published = f"{folder}/{MANIFEST}" in objects
    manifest = (_small_json(fs, f"{where}/{folder}/{MANIFEST}") if published else None) or {}
    record = manifest.get("record")
    return Checkpoint(
        step,
        published,
        _created(manifest.get("created")),
        sum(objects[k] for k in keys),
        tuple(sorted(keys)),
        record if isinstance(record, dict) else None,
    )


def _small_json(fs: Any, path: str) -> dict[str, Any] | None:
    """A small JSON object thrifty wrote (a manifest, the lease); None when unreadable."""
    try:
        data = json.loads(fs.cat_file(path))
    except (OSError, ValueError, CheckpointError):
        return None
    return data if isinstance(data, dict) else None


def _created(created: Any) -> datetime | None:
    try:
        return datetime.strptime(str(created), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _holder(fs: Any, path: str) -> str | None:
    """Who held the lease last: host, pid and engine job, as the lease says."""
    data = _small_json(fs, path)
    if data is None:
        return None
    words = [f"{k} {data[k]}" for k in ("host", "pid", "job", "attempt") if data.get(k)]
    return redact(", ".join(words)) or None
