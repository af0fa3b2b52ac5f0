"""Exception types. Every message is one line that names the problem and the fix."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any


class ThriftyError(Exception):
    """A user-facing error: the command line prints its message and exits with code 2."""


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
        return (type(self), (str(self), self.run_dir, self.summary))


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
