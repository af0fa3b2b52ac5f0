"""A fitted scaling law saved as JSON, and read back where a named fit is used (`--fit FIT.json`).

The file holds `format` and `version` (a newer version is refused, naming both), the law, the
fitted constants with their intervals, every bootstrap resample's constants (so that a
prediction for any budget has its interval), the number of runs and their ranges (so that a
prediction states its reach), the paths the runs were read from, the objective reached and
approach 2's result. Writing replaces only a file that is itself a saved fit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from thrifty.errors import ConfigError
from thrifty.plan.chinchilla import LossFit
from thrifty.plan.lawfit import Ranges, ScalingFit, fit_as_dict
from thrifty.plan.lawgroups import IsoFlop, IsoFlopGroup
from thrifty.plan.lawpoints import CONSTANTS
from thrifty.records.directory import write_json

FORMAT = "thrifty scaling-law fit"
VERSION = 1
FIT_FILE = "scaling-fit.json"  # what `--fit DIR` looks for in DIR
HOW = "write one with 'thrifty plan fit RUNS... --out FIT.json'"


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
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == FORMAT


def load_fit(path: str) -> ScalingFit:
    """The fit saved at `path`, checked field by field; each problem is one line naming it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the saved fit {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"{path} is not JSON, so not a saved scaling-law fit; {HOW}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a saved scaling-law fit (no format {FORMAT!r}); {HOW}")
    version = data.get("version")
    if not isinstance(version, int) or not 1 <= version <= VERSION:
        raise ConfigError(
            f"{path}: format version {version!r} is not one this thrifty reads (1 to {VERSION}); "
            "upgrade thrifty or fit again"
        )
    reader = _Reader(path, data)
    e, a, b, alpha, beta = (
        reader.number(f"constants.{n}", positive=n in ("E", "A", "B")) for n in CONSTANTS
    )
    samples = reader.samples()
    ranges = Ranges(
        **{k: reader.span(f"points.{k}") for k in ("params", "tokens", "flops", "loss")}
    )
    return ScalingFit(
        law=LossFit(e, a, b, alpha, beta, source=f"saved fit {path}"),
        samples=samples,
        confidence=reader.number("confidence", below=1.0),
        seed=int(reader.number("bootstrap.seed", positive=False)),
        points=int(reader.number("points.count")),
        ranges=ranges,
        sources=[str(s) for s in reader.get("sources", list)],
        objective=reader.number("objective", positive=False),
        isoflop=reader.isoflop(),
        notes=[str(n) for n in reader.get("notes", list)],
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
        value = float(self.get(dotted, (int, float), "number"))
        if not math.isfinite(value) or (positive and value <= 0) or value >= below:
            rule = "a finite number" + (" > 0" if positive else "")
            rule += f" < {below:g}" if math.isfinite(below) else ""
            raise ConfigError(f"{self.path}: {dotted} must be {rule}, got {value!r}")
        return value

    def span(self, dotted: str) -> tuple[float, float]:
        value = self.get(dotted, list)
        if len(value) != 2 or not all(_positive(v) for v in value) or value[0] > value[1]:
            raise ConfigError(
                f"{self.path}: {dotted} must be [smallest, largest] > 0, got {value!r}"
            )
        return float(value[0]), float(value[1])

    def samples(self) -> list[tuple[float, float, float, float, float]]:
        rows = self.get("bootstrap.samples", list)
        good = [
            r
            for r in rows
            if isinstance(r, list)
            and len(r) == len(CONSTANTS)
            and all(isinstance(v, int | float) and math.isfinite(v) for v in r)
        ]
        if not rows or len(good) != len(rows):
            raise ConfigError(
                f"{self.path}: bootstrap.samples must be a list of [E, A, B, alpha, beta] numbers; "
                f"{len(rows) - len(good)} of {len(rows)} are not; {HOW}"
            )
        return [(float(a), float(b), float(c), float(d), float(e)) for a, b, c, d, e in good]

    def isoflop(self) -> IsoFlop | None:
        value = self.data.get("approach2")
        if value is None:
            return None
        try:
            groups = [IsoFlopGroup(**g) for g in value["groups"]]
            return IsoFlop(**{**value, "groups": groups})
        except (TypeError, KeyError):
            raise ConfigError(f"{self.path}: approach2 is malformed; {HOW}") from None


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
