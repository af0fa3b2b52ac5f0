"""Exception types. Every message is one line that names the problem and the fix."""

from __future__ import annotations

from types import ModuleType


class ThriftyError(Exception):
    """A user-facing error: the command line prints its message and exits with code 2."""


class DataSourceError(ThriftyError):
    """The training data raised mid-run: the finished steps are saved; exit code 1 (not bad
    input: the same command resumes once the source is back)."""

    exit_code = 1


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
