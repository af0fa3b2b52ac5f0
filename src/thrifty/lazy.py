"""Lazy exports: a package names what it offers, and each name's module loads on first use.

This keeps importing `thrifty` and its packages cheap: torch, fsspec and the monitors load only
when a name that needs them is first used. A process that will use torch loads it at once with
`load_torch`.
"""

from __future__ import annotations

import gc
import importlib
import sys
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


def load_torch(compiler: bool = True) -> None:
    """Import torch with the cyclic garbage collector off, then freeze what the import built.

    The import makes about a million objects that live as long as the process. With the
    collector on, it walks them again and again while they load, and every full collection
    during training walks them once more; frozen (`gc.freeze`), no later collection looks at
    them. A 12-step run of `thrifty train` on a 2-core machine took 4.53 s of CPU instead of
    5.40 s (the means of four runs of each, interleaved), most of it in starting up.

    `compiler` imports torch._dynamo in the same window: a process that trains imports it
    anyway, since torch's optimizers wrap `add_param_group`, `zero_grad` and `state_dict` in
    `torch._disable_dynamo`, which imports it on their first call. A 3-step `thrifty train` of
    examples/mlp.toml took 5.14 s of CPU instead of 5.72 s (five runs of each, interleaved). A
    process that only launches others (`--nprocs N`) leaves it out."""
    if "torch" in sys.modules and (not compiler or "torch._dynamo" in sys.modules):
        return
    gc.disable()
    try:
        import torch  # noqa: F401

        if compiler:
            import torch._dynamo  # noqa: F401
    finally:
        gc.enable()
    gc.freeze()
