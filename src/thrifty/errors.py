"""Exception types. Every message is one line that names the problem and the fix.

A fix that is a setting is written in a message as `fix(key)`: a marker for the config key (or
a command's option) that the user sets. `str(error)` words it as Python does
(`RunConfig(overwrite=True)`), the command line's error printer as its flag (`--overwrite`,
`command_line_words`): `FIXES` holds both wordings of every key, in one place.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

# (key, phrase): (the command line's words, Python's words); "{}" stands for the value given. A
# phrase is how a message uses the key where the two wordings differ by more than its name.
FIXES: dict[tuple[str, str], tuple[str, str]] = {
    ("run.out", ""): ("--out", "RunConfig(out=...)"),
    ("run.out", "choose another"): (
        "choose another --out",
        "give another run directory (RunConfig(out=...))",
    ),
    ("run.out", "use another"): ("use another --out", "give another RunConfig(out=...)"),
    ("run.overwrite", ""): ("--overwrite", "RunConfig(overwrite=True)"),
    ("run.overwrite", "with its key"): (
        "--overwrite (run.overwrite = true)",
        "RunConfig(overwrite=True)",
    ),
    ("run.max_steps", "a larger budget"): ("a larger budget (--steps)", "a larger budget"),
    ("checkpoint.resume", ""): ("--resume {}", "checkpoint.resume = {}"),
    # `thrifty tune`'s options and `tune()`'s arguments.
    ("tune.budget", ""): ("--budget", "budget"),
    ("tune.steps", ""): ("--steps", "steps"),
    ("tune.levers", ""): ("--levers", "levers"),
    ("tune.micro", ""): ("--micro", "micro"),
    ("tune.instance", ""): ("--instance", "instance"),
    ("tune.out", ""): ("--out", "out"),
    ("tune.overwrite", ""): ("--overwrite", "overwrite"),
    ("tune", "again"): ("run the same command again", "call tune() again with the same arguments"),
}

# A marker: key, phrase and value between control characters no message holds.
_MARK = re.compile("\x1f([^\x1e\x1f]*)\x1e([^\x1e\x1f]*)\x1e([^\x1f]*)\x1f")


def fix(key: str, value: object = None, *, phrase: str = "") -> str:
    """A marker in a message for the setting that fixes it: config key `key` (or a command's
    option, "tune.budget") set to `value`, used as `phrase` (a key of FIXES). A key FIXES does
    not hold is worded `--set key=value` on the command line and `key = value` in Python."""
    if phrase and (key, phrase) not in FIXES:
        raise KeyError(f"no wording for {key!r} as {phrase!r}: add it to FIXES")
    shown = "" if value is None else str(value)
    return f"\x1f{key}\x1e{phrase}\x1e{shown}\x1f"


def python_words(text: str) -> str:
    """`text` with each fix worded as a Python argument (`RunConfig(overwrite=True)`)."""
    return _MARK.sub(lambda m: _worded(m[1], m[2], m[3], side=1), text)


def command_line_words(message: str | BaseException) -> str:
    """A message (or an error's) with each fix worded as the command line's flag
    (`--overwrite`): for the command line's printer only."""
    if isinstance(message, BaseException):
        args = message.args
        message = args[0] if len(args) == 1 and isinstance(args[0], str) else str(message)
    return _MARK.sub(lambda m: _worded(m[1], m[2], m[3], side=0), message)


def _worded(key: str, phrase: str, value: str, *, side: int) -> str:
    words = FIXES.get((key, phrase))
    if words is None:
        return f"--set {key}={value}" if side == 0 else f"{key} = {value}"
    return words[side].replace("{}", value).rstrip()


class ThriftyError(Exception):
    """A user-facing error: the command line prints its message and exits with code 2.

    Its fixes (`fix`) are worded as Python arguments in `str(error)`; the command line's printer
    words them as flags (`command_line_words`)."""

    def __str__(self) -> str:
        return python_words(super().__str__())


class DataSourceError(ThriftyError):
    """The training data raised mid-run: the finished steps are saved; exit code 1 (not bad
    input: the same command resumes once the source is back)."""

    exit_code = 1


class RunAlreadyFinished(ThriftyError):
    """The run directory holds a finished run of this same config: there is nothing to train.

    Not a failure (an engine relaunching a job whose success it never saw): the command line
    prints the message as a plain `thrifty: ...` line and exits with code 0. `Trainer.fit()`
    raises it rather than return, so that a script relaunched after its run finished does not
    carry on with a model it never trained; `run_dir` and `summary` (the finished run's
    summary.json) say what was done.
    """

    exit_code = 0

    def __init__(self, message: str, run_dir: Path, summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.run_dir = run_dir
        self.summary = summary

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.run_dir, self.summary))


class ConfigError(ThriftyError, ValueError):
    """A configuration value is wrong: the message names the dotted field, the value and what is allowed."""


class MissingDependencyError(ThriftyError, ImportError):
    """An optional package is needed: the message quotes the exact pip install."""


def require(module: str, extra: str) -> ModuleType:
    """Import an optional dependency or raise an error quoting the install command."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{module} is not installed: pip install 'thrifty[{extra}]'"
        ) from exc
