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

from thrifty.checkpointing.store.errors import CheckpointError
from thrifty.checkpointing.store.manifest import MANIFEST
from thrifty.checkpointing.store.storage import is_remote, redact, storage_error
from thrifty.ledger.figures import damaged
from thrifty.ledger.files import NotAFile, read_bytes
from thrifty.redact import url_secrets

LEASE = ".thrifty-lease.json"  # thrifty.rundir.holder.LEASE_FILE
_STEP = re.compile(r"^step-(\d{8,})$")
_SMALL = 1 << 20  # bytes: a manifest or a lease is a few kB; more is not one thrifty wrote
# What each figure of a manifest's cost record must be (thrifty.ledger.figures.fits).
RECORD_FIGURES = {
    "seconds": "seconds", "wasted_seconds": "seconds", "redone_steps": "count", "gpus": "gpus",
    "usd_per_hour": "rate", "on_demand_usd_per_hour": "rate",
}  # fmt: skip


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
    skipped: tuple[str, ...] = field(default=())  # one line for each record left out

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
    return [_location(fs, root, display, base, objects) for base, objects in sorted(groups.items())]


def _open(where: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str, str]:
    """The file system (fsspec's for a URL, this machine's for a path), the root path in it,
    and the location as it may be shown."""
    if not is_remote(where):
        root = os.path.abspath(where)
        return _LocalFiles(), root, root
    if where.lower().startswith("file://"):  # this machine's disk: FIFOs and devices refused
        return (
            _LocalFiles(),
            os.path.abspath(where[len("file://") :]).rstrip("/"),
            where.rstrip("/"),
        )
    from thrifty.checkpointing.store.storage import FsspecStorage

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
        for folder, _, files in os.walk(root):  # links to folders are not followed
            for name in files:
                path = os.path.join(folder, name)
                try:
                    found[path] = {"type": "file", "size": os.path.getsize(path)}
                except OSError:
                    continue  # removed while listing: a save being pruned
        return found

    def cat_file(self, path: str) -> bytes:
        return read_bytes(path, _SMALL)  # a FIFO or a device is refused, never opened


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
    skipped: list[str] = []
    checkpoints = {
        step: _checkpoint(fs, (where, url), step, keys, objects, skipped)
        for step, keys in sorted(steps.items())
    }
    holder = _holder(fs, f"{where}/{LEASE}") if LEASE in objects else None
    return Location(
        url, checkpoints, sum(objects.values()), holder, tuple(sorted(other)), tuple(skipped)
    )


def _checkpoint(
    fs: Any,
    at: tuple[str, str],
    step: int,
    keys: list[str],
    objects: dict[str, int],
    skipped: list[str],
) -> Checkpoint:
    """The step folder `keys` make under `at` (the path to read, the URL to show); its
    manifest's cost record is left out, with a line in `skipped`, when a figure is damaged."""
    where, url = at
    folder = keys[0].split("/", 1)[0]
    published = f"{folder}/{MANIFEST}" in objects
    shown = f"{url}/{folder}/{MANIFEST}"
    manifest = (
        _small_json(fs, f"{where}/{folder}/{MANIFEST}", shown, skipped) if published else None
    )
    record = (manifest or {}).get("record")
    if record is not None and not isinstance(record, dict):
        skipped.append(f"{shown}: record is not a table: its cost record is skipped")
        record = None
    problem = damaged(record, RECORD_FIGURES) if record is not None else None
    if problem is not None:
        skipped.append(f"{shown}: record.{problem}: its cost record is skipped")
        record = None
    return Checkpoint(
        step,
        published,
        _created((manifest or {}).get("created")),
        sum(objects[k] for k in keys),
        tuple(sorted(keys)),
        record,
    )


def _small_json(
    fs: Any, path: str, shown: str | None = None, skipped: list[str] | None = None
) -> dict[str, Any] | None:
    """A small JSON object thrifty wrote (a manifest, the lease); None when unreadable. A
    FIFO, device or socket by its name is never opened: a line in `skipped` says so."""
    try:
        data = json.loads(fs.cat_file(path))
    except NotAFile as exc:
        if skipped is not None:
            skipped.append(
                f"{shown or path}: {str(exc).split(' is ', 1)[-1]}: skipped, never opened"
            )
        return None
    except (OSError, ValueError, RecursionError, CheckpointError):
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
