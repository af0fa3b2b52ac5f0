"""The types the report reads its JSON fields as (summary.json, diagnosis.json, sweep.json),
and the words its notes name them in: a field of the wrong type is left out with a note."""

from __future__ import annotations

from typing import Any

NUMBER, WHOLE, COUNT, TEXT, TABLE, LIST = (
    "a number",
    "a positive whole number",
    "a whole number",
    "text",
    "a table",
    "a list",
)


def fits(value: Any, kind: str) -> bool:
    """Whether `value` (not null) is of `kind`."""
    if kind == TABLE:
        return isinstance(value, dict)
    if kind == LIST:
        return isinstance(value, list)
    if kind == TEXT:
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if kind == NUMBER:
        return True
    return isinstance(value, int) and value >= (1 if kind == WHOLE else 0)


def kind_of(value: Any) -> str:
    """What `value` is, in the words of the notes."""
    names = {bool: "true/false", str: "text", list: "a list", dict: "a table"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else "null")
