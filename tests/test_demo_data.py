"""The demo's text: the standard library's source files in a fixed order, read only as far as a
split needs."""

from __future__ import annotations

import os
import sysconfig
import zlib
from pathlib import Path

from thrifty.demo import data


def test_the_files_are_the_sorted_standard_library_without_packages_or_tests():
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = ("site-packages/", "dist-packages/", "test/", "idlelib/idle_test/")
    everything = sorted(root.rglob("*.py"))
    expected = [p for p in everything if not p.relative_to(root).as_posix().startswith(skipped)]
    assert list(data.stdlib_files()) == expected and len(expected) > 100


def test_a_split_stops_walking_the_library_once_it_has_its_bytes(monkeypatch):
    scanned: list[str] = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda folder: scanned.append(folder) or scandir(folder))
    files = list(data.stdlib_files())
    every_folder = len(scanned)
    scanned.clear()
    train = data.load_split("train", 50_000)
    # The same bytes as the files in order, the validation files left out.
    root = Path(sysconfig.get_paths()["stdlib"])
    in_val = (zlib.crc32(p.relative_to(root).as_posix().encode()) % 1000 < 100 for p in files)
    kept = [p for p, val in zip(files, in_val, strict=True) if not val]
    assert bytes(train.tolist()) == b"".join(p.read_bytes() for p in kept[:40])[:50_000]
    assert 0 < len(scanned) < every_folder / 4
