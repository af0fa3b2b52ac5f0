"""The checks every config section shares: one way to say a value is invalid, and the
parsers of durations and targets."""

from __future__ import annotations

import math
import re
import typing

from thrifty.errors import ConfigError


def fail(section: str, key: str, value: object, allowed: str) -> typing.NoReturn:
    raise ConfigError(f"{section}.{key} = {value!r} is invalid: {allowed}")


def positive(section: str, key: str, value: float | int | None) -> None:
    if value is not None and not value > 0:
        fail(section, key, value, "must be greater than 0")


def non_negative(section: str, key: str, value: float | int) -> None:
    if not value >= 0:
        fail(section, key, value, "must be 0 or greater")


def is_int(value: object) -> bool:
    """A whole number that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_text(value: object) -> bool:
    return isinstance(value, str) and value.strip() != ""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(text: str | int | float, where: str = "duration") -> float:
    """Seconds from `90`, `"90s"`, `"30m"`, `"2.5h"` or `"1d"`."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if match is None:
            raise ConfigError(
                f"{where} = {text!r} is invalid: give seconds or a number with s, m, h or d "
                '(e.g. "30m")'
            )
        seconds = float(match.group(1)) * _DURATION_SECONDS[match.group(2)]
    if not seconds > 0:
        raise ConfigError(f"{where} = {text!r} is invalid: must be greater than 0")
    return seconds


def check_target(value: object, where: str = "early_stopping.target") -> float | None:
    """`early_stopping.target`: a validation loss to reach (finite, 0 or more), or None."""
    if value is None:
        return None
    if isinstance(value, int | float) and is_number(value) and value >= 0:
        return float(value)
    raise ConfigError(
        f"{where} = {value!r} is invalid: must be a finite number, 0 or more "
        "(the validation loss the run should reach, e.g. 2.5)"
    )
