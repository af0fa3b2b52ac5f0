"""How thrifty tells the files it wrote from anyone else's: it replaces or deletes only its own.

Each file a run writes carries a sign of where it came from: config.toml opens with
`CONFIG_HEADER`, a report holds `REPORT_MARK` in its <head>, summary.json and diagnosis.json
hold keys only thrifty writes, metrics.jsonl holds step records. Files written before those
marks existed are recognised by their shape: a config with every section thrifty writes, a
page titled "thrifty report: ...".

Cheap to import (no torch): the report and the run directory both ask.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CONFIG_HEADER = "# Written by thrifty"
CONFIG_HEADER_LINE = (
    f"{CONFIG_HEADER}: the config this run last ran with; `thrifty train config.toml` runs it "
    "again.\n"
)
REPORT_MARK = '<meta name="generator" content="thrifty">'
# A config.toml written before the header existed: TrainConfig.to_dict writes every section.
_CONFIG_SECTIONS = ("run", "precision", "batch", "optimizer", "schedule", "checkpoint", "spot")
_OLD_REPORT_TITLE = "<title>thrifty report: "
_HEAD_BYTES = 8192  # a report's <head> (its title and mark) comes before its inline CSS
SUMMARY_KEY = "stop_reason"  # summary.json: every finished run says why it stopped
DIAGNOSIS_KEY = "bottleneck"  # diagnosis.json: what limited the step


def _head(path: Path, size: int = _HEAD_BYTES) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(size).decode("utf-8", errors="replace")
    except OSError:
        return None


def is_own_report(path: str | os.PathLike[str]) -> bool:
    """An HTML page `thrifty report` (or a run's end) wrote."""
    head = _head(Path(path))
    if head is None:
        return False
    if REPORT_MARK in head:
        return True
    return head.lstrip().startswith("<!DOCTYPE html>") and _OLD_REPORT_TITLE in head


def is_own_config(path: str | os.PathLike[str]) -> bool:
    """A run's config.toml as thrifty writes it: with its header, or (written before the header
    existed) valid TOML holding every section a resolved config has."""
    head = _head(Path(path), len(CONFIG_HEADER))
    if head is None:
        return False
    if head.startswith(CONFIG_HEADER):
        return True
    from thrifty.config import toml_loads

    try:
        tables = toml_loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return all(isinstance(tables.get(name), dict) for name in _CONFIG_SECTIONS)


def is_own_metrics(path: str | os.PathLike[str]) -> bool:
    """A metrics.jsonl thrifty writes: empty (opened, nothing flushed yet) or holding at least
    one step record, whatever damage surrounds it."""
    try:
        with open(path, "rb") as f:
            if not f.read(1):
                return True
            f.seek(0)
            return any(_is_record(line) for line in f)
    except OSError:
        return False


def _is_record(line: bytes) -> bool:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(record, dict) and type(record.get("step")) is int


def is_own_json(path: str | os.PathLike[str], key: str) -> bool:
    """A JSON file thrifty writes: one object holding `key` (SUMMARY_KEY, DIAGNOSIS_KEY)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and key in data
