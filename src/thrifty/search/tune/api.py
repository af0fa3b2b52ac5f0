"""`thrifty.tune(...)`: the search `thrifty tune` runs, from Python."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from thrifty.config import TrainConfig
from thrifty.errors import ConfigError, ThriftyError
from thrifty.search.tune.report import TuneResult
from thrifty.search.tune.session import DEFAULT_BUDGET, DEFAULT_STEPS, make_plan, run_tune


class TuneFailed(ThriftyError):
    """No trial found a winner; `result` holds the trials that did run (and why each failed)."""

    def __init__(self, message: str, result: TuneResult) -> None:
        super().__init__(message)
        self.result = result


def tune(
    model_factory: Callable[..., Any] | str,
    data: Callable[..., Any] | str,
    config: TrainConfig | Mapping[str, Any] | str | os.PathLike[str],
    budget: str | float = DEFAULT_BUDGET,
    *,
    steps: int = DEFAULT_STEPS,
    out: str | os.PathLike[str] | None = None,
    instance: str | None = None,
    levers: str | Sequence[str] | None = None,
    micro: str | Sequence[int] | None = None,
    overwrite: bool = False,
) -> TuneResult:
    """Search the levers for the lowest cost per token of `config`'s job; return the trials
    and the winner (`result.trials`, `result.winner`, `result.winner_config`).

    Each trial trains in its own process (`python -m thrifty train`), so an out-of-memory
    error or a compile crash costs that trial only; the processes import the model and the
    data by name, as a config's [task] does. So `model_factory` (-> nn.Module) and `data`
    (-> the training Dataset) are module-level functions, or their import paths
    "package.module:function". A function of the script being run (`python my_tune.py`) is
    imported from that script's file, so keep the call to `tune` under
    `if __name__ == "__main__":`; lambdas and nested functions cannot be imported and are
    refused. `config`: a TrainConfig, its dict, or a TOML file; its [task] supplies anything
    else (optimizer, loss_fn, model_args, ...).

    `budget`: the whole search's time ("10m", "90s" or seconds); `steps`: optimizer steps per
    trial; `out`: where the trials and winner.toml go (default runs/tune-<run.name>);
    `instance`: a catalog instance to price the job on (default: the config's [cost]);
    `levers`: the levers to search (default all: workers, precision, micro, checkpointing,
    compile); `micro`: micro-batch sizes to try instead of the largest that fits.
    Raises TuneFailed (with `.result`) when no trial finished; TuneStopped after SIGTERM or
    SIGINT (the same call resumes: the finished trials are kept in `out`).
    """
    given, name = _given(config)
    extra_paths: list[str] = []
    task = dict(given.get("task", {}))
    task["model"] = import_path(model_factory, "model_factory", extra_paths)
    task["train_data"] = import_path(data, "data", extra_paths)
    given["task"] = task
    plan = make_plan(
        given,
        name,
        out=out,
        budget=budget,
        steps=steps,
        levers=levers,
        micro=micro,
        instance=instance,
        overwrite=overwrite,
        env=_child_env(extra_paths),
    )
    result = run_tune(plan)
    if result.reason is not None:
        raise TuneFailed(result.reason, result)  # worded for Python by str(), as its fixes
    return result


def _given(config: TrainConfig | Mapping[str, Any] | str | os.PathLike[str]) -> tuple[dict, str]:
    """The config as given (TOML data) and the name the report uses for it."""
    from thrifty.search.tune.session import read_given

    if isinstance(config, TrainConfig):
        data = config.to_dict()  # credentials reach the trials through a pipe, never a file
    elif isinstance(config, Mapping):
        data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    else:
        return read_given(config), str(config)
    return data, str(TrainConfig.from_dict(data).run.name)


def import_path(obj: Callable[..., Any] | str, argument: str, extra_paths: list[str]) -> str:
    """The "module:qualname" a trial process imports `obj` by; a function of the script being
    run adds the script's folder to `extra_paths` (the children's PYTHONPATH)."""
    if isinstance(obj, str):
        return obj
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if not callable(obj) or module is None or "<" in qualname:
        raise ConfigError(
            f"{argument} = {obj!r} cannot reach the trial processes: give a module-level "
            "function (not a lambda or a nested function) or its import path "
            "'package.module:function'"
        )
    if module == "__main__":
        script = getattr(sys.modules["__main__"], "__file__", None)
        if script is None:
            raise ConfigError(
                f"{argument} = {qualname} is defined in an interactive session, which the "
                "trial processes cannot import: move it into a module and pass it (or "
                "'package.module:function')"
            )
        extra_paths.append(str(Path(script).resolve().parent))
        module = Path(script).stem
    return f"{module}:{qualname}"


def _child_env(extra_paths: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    if extra_paths:
        paths = [*extra_paths, env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env
