"""Reading and writing quantities with their units: counts (7B), dollars ($50k), bandwidth (GB/s).

Bandwidth is carried everywhere in GB/s per direction. Links are quoted two other ways that are
easy to confuse: network links in Gbit/s (400 Gb/s = 50 GB/s) and NVLink as a total of both
directions (A100: 600 GB/s bidirectional = 300 GB/s each way). `parse_bandwidth` takes all three
and refuses a bare number, so a unit is always explicit.
"""

from __future__ import annotations

import math
import re

from thrifty.errors import ConfigError

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
_COUNT = re.compile(
    r"^\s*\$?\s*(-?[0-9][0-9_]*\.?[0-9]*(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtTpP]?)\s*$"
)

# Per-second units and their size in GB (10**9 bytes). Case matters: B is bytes, b is bits.
_BANDWIDTH_UNITS = {
    "TB/s": 1e3,
    "GB/s": 1.0,
    "MB/s": 1e-3,
    "Tb/s": 1e3 / 8,
    "Tbit/s": 1e3 / 8,
    "Gb/s": 1 / 8,
    "Gbit/s": 1 / 8,
    "Gbps": 1 / 8,
    "Mb/s": 1e-3 / 8,
    "Mbit/s": 1e-3 / 8,
}
_BANDWIDTH = re.compile(
    r"^\s*(-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*(bidir|bidirectional|total)?\s*$"
)


def parse_count(text: str | float | int, what: str = "value") -> float:
    """Read a count such as `7e9`, `7B`, `1.4T`, `500M`, `50k` or `$50_000` as a float.

    Suffixes are decimal: K=1e3, M=1e6, B or G=1e9, T=1e12, P=1e15. A comma is refused: it is
    a decimal mark in some locales and a thousands separator in others, so `1,4T` could be
    1.4T or 14T.
    """
    if isinstance(text, int | float):
        return float(text)
    prefix = f"{what}: " if what else ""
    if "," in text:
        raise ConfigError(
            f"{prefix}cannot read {text!r}: a comma could be a decimal mark or a thousands "
            "separator; write a decimal point and no separators, e.g. 1.4T or 50000"
        )
    match = _COUNT.match(text)
    if not match:
        raise ConfigError(f"{prefix}cannot read {text!r} as a number; write e.g. 7e9, 7B or 1.4T")
    number = float(match.group(1).replace("_", ""))
    return number * _SUFFIX[match.group(2).upper()]


def parse_bandwidth(text: str, what: str = "bandwidth") -> float:
    """Read a link bandwidth with its unit and return GB/s per direction.

    Accepts `300GB/s` (per direction), `400Gb/s` / `400Gbit/s` / `400Gbps` (bits: / 8),
    `1.6TB/s`, and a trailing `bidirectional` (or `bidir`, `total`) to halve a two-way total:
    `600GB/s bidirectional` = 300 GB/s per direction.
    """
    match = _BANDWIDTH.match(text)
    if not match:
        raise ConfigError(
            f"{what + ': ' if what else ''}cannot read {text!r}; give a number with its unit, "
            "e.g. 300GB/s (per direction), "
            "400Gb/s (network, bits) or '600GB/s bidirectional'"
        )
    number, unit, both_ways = match.groups()
    if unit not in _BANDWIDTH_UNITS:
        allowed = ", ".join(_BANDWIDTH_UNITS)
        raise ConfigError(f"unknown unit {unit!r} in {text!r}; use one of {allowed}")
    gbs = float(number) * _BANDWIDTH_UNITS[unit]
    if gbs <= 0:
        raise ConfigError(f"{what or 'bandwidth'} must be greater than 0, got {text!r}")
    return gbs / 2 if both_ways else gbs


def require_positive(value: float, field: str, fix: str = "") -> float:
    """Return `value` if it is a finite number > 0; otherwise raise naming the field and value."""
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        hint = f"; {fix}" if fix else ""
        what = "a finite number" if isinstance(value, float) and value > 0 else "greater than 0"
        raise ConfigError(f"{field} must be {what}, got {value!r}{hint}")
    return float(value)


def require_fraction(value: float, field: str, *, allow_zero: bool = False) -> float:
    """Return `value` if it lies in (0, 1] (or [0, 1] with `allow_zero`); otherwise raise."""
    low_ok = value >= 0 if allow_zero else value > 0
    if not isinstance(value, int | float) or not (low_ok and value <= 1):
        interval = "[0, 1]" if allow_zero else "(0, 1]"
        raise ConfigError(f"{field} must be in {interval}, got {value!r}")
    return float(value)


def fmt_count(value: float) -> str:
    """7.0e10 -> '70.0B'; 1.4e12 -> '1.40T'; small values plainly."""
    for suffix, scale in (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            scaled = value / scale
            return f"{scaled:.3g}{suffix}" if scaled < 100 else f"{scaled:.0f}{suffix}"
    return f"{value:.3g}"


def fmt_dollars(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "unbounded" if value is not None else "-"
    if abs(value) >= 1e9:
        return f"${value:.3g}"
    return f"${value:,.2f}" if abs(value) < 1000 else f"${value:,.0f}"


def fmt_usd(usd: float | None) -> str:
    """Dollars, with three significant figures below $10 (a short run costs fractions of a
    cent, and a cent is too coarse per token)."""
    if usd is None:
        return "-"
    return f"${usd:,.2f}" if abs(usd) >= 10 else f"${usd:.3g}"


def fmt_bytes(value: float) -> str:
    """Bytes as GiB (2**30) with two decimals, or MiB below 1 GiB."""
    if abs(value) >= 2**30:
        return f"{value / 2**30:,.2f} GiB"
    return f"{value / 2**20:,.1f} MiB"


def fmt_hours(hours: float | None) -> str:
    if hours is None or not math.isfinite(hours):
        return "unbounded" if hours is not None else "-"
    if hours < 1:
        return f"{hours * 60:.1f} min"
    if hours >= 1e6:
        return f"{hours:.3g} h"
    return f"{hours:,.1f} h"


def fmt_pct(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"
