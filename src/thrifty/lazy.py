"""Lazy exports: a package names what it offers, and each name's module loads on first use.

This keeps importing `thrifty` and its packages cheap: torch, fsspec and the monitors load only
when a name that needs them is first used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's `__getattr__` and `__dir__` for the names in `exports` (a module's path: the
    names it lends the package, separated by spaces).

    `__getattr__` imports a name's module on first use and stores the value in `namespace` (the
    package's globals), so later lookups skip it; `__dir__` lists the package's `__all__`.
    """
    home = {name: module for module, names in exports.items() for name in names.split()}
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = home.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return list(namespace["__all__"])

    return __getattr__, __dir__
