"""`thrifty report`: one self-contained HTML page of a run, of several runs side by side, of
a tune, or of a sweep.

Cheap to import (no torch): a run writes its own report when it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from thrifty.errors import ThriftyError
from thrifty.reporting.runs import Run, Sweep, Tune, load
from thrifty.rundir.own_files import is_own_report

__all__ = [
    "REPORT_NAME",
    "Run",
    "Sweep",
    "Tune",
    "check_target",
    "load",
    "render_report",
    "write_html",
    "write_run_report",
]

REPORT_NAME = "report.html"
log = logging.getLogger("thrifty")


def render_report(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Write the report of the run (or tune, or sweep) directory `paths`, or of each of several,
    to `out` and return its path.

    `out` defaults to <dir>/report.html for one directory, which is replaced when thrifty wrote
    it; several need `out`. An `out` that exists is replaced only with `overwrite`, and never
    when thrifty did not write it. Bad input (a directory that is not a run, a run with no
    step recorded yet, a damaged sweep.json, an output that cannot or must not be written)
    raises ThriftyError with one line naming the problem and the fix. What was left out of a
    run's or a sweep's files (damaged lines, fields of the wrong type) is logged, one warning
    line each, and noted on the page."""
    from thrifty.reporting.page import render_page

    if isinstance(paths, str | os.PathLike):
        paths = [paths]

    if not paths:
        raise ThriftyError("no run directory given: thrifty report RUN_DIR [RUN_DIR ...]")
    if out is None and len(paths) > 1:
        raise ThriftyError(
            f"{len(paths)} runs given and no --out: a report of several runs needs --out FILE "
            "(e.g. --out compare.html)"
        )
    items = unique_names([load(p) for p in expand(paths)])
    target = Path(out) if out is not None else Path(paths[0]) / REPORT_NAME
    check_target(target, given=out is not None, overwrite=overwrite)
    for item in items:
        for note in item.notes if isinstance(item, Run | Sweep) else ():
            log.warning("%s", note)
    return write_html(render_page(items), target)


def expand(paths: Sequence[str | os.PathLike[str]]) -> list[str | os.PathLike[str]]:
    """`paths`, each folder of runs (one that is not itself a run, a tune or a sweep) replaced
    by the run directories under it: `thrifty report runs/` reports the team's runs."""
    from thrifty.ledger.finding import run_folders

    expanded: list[str | os.PathLike[str]] = []
    for path in paths:
        folder = Path(path)
        own = ("metrics.jsonl", "config.toml", "tune.json", "sweep.json")
        if not folder.is_dir() or any((folder / name).exists() for name in own):
            expanded.append(path)
            continue
        found = [str(run) for run, _ in run_folders(folder)]
        expanded += found or [path]
    return expanded


def check_target(out: Path, *, given: bool, overwrite: bool) -> None:
    """Refuse to replace a file thrifty did not write, and (`given` as --out) one it did
    unless `overwrite`."""
    if not out.is_file():
        return
    if not is_own_report(out):
        where = "give another --out" if given else "give --out FILE to write the report elsewhere"
        raise ThriftyError(
            f"{out} exists and thrifty did not write it: it is never replaced; move it away, or "
            f"{where}"
        )
    if given and not overwrite:
        raise ThriftyError(f"{out} exists: give --overwrite to replace it, or another --out")


def write_html(html: str, out: Path, fix: str = "give another --out") -> Path:
    """Write `html` to `out` atomically (a temporary file beside it, then a rename), creating
    its folder; one line naming the problem and `fix` when it cannot be written."""
    if out.is_dir():
        raise ThriftyError(
            f"cannot write the report to {out}: it is a directory; give a file name, "
            f"e.g. {out / REPORT_NAME}"
        )
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        reason = exc.strerror or type(exc).__name__
        raise ThriftyError(f"cannot write the report to {out}: {reason}; {fix}") from None
    return out


def write_run_report(run_dir: str | os.PathLike[str]) -> Path | None:
    """Write <run_dir>/report.html at a run's end (finished or preempted), replacing the one
    thrifty wrote before but never a file it did not write. Never raises: a report that
    cannot be made must not fail the run, so it logs one warning line and returns None."""
    try:
        from thrifty.reporting.page import render_page

        run = load(run_dir)
        target = Path(run_dir) / REPORT_NAME
        check_target(target, given=False, overwrite=True)
        fix = "the run itself is saved; run thrifty report RUN_DIR --out FILE to write it elsewhere"
        return write_html(render_page([run]), target, fix)
    except ThriftyError as exc:
        log.warning("no report.html for %s: %s", run_dir, exc)
    except Exception as exc:  # a bug in the report must not cost the run its end
        log.warning("no report.html for %s: %s: %s", run_dir, type(exc).__name__, exc)
    return None


def unique_names(items: list[Run | Tune | Sweep]) -> list[Run | Tune | Sweep]:
    """The items, each named by its folder, or by its parent and folder where two share one."""
    names = [i.name for i in items]
    return [
        dataclasses.replace(i, name=f"{i.path.resolve().parent.name}/{i.name}")
        if names.count(i.name) > 1
        else i
        for i in items
    ]
