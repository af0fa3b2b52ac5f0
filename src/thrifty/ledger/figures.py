"""What a figure read from a run's files must be before the ledger adds it up.

Files come from other versions of thrifty, other teams sharing a bucket, or damage: a figure
is taken only when it is of its kind, and a damaged one is named (file and field) in the one
line that skips what holds it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

CENTURY = 100 * 365.25 * 86400  # seconds: no figure of a run's time is larger

WHAT = {
    "seconds": "a number of seconds from 0 to a century",
    "dollars": "a number, 0 or more",
    "rate": "a price above 0",
    "count": "a whole number, 0 or more",
    "gpus": "a whole number of GPUs, 1 or more",
}


def fits(value: Any, kind: str) -> bool:
    """Whether `value` is a figure of `kind`: seconds (finite, 0 to a century), dollars
    (finite, 0 or more), rate (finite, above 0, dollars an hour), count (whole, 0 or more),
    gpus (whole, 1 or more)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if kind in ("count", "gpus"):
        return isinstance(value, int) and value >= (1 if kind == "gpus" else 0)
    if not math.isfinite(value) or value < 0:
        return False
    if kind == "seconds":
        return value <= CENTURY
    return value > 0 or kind != "rate"


def shown(value: Any) -> str:
    """`value` as a line quotes it: short, and "missing" for nothing."""
    if value is None:
        return "missing"
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def damaged(data: Mapping[str, Any], figures: Mapping[str, str]) -> str | None:
    """`field is VALUE, not WHAT` for the first of `figures` (field -> kind) in `data` that
    is not of its kind (a null is absent); None when all fit."""
    for name, kind in figures.items():
        value = data.get(name)
        if value is not None and not fits(value, kind):
            return f"{name} is {shown(value)}, not {WHAT[kind]}"
    return None
