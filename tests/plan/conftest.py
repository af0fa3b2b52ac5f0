"""Shared helpers for the planner's tests: run the `thrifty` command line in-process."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import thrifty.cli


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> dict:
        return json.loads(self.out)


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Result]:
    """Run `thrifty ARGS...` in-process and return the exit code, stdout and stderr."""
    modules = []
    for name in thrifty.cli.COMMAND_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # a sibling command still under construction must not hide ours
            continue
        modules.append(name)
    monkeypatch.setattr(thrifty.cli, "COMMAND_MODULES", tuple(modules))
    monkeypatch.delenv("THRIFTY_CATALOG", raising=False)
    monkeypatch.setenv("COLUMNS", "120")

    def run(*args: str) -> Result:
        try:
            code = thrifty.cli.main(list(args))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
