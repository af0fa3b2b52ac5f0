"""The files `thrifty launch` writes, and the rule that it replaces only its own.

A job file begins with MARKER (after the `#!` line of a script): `--overwrite` replaces a
file only while that line is there, never one somebody else wrote. The folder that holds
the wheel launch ships (`thrifty.fleet.wheel`) is launch's while FOLDER_MARKER is in it.
Every write goes to a temporary file beside the target, renamed over it when complete: a
reader never sees half a file, and a link at the target is never followed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from thrifty.errors import ThriftyError

MARKER = "# Written by thrifty launch: --overwrite replaces this file only while this line is here."
FOLDER_MARKER = "WRITTEN-BY-THRIFTY"
FOLDER_NOTE = (
    "thrifty launch keeps here the thrifty it ships to the machines (a wheel); it replaces "
    "files in this folder only while this file is here.\n"
)


def _found(path: Path) -> str:
    """What is at `path`, in words, for a refusal."""
    if path.is_symlink():
        return "a symbolic link"
    if path.is_dir():
        return "a directory"
    return "a file" if path.is_file() else "a special file"


def written_by_thrifty(path: Path) -> bool:
    """The file's first line (its second after a `#!` line) is launch's MARKER."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return False
    lines = head[1:2] if head[:1] and head[0].startswith("#!") else head[:1]
    return lines == [MARKER]


def check_job_file(out: Path, overwrite: bool) -> None:
    """Refuse, before anything is written, an --out launch may not replace."""
    if out.is_symlink() or (out.exists() and not out.is_file()):
        raise ThriftyError(f"--out {out} is {_found(out)}: give the path of a file")
    if not out.exists():
        return
    if not overwrite:
        raise ThriftyError(f"{out} exists: give --overwrite to replace it, or another --out")
    if not written_by_thrifty(out):
        raise ThriftyError(
            f"{out} is a file thrifty did not write (it does not begin with thrifty launch's "
            "marker line): --overwrite replaces only a job file launch wrote; move it away "
            "or give another --out"
        )


def check_own_folder(folder: Path, shown: str) -> None:
    """Refuse a folder launch would write into that is not launch's (`shown`: its name in
    the message)."""
    if not folder.exists() and not folder.is_symlink():
        return
    why = "thrifty launch keeps the thrifty it ships to the machines in a folder of that name"
    if folder.is_symlink() or not folder.is_dir():
        raise ThriftyError(
            f"{shown} is {_found(folder)} thrifty did not write: move it away ({why})"
        )
    if not (folder / FOLDER_MARKER).is_file():
        raise ThriftyError(
            f"{shown} is a folder thrifty did not write (it has no {FOLDER_MARKER} file): "
            f"move it away ({why})"
        )


def make_own_folder(folder: Path) -> bool:
    """Create launch's folder (checked with `check_own_folder`); True when it was created."""
    if folder.is_dir():
        return False
    folder.mkdir(parents=True)
    write_atomic(folder / FOLDER_MARKER, FOLDER_NOTE.encode())
    return True


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write `data` to `path` through a temporary file renamed over it. `mode`: the file's
    permissions before the umask."""
    if path.exists() and not path.is_file():
        raise ThriftyError(f"{path} is {_found(path)}: move it away")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, mode & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
