"""The `plan` commands' option types and the budget they read: each bad value is one line naming
the value and the fix (argparse's exit 2)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from thrifty.errors import ConfigError

if TYPE_CHECKING:
    from thrifty.plan.catalog import Catalog

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
FIT_NAMES = ("epoch", "hoffmann", "tokens-per-param")  # thrifty.plan.chinchilla.FIT_NAMES


def _typed(
    kind: str,
    parse: Callable[[str], Any],
    positive: bool = True,
    most: tuple[float, str] | None = None,
) -> Callable[[str], Any]:
    """An argparse type that reports a bad value as one line naming the value and the fix.
    `most`: the largest value its unit makes sensible, and that limit in words; checked while
    parsing, before any work starts."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
        except (ConfigError, ValueError) as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"not {kind}: {text!r}") from None
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
        if most is not None and not value <= most[0]:
            raise argparse.ArgumentTypeError(
                f"must be at most {most[0]:g} ({most[1]}), got {text!r}"
            )
        return value

    convert.__name__ = kind
    return convert


def bounded(kind: str, most: float, words: str, *, positive: bool = True) -> Callable[[str], Any]:
    """A number (count suffixes allowed) in (0, most], or [0, most] when not `positive`."""
    if positive:
        return _typed(kind, count, most=(most, words))

    def non_negative(text: str) -> float:
        value = count(text)
        if not value >= 0:
            raise ConfigError(f"must be 0 or more, got {text!r}")
        return value

    return _typed(kind, non_negative, positive=False, most=(most, words))


def bounded_int(most: float, words: str) -> Callable[[str], Any]:
    """A whole number in [1, most]."""
    return _typed("a whole number", _int, most=(most, words))


def count(text: str) -> float:
    from thrifty.plan.units import parse_count

    return parse_count(text, "")


def _int(text: str) -> int:
    """A whole number written any way a count is (64, 1e3, 2K)."""
    value = count(text)
    if not value.is_integer():
        raise ConfigError(f"expected a whole number, got {text!r}")
    return int(value)


def _fraction(text: str) -> float:
    """A fraction in (0, 1]; checked while parsing so that every section sees the same rule."""
    value = count(text)
    if not 0 < value <= 1:
        hint = f"; for {value:g}% write {value / 100:g}" if 1 < value <= 100 else ""
        raise ConfigError(f"must be a fraction in (0, 1], got {text!r}{hint}")
    return value


def _bandwidth(text: str) -> float:
    from thrifty.plan.units import parse_bandwidth

    return parse_bandwidth(text, "")


def _fit(text: str) -> str:
    """A named fit, or a path to a saved fit or a folder of runs (read when the plan runs)."""
    if text in FIT_NAMES or os.path.exists(text):
        return text
    raise ConfigError(
        f"must be {', '.join(FIT_NAMES)}, a saved fit (FILE.json from 'thrifty plan fit --out') "
        f"or a folder of runs; no such file or folder: {text!r}"
    )


COUNT = _typed("a number", count)
INT = _typed("a whole number", _int)
FLOAT = _typed("a number", count)
FRACTION = _typed("a fraction", _fraction)
FIT = _typed("a fit", _fit, positive=False)
ANY_FLOAT = _typed("a number", count, positive=False)
BANDWIDTH = _typed("a bandwidth", _bandwidth, most=(1e6, "1 PB/s"))

# The largest value each unit makes sensible: far past any real job, well short of where the
# arithmetic overflows a float (a 1e308-hour job, a 1e300-FLOP budget).
PARAMS = bounded("a parameter count", 1e15, "a quadrillion parameters")
TOKENS = bounded("a token count", 1e17, "1e17 tokens")
HOURS = bounded("hours", 1e6, "a million hours, 114 years")
STEPS = bounded("a step count", 1e12, "a trillion steps")
SEQUENCES = bounded("a batch", 1e9, "a billion sequences")
BUDGET_FLOPS = bounded("FLOPs", 1e30, "1e30 FLOPs, ten thousand times the largest runs")
BUDGET_GPU_HOURS = bounded("GPU-hours", 1e10, "ten billion GPU-hours")
BUDGET_DOLLARS = bounded("USD", 1e13, "ten trillion dollars")
RATE = bounded("a rate", 3600, "one interruption a second")
SECONDS = bounded("seconds", 1e7, "ten million seconds, 116 days")
SPEEDUP = bounded("a speed-up", 1000, "1000x")
RUNS = bounded("runs", 1e7, "ten million runs")
EARLY_STOP = bounded("runs", 1e7, "ten million runs", positive=False)
FRACTION_OR_ZERO = bounded("a fraction", 1, "all of the run", positive=False)
SHAPE = bounded_int(1e9, "a billion")
COUNT_INT = bounded_int(1e6, "a million")


def budget_from_args(args: argparse.Namespace, catalog: Catalog | None) -> tuple[float, list[str]]:
    """The budget options (--budget-flops, --budget-gpu-hours or --budget-dollars, priced on
    --instance or --gpu at --mfu) in FLOPs, with how they were converted."""
    from thrifty.console import call_with_options
    from thrifty.plan.chinchilla import budget_flops
    from thrifty.plan.estimate import DEFAULT_MFU

    return call_with_options(  # --instance, --gpu, --dtype and --pricing
        budget_flops,
        args,
        flops=args.budget_flops,
        gpu_hours=args.budget_gpu_hours,
        dollars=args.budget_dollars,
        mfu=args.mfu if args.mfu is not None else DEFAULT_MFU,
        catalog=catalog,
    )
