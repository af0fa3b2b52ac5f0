"""The manifest: the small file written last that makes a checkpoint count.

A checkpoint folder holds its data files and `manifest.json` (step, file names, sizes, sha256,
thrifty and torch versions, creation time, metric, and the run's cost record as of this save:
what `thrifty runs` reads from a bucket without downloading a checkpoint). Readers trust a folder only through its
manifest, and only when every file matches it byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from thrifty.checkpointing.store.errors import CorruptCheckpointError
from thrifty.checkpointing.store.storage import Storage, redact

log = logging.getLogger("thrifty.checkpointing.store")

MANIFEST = "manifest.json"
FORMAT = "thrifty-checkpoint"
FORMAT_VERSION = 1
# File names come from a manifest that may have been tampered with: a plain name, or one folder
# and a plain name (a sharded checkpoint's `shards/__0_0.distcp`), never a path that leaves.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_.][A-Za-z0-9_.-]*)?$")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class FileEntry:
    """One data file of a checkpoint: its name in the folder, size in bytes and sha256 (hex)."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """What a published checkpoint contains. `created` is UTC ISO 8601; lower `metric` is better."""

    step: int
    files: tuple[FileEntry, ...]
    created: str
    metric: float | None = None
    thrifty_version: str = "unknown"
    torch_version: str = "unknown"
    # What the run had paid when it saved (thrifty.measure.cost.CostMeter.record): plain
    # numbers and words, read by the ledger; None when the run has no price.
    record: dict[str, Any] | None = None

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "step": self.step,
            "created": self.created,
            "metric": self.metric,
            "thrifty_version": self.thrifty_version,
            "torch_version": self.torch_version,
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256} for f in self.files],
        }
        if self.record is not None:
            doc["record"] = self.record
        return (json.dumps(doc, indent=2) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> Manifest:
        """Parse a manifest; anything malformed is a CorruptCheckpointError naming `where`."""
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format is {doc.get('format')!r}, not {FORMAT!r}")
            if doc.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format_version {doc.get('format_version')!r} is not supported")
            files = tuple(_file_entry(f) for f in doc["files"])
            metric = doc.get("metric")
            record = doc.get("record")
            return cls(
                step=_int(doc["step"]),
                files=files,
                created=str(doc.get("created", "")),
                metric=None if metric is None else float(metric),
                thrifty_version=str(doc.get("thrifty_version", "unknown")),
                torch_version=str(doc.get("torch_version", "unknown")),
                record=record if isinstance(record, dict) else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptCheckpointError(f"{where} is not a valid manifest ({exc})") from exc


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a non-negative integer, got {value!r}")
    return value


def _file_entry(doc: Any) -> FileEntry:
    name = doc["name"]
    if (
        not isinstance(name, str)
        or not _SAFE_NAME.match(name)
        or name == MANIFEST
        or any(part in (".", "..") for part in name.split("/"))
    ):
        raise ValueError(f"file name {name!r} is not a plain file name")
    sha = doc["sha256"]
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise ValueError(f"sha256 of {name} is malformed")
    return FileEntry(name, _int(doc["size"]), sha)


def clean_metric(metric: float | None) -> float | None:
    """A finite float, or None: NaN or inf cannot rank checkpoints, so they are not recorded."""
    if metric is None:
        return None
    value = float(metric)
    return value if math.isfinite(value) else None


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_file(path: str, entry: FileEntry, *, where: str) -> None:
    """Raise CorruptCheckpointError naming `where` unless `path` matches `entry`."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{where} is missing") from None
    if size != entry.size:
        raise CorruptCheckpointError(
            f"{where} is {size} bytes but its manifest says {entry.size} (truncated or replaced)"
        )
    if sha256_file(path) != entry.sha256:
        raise CorruptCheckpointError(
            f"{where} does not match the sha256 in its manifest (corrupted)"
        )


def verify_dir(directory: str, manifest: Manifest, *, where: str) -> None:
    """Check every file of a local checkpoint folder against its manifest."""
    for entry in manifest.files:
        check_file(os.path.join(directory, entry.name), entry, where=f"{where}/{entry.name}")


def read_manifest(directory: str, *, where: str) -> Manifest | None:
    """The manifest of a local folder, None if it has none (not published)."""
    try:
        with open(os.path.join(directory, MANIFEST), "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return Manifest.from_json(data, where=f"{where}/{MANIFEST}")


# --- checkpoints in a storage location -----------------------------------------------------------

_STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(step: int) -> str:
    """Folder name of a checkpoint: `step-00000120`."""
    return f"step-{step:08d}"


def step_of(name: str) -> int | None:
    """The step a checkpoint folder's name (`step-00000120`) says; None for another name."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def read_published(storage: Storage, step: int) -> Manifest | None:
    """The manifest of checkpoint `step` in `storage`; None when it has none (not published)."""
    name = step_dir(step)
    try:
        data = storage.read_bytes(f"{name}/{MANIFEST}")
    except (FileNotFoundError, NotADirectoryError):
        return None
    where = f"{redact(storage.uri)}/{name}"
    manifest = Manifest.from_json(data, where=f"{where}/{MANIFEST}")
    if manifest.step != step:
        raise CorruptCheckpointError(f"{where} holds a manifest for step {manifest.step}")
    return manifest


class Listing(NamedTuple):
    """The checkpoint folders of a location, by step.

    `published`: step -> manifest; `orphans`: folders with no manifest (a save that never
    finished); `damaged`: step -> why its manifest could not be read. A damaged folder may
    still be a checkpoint someone wants back, so nothing deletes it.
    """

    published: dict[int, Manifest]
    orphans: list[int]
    damaged: dict[int, str]


def scan(storage: Storage, *, warn: bool = False) -> Listing:
    """The published, unfinished and damaged checkpoint folders of `storage`; `warn` logs each
    damaged one by name."""
    listing = Listing({}, [], {})
    for name in storage.list():
        step = step_of(name)
        if step is None:
            continue
        try:
            manifest = read_published(storage, step)
        except CorruptCheckpointError as exc:
            if warn:
                log.warning("skipping checkpoint %s/%s: %s", redact(storage.uri), name, exc)
            listing.damaged[step] = str(exc)
            continue
        if manifest is None:
            listing.orphans.append(step)
        else:
            listing.published[step] = manifest
    return listing
