"""The catalog file: a TOML file of [[gpu]] and [[instance]] tables, read and checked into rows.

Every table is validated field by field before an object is built from it, and a malformed
file is reported with its path, line and field. Files are read once per modification time.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import stat
from dataclasses import dataclass
from typing import Any

from thrifty.config import toml_loads
from thrifty.errors import ConfigError

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
# The fields of an [[instance]] that are prices: an untraced one makes its price untraced.
PRICE_FIELDS = (
    "on_demand",
    "on_demand_per_gpu",
    "spot",
    "spot_zones",
    "spot_low",
    "spot_high",
    "commit_1y",
    "commit_3y",
)
# A catalog file larger than this is refused before it is read: the built-in one is ~30 KB.
MAX_CATALOG_BYTES = 4 * 2**20


class CatalogError(ConfigError):
    """A catalog file is malformed: the message names the file, line and field."""


def read_rows(path: str) -> dict[str, dict[str, Row]]:
    """The validated tables of the file at `path`, by kind ('gpu', 'instance') and by name
    folded to lower case."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise CatalogError(
            f"catalog file {path!r} cannot be read: {exc.strerror}; check --catalog"
        ) from None
    # Checked before anything opens it: a FIFO or a device would block the read or never end.
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise CatalogError(
            f"catalog file {path!r} is {kind}; give --catalog a TOML file like the built-in "
            "catalog.toml"
        )
    if info.st_size > MAX_CATALOG_BYTES:
        raise CatalogError(
            f"catalog file {path!r} is {info.st_size:,} bytes, over the "
            f"{MAX_CATALOG_BYTES // 2**20} MiB a catalog may have; give a smaller --catalog"
        )
    return _read_cached(path, info.st_mtime)


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime: float) -> dict[str, dict[str, Row]]:
    return _parse_file(path)


@dataclass(frozen=True, slots=True)
class Row:
    """One validated table of the file, with what is needed to report errors against it."""

    values: dict[str, Any]
    where: Where


@dataclass(frozen=True, slots=True)
class Where:
    path: str
    kind: str
    header_line: int
    key_lines: dict[str, int]

    def error(self, name: str, key: str, problem: str) -> CatalogError:
        line = self.key_lines.get(key.split(".")[0], self.header_line)
        label = f"{self.kind} {name!r}" if name else f"{self.kind} entry"
        return CatalogError(f"{self.path} line {line}: {label} field {key!r} {problem}")


_STR, _NUM, _INT, _STRS = "text", "number", "integer", "list of text"
_PEAKS, _ZONES = "table of TFLOP/s", "table of $/hour by zone"

_GPU_FIELDS = {
    "name": (_STR, True),
    "aliases": (_STRS, False),
    "peak_tflops": (_PEAKS, True),
    "peak_source": (_STR, True),
    "memory_gib": (_NUM, True),
    "memory_bandwidth_gbs": (_NUM, True),
    "memory_source": (_STR, True),
    "interconnect": (_STR, True),
    "interconnect_gbs_per_direction": (_NUM, True),
    "interconnect_note": (_STR, False),
    "bus_gbs": (_NUM, False),
    "bus_source": (_STR, False),
    "nvlink_domain": (_INT, False),
    "nvlink_domain_source": (_STR, False),
    "uncertain": (_STRS, False),
    "untraced": (_STRS, False),
}
_INSTANCE_FIELDS = {
    "name": (_STR, True),
    "snapshot": (_STR, False),
    "provider": (_STR, True),
    "region": (_STR, True),
    "gpu": (_STR, True),
    "gpu_count": (_INT, True),
    "on_demand": (_NUM, False),
    "on_demand_per_gpu": (_NUM, False),
    "spot": (_NUM, False),
    "spot_zones": (_ZONES, False),
    "spot_low": (_NUM, False),
    "spot_high": (_NUM, False),
    # Committed prices: USD per hour of the term, billed whether the instance runs or not.
    "commit_1y": (_NUM, False),
    "commit_3y": (_NUM, False),
    "commit_source": (_STR, False),
    "commit_date": (_STR, False),
    "price_source": (_STR, True),
    "price_date": (_STR, True),
    "price_note": (_STR, False),
    "network_gbits": (_NUM, False),
    "network_source": (_STR, False),
    "uncertain": (_STRS, False),
    "untraced": (_STRS, False),
}
# Object storage, for the checkpoints a run keeps in a bucket (thrifty runs): USD per GiB-month.
_STORAGE_FIELDS = {
    "name": (_STR, True),
    "provider": (_STR, True),
    "region": (_STR, True),
    "storage_class": (_STR, True),
    "protocols": (_STRS, True),
    "usd_per_gib_month": (_NUM, True),
    "tier_note": (_STR, False),
    "price_source": (_STR, True),
    "price_date": (_STR, True),
    "price_note": (_STR, False),
    "uncertain": (_STRS, False),
}
KINDS = ("gpu", "instance", "storage")
_FIELDS = {"gpu": _GPU_FIELDS, "instance": _INSTANCE_FIELDS, "storage": _STORAGE_FIELDS}


def _parse_file(path: str) -> dict[str, dict[str, Row]]:
    try:
        with open(path, "rb") as file:  # bounded: a file that grew since its stat stops here
            raw = file.read(MAX_CATALOG_BYTES + 1)
        if len(raw) > MAX_CATALOG_BYTES:
            raise CatalogError(
                f"catalog file {path!r} is over the {MAX_CATALOG_BYTES // 2**20} MiB a catalog "
                "may have; give a smaller --catalog"
            )
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(
            f"catalog file {path!r} cannot be read: {exc}; check --catalog"
        ) from None
    try:
        data = toml_loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise CatalogError(f"{path}: malformed TOML: {exc}") from None
    for key in data:
        if key not in ("schema", *KINDS):
            line = _top_level_line(text, key)
            raise CatalogError(
                f"{path} line {line}: unknown top-level key {key!r}; "
                "expected [[gpu]], [[instance]] or [[storage]] tables"
            )
    locations = _locate_tables(text)
    rows: dict[str, dict[str, Row]] = {kind: {} for kind in KINDS}
    for kind in KINDS:
        tables = data.get(kind, [])
        if not isinstance(tables, list):
            raise CatalogError(
                f"{path} line {_top_level_line(text, kind)}: {kind!r} must be [[{kind}]] tables"
            )
        for index, table in enumerate(tables):
            header, keys = locations.get((kind, index), (0, {}))
            where = Where(path, kind, header, keys)
            values = _validate_table(table, _FIELDS[kind], where)
            key = values["name"].casefold()
            if key in rows[kind]:
                raise where.error(
                    values["name"], "name", "repeats an earlier entry; names must be unique"
                )
            rows[kind][key] = Row(values, where)
    return rows


def _validate_table(
    table: dict[str, Any], fields: dict[str, tuple[str, bool]], where: Where
) -> dict[str, Any]:
    given = table.get("name")
    name = given if isinstance(given, str) else ""
    for key in table:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; allowed: {', '.join(fields)}"
            raise where.error(name, key, f"is not a known field{hint}")
    for key, (kind, required) in fields.items():
        if key not in table:
            if required:
                raise where.error(name, key, f"is missing (a {kind} is required)")
            continue
        _check_value(table[key], kind, key, name, where)
    return dict(table)


def _check_value(value: Any, kind: str, key: str, name: str, where: Where) -> None:
    if kind == _STR:
        ok = isinstance(value, str) and value.strip() != ""
    elif kind == _STRS:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif kind == _INT:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    elif kind == _NUM:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    elif kind == _ZONES:
        _check_table(value, kind, "{ use1-az1 = 8.19 }", key, name, where)
        return
    else:  # peak table
        _check_table(value, kind, "{ bf16 = 312 }", key, name, where)
        for dtype in value:
            if dtype not in DTYPES:
                raise where.error(
                    name, f"{key}.{dtype}", f"is not a dtype; use {', '.join(DTYPES)}"
                )
        return
    if not ok:
        rule = {_INT: "a whole number > 0", _NUM: "a number > 0"}.get(kind, f"a {kind}")
        raise where.error(name, key, f"must be {rule}, got {value!r}")


def _check_table(value: Any, kind: str, example: str, key: str, name: str, where: Where) -> None:
    """A non-empty inline table of positive numbers (peaks by dtype, prices by zone)."""
    if not isinstance(value, dict) or not value:
        raise where.error(name, key, f"must be a {kind} such as {example}")
    for item, number in value.items():
        _check_value(number, _NUM, f"{key}.{item}", name, where)


_ARRAY_HEADER = re.compile(r"^\s*\[\[\s*([A-Za-z0-9_-]+)\s*\]\]")
_TABLE_HEADER = re.compile(r"^\s*\[")
_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


def _locate_tables(text: str) -> dict[tuple[str, int], tuple[int, dict[str, int]]]:
    """Line numbers of each [[kind]] header and of the keys inside it, for error messages."""
    found: dict[tuple[str, int], tuple[int, dict[str, int]]] = {}
    counts: dict[str, int] = {}
    current: dict[str, int] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        header = _ARRAY_HEADER.match(line)
        if header:
            kind = header.group(1)
            index = counts.get(kind, 0)
            counts[kind] = index + 1
            current = {}
            found[(kind, index)] = (number, current)
        elif _TABLE_HEADER.match(line):
            current = None
        elif current is not None and (key := _KEY.match(line)):
            current.setdefault(key.group(1), number)
    return found


def _top_level_line(text: str, key: str) -> int:
    pattern = re.compile(rf"^\s*(\[+\s*)?{re.escape(key)}\s*(=|\])")
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.match(line):
            return number
    return 1
