"""What the commands share: the usage exit code, progress lines, and their `--out` folder.

Cheap to import: `thrifty --help` loads it with every command.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from thrifty.errors import ThriftyError

EXIT_USAGE = 2  # bad input: the command printed one line naming the problem and the fix


def say(command: str, message: str) -> None:
    """One progress line on stderr, `thrifty COMMAND: message`; stdout is kept for the report."""
    print(f"thrifty {command}: {message}", file=sys.stderr, flush=True)


def dash(value: Any) -> str:
    """A table cell: `-` for a value that is missing."""
    return "-" if value is None else str(value)


def refuse_file(out: Path) -> None:
    """`--out` must be a folder (or not exist yet)."""
    if out.exists() and not out.is_dir():
        raise ThriftyError(f"--out {out} is a file: give a directory")


def prepare_out(out: Path, replace: Iterable[Path] = ()) -> None:
    """Create `--out`, once `replace` (what an earlier run of the same command left in it, the
    command has checked) is deleted."""
    for path in replace:
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ThriftyError(f"cannot create --out {out}: {exc.strerror}") from exc
