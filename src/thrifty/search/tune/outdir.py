"""A tune's --out: what a tune writes there, what it refuses, and the earlier tune it resumes.

A tune writes tune.json (first, then after every trial; its `state` says running, stopped or
finished), trial.toml, trials/NN-STAGE/ (one run folder per trial) and winner.toml; `thrifty
report` may add report.html, which a tune leaves alone. Anything else is someone else's: an
--out holding it is refused in one line naming it, --overwrite or not, and nothing is deleted.
--overwrite replaces an earlier tune's files and nothing else. An unfinished tune of the same
search (the same config, --steps, --levers and --micro on the same hardware) is resumed
instead: its finished trials and comparison runs are kept, and the one that was running runs
again.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.console import say
from thrifty.errors import ThriftyError
from thrifty.redact import redact_value
from thrifty.search.tune.space import Space
from thrifty.search.tune.stopping import finished
from thrifty.search.tune.trials import Candidate, Trial

OWN = ("tune.json", "trial.toml", "winner.toml", "trials", "workers")
FOLDERS = ("trials", "workers")
WORKER_LOG = re.compile(r"worker-\d+\.log")  # the warm worker's own output (search.engine)
TEMPORARY = ("tune.json.tmp",)  # what a write of tune.json cut short leaves
LEFT_ALONE = ("report.html",)  # `thrifty report DIR` writes it; a tune neither needs nor deletes it
# A trial's folder, or a comparison run's (NN-STAGE.a0, final.b1: thrifty.search.tune.compare).
TRIAL_DIR = re.compile(r"(\d{2,}-(baseline|workers|precision|micro|compile)|final)(\.[ab]\d+)?")
UNFINISHED = ("running", "stopped")

Flag = Callable[[str], str]  # how messages name an option: "--out" or "out"


class OutOfSpace(ThriftyError):
    """The disk holding --out is full. Exit code 1: not bad input; the same command resumes
    the tune once there is space."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class Earlier:
    """An unfinished tune of the same search in --out: its finished trials and comparison runs
    by name, and the CPU peaks its trials were measured against (TFLOP/s per precision),
    reused."""

    trials: dict[str, Trial]
    peaks: dict[str, float] | None

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Earlier:
        runs = [*data.get("trials", [])]
        runs += [b for c in data.get("comparisons") or [] for b in c.get("blocks", [])]
        trials = [Trial.from_dict(t) for t in runs]
        finished = {t.name: t for t in trials if t.status in ("ok", "failed")}
        return cls(finished, data.get("peaks"))

    def describe(self) -> str:
        """What it keeps: "2 finished trials and 3 comparison runs"."""
        runs = sum(1 for name in self.trials if "." in name)
        return finished(len(self.trials) - runs, runs)

    def kept(self, candidate: Candidate) -> Trial | None:
        """The finished trial of the earlier tune that ran `candidate`, if one did."""
        trial = self.trials.get(candidate.name)
        return trial if trial is not None and trial.setting == candidate.setting else None


def search_key(given: Mapping[str, Any], steps: int, space: Space, device: str) -> str:
    """What makes two tunes the same search (the budget and the instance priced are not)."""
    payload = {
        "config": redact_value(given),
        "steps": steps,
        "device": device,
        "levers": space.levers,
        "precisions": space.precisions,
        "policies": space.policies,
        "micros": space.micros,
        "compile_modes": space.compile_modes,
        "effective": space.effective,
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def inspect(out: Path, key: str, overwrite: bool, flag: Flag) -> Earlier | None:
    """The earlier tune to resume, or None to start afresh (an earlier tune's files replaced,
    which only --overwrite allows). Refuses a file, what thrifty tune did not write, and an
    earlier tune it may not replace; changes nothing."""
    if out.exists() and not out.is_dir():
        raise ThriftyError(f"{flag('--out')} {out} is a file: give a directory")
    if not out.is_dir():
        return None
    strangers = foreign(out)
    if strangers:
        more = f" and {len(strangers) - 1} more" if len(strangers) > 1 else ""
        why = f" ({flag('--overwrite')} replaces an earlier tune's files only)" if overwrite else ""
        raise ThriftyError(
            f"{flag('--out')} {out} holds {strangers[0]}{more}, which thrifty tune did not "
            f"write: choose a new or empty {flag('--out')}; a tune never deletes or replaces "
            f"what it did not write{why}"
        )
    own = [name for name in OWN if (out / name).exists()]  # a temporary file alone is no tune
    if not own or overwrite:
        return None
    data = read_record(out)
    unfinished = data is not None and data.get("state") in UNFINISHED
    if unfinished and data is not None and data.get("search_key") == key:
        return Earlier.of(data)
    if unfinished:
        raise ThriftyError(
            f"{flag('--out')} {out} holds an unfinished tune of another search (another config, "
            f"or other --steps, --levers or --micro): resume it with the command that started "
            f"it, choose another {flag('--out')}, or replace it with {flag('--overwrite')}"
        )
    raise ThriftyError(
        f"{flag('--out')} {out} already holds {own[0]} from an earlier tune: choose another "
        f"{flag('--out')}, or replace it with {flag('--overwrite')}"
    )


def foreign(out: Path) -> list[str]:
    """What --out holds that a tune did not write, relative to it."""
    from thrifty.rundir.ownership import foreign_in_run  # here: importing a tune needs no torch

    found = []
    for entry in sorted(out.iterdir()):
        if entry.name not in (*OWN, *TEMPORARY, *LEFT_ALONE):
            found.append(entry.name)
        elif entry.is_symlink() or entry.is_dir() != (entry.name in FOLDERS):
            found.append(entry.name)
        elif entry.name == "workers":
            found += [
                f"workers/{e.name}"
                for e in sorted(entry.iterdir())
                if e.is_symlink() or not e.is_file() or not WORKER_LOG.fullmatch(e.name)
            ]
        elif entry.name == "trials":
            for e in sorted(entry.iterdir()):
                if e.is_symlink() or not e.is_dir() or not TRIAL_DIR.fullmatch(e.name):
                    found.append(f"trials/{e.name}")
                else:  # a trial's folder is deleted whole: only what its run wrote
                    found += [f"trials/{e.name}/{name}" for name in foreign_in_run(e)]
    return found


def read_record(out: Path) -> dict[str, Any] | None:
    """tune.json, or None when it is missing or unreadable."""
    try:
        data = json.loads((out / "tune.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def replace_earlier(out: Path, flag: Flag, overwrite: bool) -> None:
    """Delete what a write cut short left and, with `overwrite`, an earlier tune's files (a
    tune's own names only: `inspect` checked the rest)."""
    for name in TEMPORARY:
        (out / name).unlink(missing_ok=True)
    for name in OWN if overwrite else ():
        path = out / name
        if path.exists():
            say("tune", f"replacing {path} ({flag('--overwrite')})")
            shutil.rmtree(path) if path.is_dir() else path.unlink()


@contextmanager
def held(out: Path, flag: Flag) -> Iterator[None]:
    """--out created and held for this tune alone (an advisory lock on the folder, released
    when the tune ends, however it ends)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ThriftyError(f"cannot create {flag('--out')} {out}: {exc.strerror}") from exc
    try:
        import fcntl
    except ImportError:  # no advisory locks here: two tunes in one --out are not detected
        yield
        return
    fd = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ThriftyError(
                f"another thrifty tune is writing to {flag('--out')} {out}: wait for it to end, "
                f"or choose another {flag('--out')}"
            ) from None
        except OSError:  # a file system without locks (some network mounts): none taken
            pass
        yield
    finally:
        os.close(fd)


@contextmanager
def writing(out: Path, flag: Flag, again: str) -> Iterator[None]:
    """A failed write under --out as one line: a full disk (`OutOfSpace`), or the path and
    the reason. `again` says how to resume ("run the same command again")."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            detail = _detail(exc)
            raise OutOfSpace(
                f"no space left on the disk holding {flag('--out')} {out}{detail}: free some "
                f"space, then {again}; the finished trials are kept"
            ) from None
        if exc.filename is None or not str(exc.filename).startswith(str(out)):
            raise
        raise ThriftyError(
            f"cannot write {exc.filename} in {flag('--out')} {out}: {exc.strerror}"
        ) from None


def _detail(exc: OSError) -> str:
    if exc.filename is not None:
        return f" (writing {exc.filename})"
    if exc.strerror and exc.strerror != os.strerror(exc.errno or 0):
        return f" ({exc.strerror})"
    return ""
