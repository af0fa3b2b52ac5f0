"""The thrifty a fleet job installs: the very one that wrote its job file, as a wheel.

No package index needs to hold this thrifty (a development install was never published):
`thrifty launch` packs the running package into `.thrifty-launch/<wheel>` in the directory the
job is submitted from, which SkyPilot uploads as the workdir, and the task's setup installs
that file. The wheel holds the package's files as they are imported here (an editable
install's source tree included, uncommitted edits and all) with the installed distribution's
own metadata (dependencies, extras, the `thrifty` command). The same files give the same
bytes: entries are sorted and dated 1980-01-01.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import os
import stat
import zipfile
from pathlib import Path

from thrifty.errors import ThriftyError
from thrifty.fleet.files import check_own_folder, make_own_folder, write_atomic

DIST = "thrifty"
FOLDER = ".thrifty-launch"
_DATE = (1980, 1, 1, 0, 0, 0)
_WHEEL = "Wheel-Version: 1.0\nGenerator: thrifty launch\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def running_version() -> str:
    """The version of the thrifty running here, as its installed distribution records it."""
    return _distribution().version


def wheel_path(version: str) -> str:
    """Where the wheel lies, relative to the submitting directory (a POSIX path)."""
    return f"{FOLDER}/{DIST}-{version}-py3-none-any.whl"


def _distribution() -> importlib.metadata.Distribution:
    import thrifty

    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ThriftyError(
            "thrifty is not installed as a package here, so launch cannot ship it to the "
            "machines: install it (pip install -e . in its source tree)"
        ) from None
    if dist.version != thrifty.__version__:
        raise ThriftyError(
            f"the thrifty running here ({thrifty.__version__}) is not the installed one "
            f"({dist.version}): reinstall it (pip install -e . in its source tree)"
        )
    return dist


def package_files(root: Path) -> list[str]:
    """The package's files under `root`, relative POSIX paths, sorted: no caches, no
    compiled or hidden files, no editor backups."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        for name in files:
            if name.startswith(".") or name.endswith((".pyc", ".pyo", "~")):
                continue
            found.append((Path(folder) / name).relative_to(root).as_posix())
    return sorted(found)


def build_wheel() -> tuple[str, bytes]:
    """The running thrifty as a wheel: its file name and its bytes."""
    import thrifty

    dist = _distribution()
    metadata = dist.read_text("METADATA")
    if metadata is None:
        raise ThriftyError("thrifty's installed metadata is missing: reinstall it")
    root = Path(thrifty.__file__).parent
    info = f"{DIST}-{dist.version}.dist-info"
    entries = [(f"{DIST}/{rel}", (root / rel).read_bytes()) for rel in package_files(root)]
    entries.append((f"{info}/METADATA", metadata.encode()))
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        entries.append((f"{info}/entry_points.txt", entry_points.encode()))
    entries.append((f"{info}/WHEEL", _WHEEL.encode()))
    record = "".join(f"{name},{_digest(data)},{len(data)}\n" for name, data in entries)
    entries.append((f"{info}/RECORD", f"{record}{info}/RECORD,,\n".encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            entry = zipfile.ZipInfo(name, date_time=_DATE)
            entry.external_attr = (stat.S_IFREG | 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    return Path(wheel_path(dist.version)).name, buffer.getvalue()


def _digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def check_ship(cwd: Path) -> None:
    """Refuse, before anything is written, a FOLDER in `cwd` that launch did not write."""
    check_own_folder(cwd / FOLDER, FOLDER)
    _distribution()


def ship(cwd: Path) -> tuple[str, bool]:
    """Write the running thrifty's wheel into `cwd`/FOLDER (launch's own: see
    `check_ship`). Returns its path relative to `cwd` and whether the folder was created."""
    created = make_own_folder(cwd / FOLDER)
    name, data = build_wheel()
    write_atomic(cwd / FOLDER / name, data)
    return f"{FOLDER}/{name}", created
