"""Config files: TOML in and out, `--set section.key=value` overrides, flattened keys."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from thrifty.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


HISTORY_TABLE = "config_changes"


def toml_loads(text: str) -> dict[str, Any]:
    """Parse TOML text; malformed text raises ValueError (tomllib.TOMLDecodeError)."""
    return tomllib.loads(text)


def parse_override_value(text: str) -> Any:
    """A TOML value when the text parses as one (`8`, `1e-3`, `true`, `[1, 2]`), else the string."""
    try:
        return toml_loads(f"v = {text}")["v"]
    except Exception:
        return text


def apply_overrides(
    data: Mapping[str, Any], overrides: Iterable[tuple[str, Any]]
) -> dict[str, Any]:
    """Set `section.key` values in a nested dict; string values are parsed as TOML values."""
    result = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for dotted, raw in overrides:
        parts = dotted.split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(
                f"override {dotted!r} is invalid: use section.key=value, e.g. batch.micro=8"
            )
        value = parse_override_value(raw) if isinstance(raw, str) else raw
        table = result
        for part in parts[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(f"override {dotted!r} is invalid: {part} is not a section")
        table[parts[-1]] = value
    return result


def toml_literal(value: Any) -> str:
    """`value` as the TOML a `--set section.key=VALUE` reads back as it: strings quoted,
    booleans lower-case, lists as arrays, numbers as they are (floats exactly, by repr)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def parse_set_args(items: Iterable[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} is invalid: use --set section.key=value")
        pairs.append((key.strip(), value.strip()))
    return pairs


def read_config_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All of a config file's TOML tables, the record of earlier resumes (HISTORY_TABLE, in a
    run's config.toml) included."""
    path = Path(path)
    try:
        return toml_loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except ValueError as exc:  # tomllib.TOMLDecodeError, or a file that is not UTF-8
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from exc


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's own TOML tables, without the record of earlier resumes."""
    loaded = read_config_toml(path)
    loaded.pop(HISTORY_TABLE, None)  # a record of earlier resumes, not settings
    return loaded


def dump_toml(data: Mapping[str, Any]) -> str:
    """A nested dict of sections as TOML that `load_config` reads back equal.

    TOML has no null: None values are left out, at any depth (an unset key reads back unset).
    """
    import tomli_w  # imported here: importing thrifty stays cheap

    return tomli_w.dumps(_without_none(data))


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_without_none(v) for v in value]
    return value


def flatten_keys(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as dotted keys: {"run": {"seed": 0}} -> {"run.seed": 0}."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
