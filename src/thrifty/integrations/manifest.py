"""A framework's checkpoint made trusted: the manifest written after the framework's save
returned (`MANIFEST` inside a folder, `<file>.json` beside a file), listing every file with its
size, each file flushed to disk first; and the check that a checkpoint's files still match it.
A checkpoint without one, or whose files do not match it, is a save cut short: it is never
resumed from."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from thrifty.checkpointing.store.storage import fsync_file

log = logging.getLogger("thrifty")

MANIFEST = "thrifty-manifest.json"
MANIFEST_FORMAT = "thrifty-integration/1"


def publish(path: Path, step: int, framework: str) -> None:
    """Make the framework's checkpoint at `path` (a folder, or one file) trusted: flush its
    files to disk, then write the manifest listing them with their sizes."""
    files = _files(path)
    for file in files.values():
        fsync_file(str(file))
    record = {
        "format": MANIFEST_FORMAT,
        "framework": framework,
        "step": step,
        "files": {name: file.stat().st_size for name, file in files.items()},
    }
    target = manifest_of(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    fsync_file(str(tmp))
    os.replace(tmp, target)
    fsync_file(str(target.parent))


def manifest_of(path: Path) -> Path:
    """Where the manifest of a checkpoint folder (inside it) or file (beside it) is."""
    return path / MANIFEST if path.is_dir() else path.with_name(path.name + ".json")


def _files(path: Path) -> dict[str, Path]:
    if not path.is_dir():
        return {path.name: path}
    return {
        str(f.relative_to(path)): f
        for f in sorted(path.rglob("*"))
        if f.is_file() and not f.is_symlink() and f.name != MANIFEST
    }


def complete(path: Path) -> str | None:
    """None when `path` is a complete checkpoint (its manifest matches its files), else why
    not, in words."""
    try:
        record = json.loads(manifest_of(path).read_text())
        files = record["files"]
        if record.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            return "its manifest is not thrifty's"
    except FileNotFoundError:
        return "it has no manifest (a save cut short, or one written without thrifty)"
    except (OSError, ValueError, KeyError, TypeError):
        return "its manifest is damaged"
    root = path if path.is_dir() else path.parent
    for name, size in files.items():
        file = root / name
        try:
            if file.stat().st_size != size:
                return f"{name} is {file.stat().st_size} bytes, not the {size} saved"
        except OSError:
            return f"{name} is missing"
    return None


def newest_complete(candidates: Iterable[tuple[int, Path]]) -> Path | None:
    """The complete checkpoint of the highest step among (step, path); one line for each
    newer one passed over."""
    for _, path in sorted(candidates, key=lambda c: c[0], reverse=True):
        why = complete(path)
        if why is None:
            return path
        log.warning("checkpoint %s is not resumed from: %s", path, why)
    return None
