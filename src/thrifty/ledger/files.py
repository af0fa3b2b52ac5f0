"""Reading a run folder without being stopped by what it holds: regular files only.

A folder of runs is anyone's: a FIFO, a device or a socket can carry the name of a file the
ledger reads (config.toml, .thrifty.lock, manifest.json, metrics.jsonl, summary.json).
Opening a FIFO for reading waits for a writer that never comes, and a device can be
endless. So each file is looked at first (`os.stat`, following a link to what it names) and
opened only when it is a regular file; the open itself does not wait (`O_NONBLOCK`) and the
descriptor is checked again, so a file swapped between the look and the open is refused too.
"""

from __future__ import annotations

import os
import stat

# What `os.stat` says a path is, in words, for the line that refuses it.
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


class NotAFile(OSError):
    """A path that is there but is not a regular file: the message says what it is."""


def kind(mode: int) -> str:
    """What a file of `mode` (st_mode) is, in words."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def regular(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names a regular file (a link to one counts); False when absent. A
    FIFO, device or socket is False: it is never opened."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def check_regular(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a regular file, False when nothing is there; `NotAFile` (saying
    what it is) when something else carries the name."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise NotAFile(f"{path} is {kind(mode)}, not a file thrifty wrote")
    return True


def read_bytes(path: str | os.PathLike[str], limit: int | None = None) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them (None: all).
    `NotAFile` when `path` is anything else; the file is then never opened for reading
    (a FIFO's writer is never waited for)."""
    if not check_regular(path):
        raise FileNotFoundError(2, "No such file or directory", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped after the look: still not waited on
            raise NotAFile(f"{path} is {kind(mode)}, not a file thrifty wrote")
        return f.read() if limit is None else f.read(limit)


def read_text(path: str | os.PathLike[str]) -> str:
    """`read_bytes` decoded as UTF-8 (`ValueError` when it is not)."""
    return read_bytes(path).decode("utf-8")
