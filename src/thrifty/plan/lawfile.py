"""A fitted scaling law saved as JSON, and read back where a named fit is used (`--fit FIT.json`).

The file holds `format` and `version` (a newer version is refused, naming both), the law, the
fitted constants with their intervals, every bootstrap resample's constants (so that a
prediction for any budget has its interval), the number of runs and their ranges (so that a
prediction states its reach), the paths the runs were read from, the objective reached and
approach 2's result. Writing replaces only a file that is itself a saved fit.

Reading it is bounded as the runs are (lawpoints): a regular file of at most MAX_FIT_BYTES,
JSON nested at most MAX_JSON_DEPTH deep, at most MAX_RESAMPLES resamples, and every constant,
the fitted one and each resample's, within CONSTANT_RANGES: a file edited by hand or by
another program gets one line naming the field and the range, never a traceback later.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from thrifty.errors import ConfigError
from thrifty.plan.chinchilla import LossFit
from thrifty.plan.lawfit import Ranges, ScalingFit, fit_as_dict
from thrifty.plan.lawgroups import IsoFlop, IsoFlopGroup
from thrifty.plan.lawpoints import CONSTANTS, MAX_POINTS, read_json, shown
from thrifty.rundir.files import write_json

FORMAT = "thrifty scaling-law fit"
VERSION = 1
FIT_FILE = "scaling-fit.json"  # what `--fit DIR` looks for in DIR
HOW = "write one with 'thrifty plan fit RUNS... --out FIT.json'"
MAX_FIT_BYTES = 64 * 2**20  # 100,000 resamples take about 12 MiB
MAX_RESAMPLES = 100_000  # thrifty.plan.lawfit.MAX_RESAMPLES
WHAT = "a saved scaling-law fit (thrifty plan fit --out FIT.json)"
# E, A and B in (0, 1e100]; an exponent 0 or below (a law without an optimum, down to -5), or
# from 1e-3 to 5: smaller and positive, N* = G * (C/6)^(beta/(alpha+beta)) underflows to 0.
SCALE_RANGE = (0.0, 1e100)
EXPONENT_RANGE = (-5.0, 5.0)
SMALLEST_EXPONENT = 1e-3


def check_out(path: str) -> Path:
    """`path` can take a saved fit: not a folder, nor a file other than a saved fit."""
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"--out {path} is a folder: give a file name, e.g. {out / FIT_FILE}")
    if out.exists() and not _is_saved_fit(out):
        raise ConfigError(
            f"--out {path} exists and is not a scaling-law fit thrifty wrote: choose another "
            "file name"
        )
    return out


def save_fit(fit: ScalingFit, path: str) -> Path:
    """Write `fit` to `path` (JSON, atomically); refuse to replace a file that is not a fit."""
    out = check_out(path)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json(out, {"format": FORMAT, "version": VERSION, **fit_as_dict(fit)})
    except OSError as exc:
        raise ConfigError(f"cannot write --out {path}: {exc.strerror}") from None
    return out


def _is_saved_fit(path: Path) -> bool:
    try:
        data = read_json(path, MAX_FIT_BYTES, WHAT)
    except ConfigError:  # not a regular file, too large, too deep or not JSON
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def load_fit(path: str) -> ScalingFit:
    """The fit saved at `path`, checked field by field; each problem is one line naming it."""
    data = read_json(Path(path), MAX_FIT_BYTES, WHAT)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a saved scaling-law fit (no format {FORMAT!r}); {HOW}")
    version = data.get("version")
    if not isinstance(version, int) or not 1 <= version <= VERSION:
        raise ConfigError(
            f"{path}: format version {version!r} is not one this thrifty reads (1 to {VERSION}); "
            "upgrade thrifty or fit again"
        )
    reader = _Reader(path, data)
    e, a, b, alpha, beta = (reader.constant(f"constants.{n}") for n in CONSTANTS)
    samples = reader.samples()
    ranges = Ranges(
        **{k: reader.span(f"points.{k}") for k in ("params", "tokens", "flops", "loss")}
    )
    return ScalingFit(
        law=LossFit(e, a, b, alpha, beta, source=f"saved fit {path}"),
        samples=samples,
        confidence=reader.number("confidence", below=1.0),
        seed=int(reader.number("bootstrap.seed", positive=False)),
        points=int(reader.number("points.count", below=MAX_POINTS + 1)),
        ranges=ranges,
        sources=[str(s) for s in reader.get("sources", list)],
        objective=reader.number("objective", positive=False),
        isoflop=reader.isoflop(),
        notes=[str(n) for n in reader.get("notes", list)],
        robust=data.get("robust") is True,
    )


class _Reader:
    """Dotted fields of a saved fit, each checked, with one line naming the field if wrong."""

    def __init__(self, path: str, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    def get(self, dotted: str, kind: type | tuple[type, ...], what: str = "") -> Any:
        value: Any = self.data
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            what = what or getattr(kind, "__name__", "value")
            raise ConfigError(f"{self.path}: {dotted} must be a {what}, got {value!r}; {HOW}")
        return value

    def number(self, dotted: str, *, positive: bool = True, below: float = math.inf) -> float:
        value = _float(self.get(dotted, (int, float), "number"))
        if not math.isfinite(value) or (positive and value <= 0) or value >= below:
            rule = "a finite number" + (" > 0" if positive else "")
            rule += f" < {below:g}" if math.isfinite(below) else ""
            raise ConfigError(f"{self.path}: {dotted} must be {rule}, got {shown(value)}")
        return value

    def span(self, dotted: str) -> tuple[float, float]:
        value = self.get(dotted, list)
        if len(value) != 2 or not all(_positive(v) for v in value) or value[0] > value[1]:
            raise ConfigError(
                f"{self.path}: {dotted} must be [smallest, largest] > 0, got {shown(value)}"
            )
        return float(value[0]), float(value[1])

    def constant(self, dotted: str, value: Any = None) -> float:
        """A constant of the law (`dotted` names it: constants.E, bootstrap.samples[3].alpha)
        within its range (SCALE_RANGE, EXPONENT_RANGE), or one line naming it and the range."""
        value = self.get(dotted, (int, float), "number") if value is None else value
        name = dotted.rsplit(".", 1)[-1]
        number = _float(value)
        if name in ("alpha", "beta"):
            low, high = EXPONENT_RANGE
            good = low <= number <= 0 or SMALLEST_EXPONENT <= number <= high
            rule = f"from {SMALLEST_EXPONENT:g} to {high:g}, or from {low:g} to 0 (no optimum)"
        else:
            low, high = SCALE_RANGE
            good = low < number <= high
            rule = f"> 0, at most {high:g}"
        if not good:
            raise ConfigError(
                f"{self.path}: {dotted} must be a finite number > 0, got {shown(value)}; the "
                f"range allowed: {rule}"
                if name not in ("alpha", "beta")
                else f"{self.path}: {dotted} must be a finite number {rule}, got {shown(value)}"
            )
        return number

    def samples(self) -> list[tuple[float, float, float, float, float]]:
        rows = self.get("bootstrap.samples", list)
        if not rows or len(rows) > MAX_RESAMPLES:
            raise ConfigError(
                f"{self.path}: bootstrap.samples must hold 1 to {MAX_RESAMPLES:,} resamples, got "
                f"{len(rows):,}; {HOW}"
            )
        samples = []
        for i, row in enumerate(rows):
            if (
                not isinstance(row, list)
                or len(row) != len(CONSTANTS)
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in row)
            ):
                raise ConfigError(
                    f"{self.path}: bootstrap.samples[{i}] must be [E, A, B, alpha, beta] "
                    f"numbers, got {str(row)[:60]}; {HOW}"
                )
            e, a, b, alpha, beta = (
                self.constant(f"bootstrap.samples[{i}].{n}", v)
                for n, v in zip(CONSTANTS, row, strict=True)
            )
            samples.append((e, a, b, alpha, beta))
        return samples

    def isoflop(self) -> IsoFlop | None:
        value = self.data.get("approach2")
        if value is None:
            return None
        try:
            groups = [IsoFlopGroup(**g) for g in value["groups"]]
            return IsoFlop(**{**value, "groups": groups})
        except (TypeError, KeyError):
            raise ConfigError(f"{self.path}: approach2 is malformed; {HOW}") from None


def _float(value: Any) -> float:
    """A JSON number as a float; NaN for an integer too large for one (refused by the range)."""
    try:
        return float(value)
    except OverflowError:
        return math.nan


def _positive(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < _float(value) < math.inf
    )
