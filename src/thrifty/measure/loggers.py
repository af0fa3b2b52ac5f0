"""TensorBoard and MLflow: the figures of metrics.jsonl, for the tools a team already reads.

Both get what metrics.jsonl gets, when it gets it: at the metrics flush (once per logging
interval) and at events, never per step. Each interval becomes one point at its last step:

    train/loss, train/grad_norm   means over the interval's steps (the guard's skipped ones out)
    train/lr                      at the interval's last step
    throughput/tokens_per_second  the interval's tokens over its seconds
    throughput/mfu                the interval's MFU (as its last record has it)
    breakdown/<phase>             the phase's share of the interval's seconds (0 to 1)
    cost/usd, cost/projected_usd  dollars spent so far, and the whole run's projection
    val/loss                      at each evaluation's step

A logger is never a reason to stop training: one that fails says so once (one warning line)
and is silent from then on. MLflow calls run on a thread of their own, so a slow or
unreachable tracking server costs training nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from thrifty.config import LogConfig
from thrifty.errors import MissingDependencyError

log = logging.getLogger("thrifty")

Point = tuple[int, dict[str, float]]  # (optimizer step, {tag: value})

RUN_ID_FILE = "mlflow_run_id"  # in the run directory: a resumed run continues its MLflow run
TENSORBOARD_FLUSH_SECONDS = 10.0  # how stale TensorBoard's view may be; written on a thread
MLFLOW_CLOSE_SECONDS = 60.0  # the longest the end of a run waits for MLflow calls in flight
PARAM_CHARS = 6000  # the longest parameter value MLflow takes
PARAMS_PER_BATCH = 100  # MLflow's limit on parameters per log_batch call

# Unless the user's environment says otherwise: a file: store (what log.mlflow names) allowed,
# and HTTP calls that give up in seconds, not after MLflow's default of minutes of retries.
MLFLOW_ENV = {
    "MLFLOW_ALLOW_FILE_STORE": "true",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def require_packages(config: LogConfig) -> None:
    """Raise one line with the exact `pip install` for a logger whose package is missing:
    called before anything is written, so the run stops before training, not after."""
    wanted = []
    if config.tensorboard:
        wanted.append(("tensorboard", "log.tensorboard = true"))
    if config.mlflow:
        wanted.append(("mlflow", "log.mlflow"))
    for module, setting in wanted:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MissingDependencyError(
                f"{setting} needs the {module} package: pip install 'thrifty[{module}]'"
            ) from exc


# --- records to points ----------------------------------------------------------------------


class IntervalScalars:
    """Turns the records of one metrics.jsonl write into the points the loggers plot."""

    def __init__(self) -> None:
        # (step, tokens) of the newest step record seen: a step's tokens are its count less
        # the one before. Step 0 has trained none; after a resume the first is unknown.
        self._last: tuple[int, int] | None = (0, 0)

    def points(self, records: Sequence[Mapping[str, Any]]) -> list[Point]:
        """One point per evaluation and one for the interval's steps, finite values only."""
        raw: list[tuple[int, dict[str, Any]]] = [
            (r["step"], {"val/loss": r["val_loss"]}) for r in records if "val_loss" in r
        ]
        steps = [r for r in records if "step_seconds" in r]
        if steps:
            raw.append((steps[-1]["step"], self._interval(steps)))
        points = [(step, _finite(values)) for step, values in raw]
        return [(step, values) for step, values in points if values]

    def _interval(self, steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        last = steps[-1]
        counted = [r for r in steps if not r.get("skipped")]
        cost = last.get("cost") or {}
        return {
            "train/loss": _mean([r.get("loss") for r in counted]),
            "train/grad_norm": _mean([r.get("grad_norm") for r in counted]),
            "train/lr": last.get("lr"),
            "throughput/tokens_per_second": self._tokens_per_second(steps),
            "throughput/mfu": last.get("mfu"),
            "cost/usd": cost.get("usd"),
            "cost/projected_usd": (cost.get("projected") or {}).get("total_usd"),
            **_shares(steps),
        }

    def _tokens_per_second(self, steps: Sequence[Mapping[str, Any]]) -> float | None:
        tokens, seconds = 0, 0.0
        for r in steps:
            step, count = r["step"], r.get("tokens")
            if self._last is not None and count is not None and step == self._last[0] + 1:
                tokens += count - self._last[1]
                seconds += r["step_seconds"]
            self._last = (step, count) if count is not None else None
        return tokens / seconds if seconds > 0 else None


def _mean(values: Sequence[Any]) -> float | None:
    finite = [v for v in values if _is_figure(v)]
    return sum(finite) / len(finite) if finite else None


def _shares(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each phase's share of the interval's seconds, over the steps the breakdown timed."""
    timed = [r for r in steps if isinstance(r.get("breakdown"), Mapping)]
    total = sum(r["step_seconds"] for r in timed)
    if not timed or total <= 0:
        return {}
    phases = timed[-1]["breakdown"]
    return {
        f"breakdown/{p}": sum(r["breakdown"].get(p, 0.0) for r in timed) / total for p in phases
    }


def _is_figure(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite(values: Mapping[str, Any]) -> dict[str, float]:
    """What a plot can hold: a NaN loss or a missing MFU is left out, as metrics.jsonl has null."""
    return {k: float(v) for k, v in values.items() if _is_figure(v)}


# --- the backends ---------------------------------------------------------------------------


def _warn_failed(name: str, exc: BaseException) -> None:
    """The one line a failing logger writes: what failed, in a line, and that training goes on."""
    lines = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
    log.warning("%s logging failed (%s): training goes on without it", name, what)


class Logger:
    """A backend: fed metrics.jsonl's records (`write`), the run's files at its end (`finish`,
    after `close`). Never raises: its first failure is one warning, then it stays silent."""

    name = "logger"

    def __init__(self) -> None:
        self.failed = False
        self._scalars = IntervalScalars()

    def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        if not self.failed:
            self._guard(lambda: self._log(self._scalars.points(records)))

    def close(self) -> None:
        self._guard(self._close)

    def finish(self, files: Sequence[Path], finished: bool) -> None:
        """`files` (summary.json, report.html) kept where the backend keeps files;
        `finished`: the run ended for good (not preempted)."""
        if not self.failed:
            self._guard(lambda: self._finish(files, finished))

    def _guard(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as exc:  # a logger never stops training
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        if not self.failed:
            self.failed = True
            _warn_failed(self.name, exc)

    def _log(self, points: list[Point]) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _finish(self, files: Sequence[Path], finished: bool) -> None:
        """Nothing to keep by default: TensorBoard plots scalars only."""


class TensorBoardLogger(Logger):
    """Event files under <run dir>/tensorboard, written by TensorBoard's own writer on its
    thread: a point costs building one small protobuf."""

    name = "TensorBoard"

    def __init__(self, log_dir: Path, resumed_at: int | None) -> None:
        """`resumed_at`: the step a resumed run restarts from, or None for a fresh start."""
        # tensorboard ships no type information
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog  # type: ignore[import-untyped]
        from tensorboard.compat.proto.summary_pb2 import Summary  # type: ignore[import-untyped]
        from tensorboard.summary.writer.event_file_writer import (  # type: ignore[import-untyped]
            EventFileWriter,
        )

        super().__init__()
        self._event, self._summary = Event, Summary
        if resumed_at is None:  # the event files of a run started over are not this run's
            shutil.rmtree(log_dir, ignore_errors=True)
        self._writer = EventFileWriter(str(log_dir), flush_secs=TENSORBOARD_FLUSH_SECONDS)
        # TensorBoard hides what an earlier attempt logged past this step (work a preemption
        # threw away, done again now): a restart marker, as TensorFlow's own writes.
        start = Event(
            wall_time=time.time(),
            step=(resumed_at or 0) + 1,
            session_log=SessionLog(status=SessionLog.START),
        )
        self._writer.add_event(start)

    def _log(self, points: list[Point]) -> None:
        now = time.time()
        for step, values in points:
            summary = self._summary(
                value=[self._summary.Value(tag=k, simple_value=v) for k, v in values.items()]
            )
            self._writer.add_event(self._event(wall_time=now, step=step, summary=summary))

    def _close(self) -> None:
        self._writer.close()


class _FromThread(logging.Filter):
    """Drops the records one thread makes: the HTTP client's retry warnings would repeat the
    one line the logger writes."""

    def __init__(self, ident: int) -> None:
        super().__init__()
        self.ident = ident

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.ident


@contextlib.contextmanager
def _mlflow_env() -> Iterator[None]:
    """MLFLOW_ENV's settings, where the environment has none, for the calls inside."""
    added = [k for k in MLFLOW_ENV if k not in os.environ]
    os.environ.update({k: MLFLOW_ENV[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """The resolved config as MLflow parameters: dotted keys (`optimizer.lr`), JSON values."""
    params: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            params.update(flat_params(value, name + "."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            params[name] = text[:PARAM_CHARS]
    return params


class MlflowLogger(Logger):
    """One MLflow run per thrifty run, through an explicit MlflowClient (no active run is left
    in the process). Its calls run in order on a thread of their own; a resumed run continues
    the MLflow run whose id <run dir>/mlflow_run_id holds."""

    name = "MLflow"

    def __init__(
        self,
        config: LogConfig,
        run_dir: Path,
        *,
        run_name: str,
        params: dict[str, str],
        resumed: bool,
    ) -> None:
        super().__init__()
        self.run_id: str | None = None
        self._client: Any = None
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._tasks.put(lambda: self._open(config, run_dir, run_name, params, resumed))
        self._thread = threading.Thread(target=self._work, name="thrifty-mlflow", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        _yield_to_training()
        quiet = _FromThread(threading.get_ident())
        http_log = logging.getLogger("urllib3.connectionpool")
        http_log.addFilter(quiet)
        try:
            while (task := self._tasks.get()) is not None:
                if not self.failed:
                    with _mlflow_env():
                        self._guard(task)
        finally:
            http_log.removeFilter(quiet)

    def _open(
        self, config: LogConfig, run_dir: Path, run_name: str, params: dict[str, str], resumed: bool
    ) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        client = MlflowClient(tracking_uri=config.mlflow)
        id_file = run_dir / RUN_ID_FILE
        run_id = _existing_run(client, id_file) if resumed else None
        logged: Mapping[str, str] = {}
        if run_id is None:
            experiment = client.get_experiment_by_name(config.mlflow_experiment)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else client.create_experiment(config.mlflow_experiment)
            )
            run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
            tmp = id_file.with_suffix(".tmp")
            tmp.write_text(run_id + "\n")
            os.replace(tmp, id_file)
        else:
            client.update_run(run_id, status="RUNNING")
            logged = client.get_run(run_id).data.params
        # Parameters cannot change in MLflow: a resume logs only keys the run lacks; what a
        # resume changed is in config.toml and metrics.jsonl.
        new = [Param(k, v) for k, v in params.items() if k not in logged]
        for i in range(0, len(new), PARAMS_PER_BATCH):
            client.log_batch(run_id, params=new[i : i + PARAMS_PER_BATCH])
        self._client, self.run_id = client, run_id

    def _log(self, points: list[Point]) -> None:
        stamp = int(time.time() * 1000)  # milliseconds, as MLflow keeps them
        self._tasks.put(lambda: self._log_batch(points, stamp))

    def _log_batch(self, points: list[Point], stamp: int) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(k, v, stamp, step) for step, values in points for k, v in values.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def _close(self) -> None:
        """Send what is queued and mark the run ended ("KILLED" until `finish` says it is
        finished: a preempted run is resumed later, a crashed one is not finished either)."""
        self._tasks.put(lambda: self._client.set_terminated(self.run_id, "KILLED"))
        self._tasks.put(None)
        self._thread.join(MLFLOW_CLOSE_SECONDS)
        if self._thread.is_alive():
            raise TimeoutError(f"no answer within {MLFLOW_CLOSE_SECONDS:.0f} s")

    def _finish(self, files: Sequence[Path], finished: bool) -> None:
        with _mlflow_env():
            for path in files:
                self._client.log_artifact(self.run_id, str(path))
            if finished:
                self._client.set_terminated(self.run_id, "FINISHED")


def _yield_to_training() -> None:
    """Run the calling thread at the lowest CPU priority, so that where the training keeps
    every core busy the logger's writes wait, not the steps (a file: store spends ~3 ms of
    CPU per flush). Linux only: there a thread is a task of its own that setpriority names
    by its id; elsewhere the same call would renice the whole process."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def _existing_run(client: Any, id_file: Path) -> str | None:
    """The MLflow run an earlier attempt of this run logged to, if the server still has it."""
    from mlflow.exceptions import MlflowException

    if not id_file.exists():
        return None
    run_id = id_file.read_text().strip()
    try:
        run = client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":  # another server, or deleted
            return None
        raise
    return run_id if run.info.lifecycle_stage == "active" else None


def make_loggers(
    config: LogConfig,
    run_dir: Path,
    *,
    run_name: str,
    params: Mapping[str, Any],
    step: int,
    resumed: bool,
) -> list[Logger]:
    """Rank 0's loggers for the [log] section `config` (their packages checked by
    `require_packages`); `params` is the run's resolved config (credentials removed), which
    MLflow records as its parameters. One that cannot start says so once and is left out: the
    run goes on without it."""
    c = config
    makers: list[tuple[str, Callable[[], Logger]]] = []
    if c.tensorboard:
        resumed_at = step if resumed else None
        makers.append(
            ("TensorBoard", lambda: TensorBoardLogger(run_dir / "tensorboard", resumed_at))
        )
    if c.mlflow:
        flat = flat_params(params)
        makers.append(
            (
                "MLflow",
                lambda: MlflowLogger(c, run_dir, run_name=run_name, params=flat, resumed=resumed),
            )
        )
    loggers = []
    for name, make in makers:
        try:
            loggers.append(make())
        except Exception as exc:  # a logger never stops training
            _warn_failed(name, exc)
    return loggers
