"""What thrifty brings to another framework's training loop, whatever the framework: the
config sections that apply, the preemption watch, the checkpoint interval, the manifest that
makes a framework's checkpoint trusted, the cost meter and the run's record.

A framework's callback (`thrifty.integrations.transformers`, `...lightning`) calls a `Session`
at the moments it has: `begin` before the first step, `step_end` after each optimizer step
(a few clock reads and additions; nothing that waits for the device), `evaluated` after an
evaluation, `published` once the framework's save of a checkpoint is complete, `end` when
training returns. `stop_reason` says whether the run must stop at this step boundary, and
`save_due` whether a checkpoint is due.

The record: `<output dir>/thrifty/` holds config.toml (the sections given, secrets left
out), metrics.jsonl (a record every `run.log_every` steps with the cost meter's snapshot, a
`resumed` event per relaunch) and summary.json, the files a thrifty run writes, so `thrifty
runs` and `thrifty report` read these runs as their own. What a run is billed for: the wall
time of every attempt, from `fit()` to its end, at the price of the whole job; an attempt
killed without a word is billed to its last record, and the steps it trained past the
checkpoint the next attempt resumes from are its wasted seconds.

A checkpoint is trusted only with its manifest (`thrifty.integrations.manifest`): written after
the framework's save returned, listing every file with its size, each file flushed to disk
first. A folder without one, or whose files do not match it, is a save cut short: it is never
resumed from and never deleted (it is the framework's), and one line says so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from thrifty.checkpointing.saving.preemption import PreemptionWatcher
from thrifty.checkpointing.saving.saves import SaveInterval
from thrifty.config import TrainConfig, dump_toml, read_config_file
from thrifty.errors import ConfigError
from thrifty.integrations.manifest import manifest_of, publish
from thrifty.integrations.manifest import (
    newest_complete as newest_complete,
)  # lent to the frameworks' modules
from thrifty.integrations.record import (
    figure,
    last_finite,
    lost_work,
    read_summary,
    rewrite_records,
    step_breakdown,
)
from thrifty.measure.cost import CostMeter
from thrifty.measure.forecast import cannot_reach
from thrifty.records.stop_signals import EXIT_PREEMPTED
from thrifty.redact import redact_value
from thrifty.rundir.files import read_metrics, write_json
from thrifty.rundir.lock import RunLock

log = logging.getLogger("thrifty")

RECORD_DIR = "thrifty"
# The sections that act inside another framework's loop; the rest (batch, precision,
# optimizer, ...) are the framework's own settings there.
APPLIES = ("run", "checkpoint", "spot", "cost", "early_stopping", "guard", "measure", "log")
_RUN_KEYS = ("name", "log_every")
_CHECKPOINT_KEYS = ("every", "interruption_rate", "max_interval", "resume", "keep_last")


def load_sections(config: Any, framework: str) -> TrainConfig:
    """The thrifty sections `config` gives (a TOML path, a dict or a TrainConfig) as a
    TrainConfig; one line, naming the key, for one that does not apply inside `framework`."""
    if config is None:
        data: dict[str, Any] = {}
    elif isinstance(config, TrainConfig):
        data = config.to_dict()
    elif isinstance(config, (str, os.PathLike)):
        data = read_config_file(config)
    elif isinstance(config, Mapping):
        data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    else:
        raise ConfigError(
            f"config = {config!r} is invalid: give a TOML file's path, a dict of sections or a "
            "thrifty.TrainConfig"
        )
    _refuse_what_does_not_apply(data, framework, given=not isinstance(config, TrainConfig))
    run = dict(data.get("run") or {})
    data["run"] = {**{k: run[k] for k in _RUN_KEYS if k in run}, "max_epochs": 1}
    return TrainConfig.from_dict(data)


def _refuse_what_does_not_apply(data: Mapping[str, Any], framework: str, given: bool) -> None:
    if not given:  # a TrainConfig carries every section at its default: only its values count
        return
    for section in data:
        if section not in APPLIES:
            raise ConfigError(
                f"[{section}] does not apply inside {framework}: the framework's own arguments "
                f"set it; thrifty takes [{'], ['.join(APPLIES)}] there"
            )
    for key in data.get("run") or {}:
        if key not in _RUN_KEYS:
            raise ConfigError(
                f"run.{key} does not apply inside {framework}: its own arguments say how long "
                f"to train; thrifty takes run.{' and run.'.join(_RUN_KEYS)} there"
            )
    checkpoint = data.get("checkpoint") or {}
    for key in checkpoint:
        if key not in _CHECKPOINT_KEYS:
            raise ConfigError(
                f"checkpoint.{key} does not apply inside {framework}: the framework saves into "
                f"its own output directory; thrifty takes checkpoint."
                f"{', checkpoint.'.join(_CHECKPOINT_KEYS)} there"
            )


# --- the session -----------------------------------------------------------------------------


class Session:
    """One attempt of a run inside `framework`, recorded under `output_dir/thrifty`.

    `world_size`: the processes training (one GPU each); `rank`: this one's (only rank 0
    writes the record)."""

    def __init__(
        self,
        config: TrainConfig,
        output_dir: str | os.PathLike[str],
        *,
        framework: str,
        world_size: int = 1,
        rank: int = 0,
    ) -> None:
        self.config, self.framework = config, framework
        self.output_dir = Path(output_dir)
        self.run_dir = self.output_dir / RECORD_DIR
        self.world_size, self.rank = world_size, rank
        given = config.run.name
        self.name = given if given != "run" else self.output_dir.resolve().name
        self.fit_start = time.perf_counter()
        self.meter = _meter(config, world_size)
        spot = config.spot
        self.watcher = PreemptionWatcher(
            spot.provider,
            base_url=spot.metadata_url,
            poll_interval=spot.poll_seconds,
            signals=spot.signals,
        )
        self.interval = SaveInterval(config.checkpoint)
        self.step = self.first_step = 0
        self.samples = self.tokens = 0
        self.train_seconds = 0.0  # this attempt's, from the first step on
        self.resumed_seconds = 0.0  # the training clock the checkpoint resumed from holds
        self.data_seconds = self.compute_seconds = 0.0
        self.losses: list[float] = []
        self.flops = 0.0  # this attempt's model FLOPs, every rank's
        self.peak: float | None = None
        self._at_begin = (0, 0)
        self.val_steps: list[int] = []
        self.val_losses: list[float] = []
        self.reason: str | None = None
        self.why = ""
        self.saved_step: int | None = None
        self.good_step = 0  # the last step whose loss was read finite
        self._published: dict[int, Path] = {}  # this attempt's saves, by step
        self._save_asked: float | None = None
        self._pending: list[dict[str, Any]] = []
        self.lock: RunLock | None = None
        self._last = time.perf_counter()

    # --- before the first step -------------------------------------------------------------

    def begin(self, resumed_step: int, peak_flops_per_second: float | None = None) -> None:
        """The attempt starts training at `resumed_step` (0: from scratch): the record is
        opened, what an earlier attempt threw away billed, and the stop signals watched.
        `peak_flops_per_second`: the device's, for MFU (None: no MFU)."""
        self.step = self.first_step = self.good_step = resumed_step
        self.peak = peak_flops_per_second
        self.interval.saved(resumed_step)
        if self.rank == 0:
            # One writer per record: a second job on the same output directory stops here,
            # naming the first (the kernel drops the lock of a process that dies).
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.lock = RunLock(self.run_dir, run_dir_fix="give it another output directory")
            self.lock.acquire()
            self._open_record(resumed_step)
        self._at_begin = (self.samples, self.tokens)
        self.watcher.start()
        self._last = time.perf_counter()

    def _open_record(self, resumed_step: int) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.config.to_dict(secrets=False)
        tables = {k: config[k] for k in APPLIES if k in config}
        tables["run"] = {"name": self.name}
        # Where the framework's checkpoints are: the ledger groups a job's machines by it.
        where = str(self.output_dir.resolve())
        tables["checkpoint"] = {**tables.get("checkpoint", {}), "location": where}
        (self.run_dir / "config.toml").write_text(dump_toml(tables))
        metrics = self.run_dir / "metrics.jsonl"
        records = read_metrics(metrics) if metrics.is_file() else []
        lost, kept = lost_work(records, resumed_step, read_summary(self.run_dir))
        self.resumed_seconds = lost.resumed_seconds
        last: dict[str, Any] = next(
            (r for r in reversed(kept) if "samples" in r and "event" not in r), {}
        )
        self.samples = int(figure(last, "samples", 0))
        self.tokens = int(figure(last, "tokens", 0))
        if self.meter is not None:
            self.meter.add_wasted(lost)
            self.meter.update(self.resumed_seconds)
        if records or resumed_step:
            kept.append({"event": "resumed", "step": resumed_step, **lost.to_record()})
            rewrite_records(metrics, kept)
            log.info("%s: resumed at step %d", self.framework, resumed_step)

    # --- at each step boundary -------------------------------------------------------------

    def step_end(
        self, step: int, *, samples: int = 0, tokens: int = 0, loss: float | None = None,
        data_seconds: float = 0.0, flops: float = 0.0,
    ) -> None:  # fmt: skip
        """Optimizer step `step` is done: it took the time since the last boundary, of which
        `data_seconds` waiting for the batch, and `flops` of model work (every rank's).
        Clock reads and sums only."""
        now = time.perf_counter()
        seconds = now - self._last
        self._last = now
        self.step = step
        self.samples += samples
        self.tokens += tokens
        self.flops += flops
        self.train_seconds += seconds
        self.data_seconds += data_seconds
        self.compute_seconds += seconds - data_seconds
        if loss is not None:
            self._judge(step, loss)
        if self.watcher.requested and self.reason is None:
            self._stop("preempted", self.watcher.reason)
        if self.rank == 0:
            # The newest record waits for the next boundary: the framework may log its loss.
            if len(self._pending) >= self.config.run.log_every:
                self.flush()
            # Seconds per phase, as a thrifty run records them: the data wait, and "other" for
            # the framework's forward, backward and optimizer, which a callback cannot split.
            phases = {"data_wait": data_seconds, "other": seconds - data_seconds}
            self._pending.append(
                {"step": step, "loss": loss, "step_seconds": seconds, "breakdown": phases}
            )

    def logged(self, step: int, loss: float) -> None:
        """The framework logged `loss` for step `step` (a mean since its last log): the
        record of that step carries it, and one not finite stops the run (guard.enabled)."""
        if self._pending and self._pending[-1]["step"] == step:
            self._pending[-1]["loss"] = loss
        self._judge(step, loss)

    def _judge(self, step: int, loss: float) -> None:
        """A loss read at `step`: a finite one moves the last good step; one that is not stops
        the run (guard.enabled), and the saves published after the last good step lose their
        manifests, so that no resume takes a state the loss had already left."""
        self.losses.append(loss)
        if math.isfinite(loss):
            self.good_step = step
            return
        if not self.config.guard.enabled or self.reason is not None:
            return
        self._stop("diverged", f"the training loss is {loss} at step {step}")
        for saved in sorted(s for s in self._published if s > self.good_step):
            path = self._published.pop(saved)
            if self.rank == 0:
                manifest_of(path).unlink(missing_ok=True)
            log.warning(
                "checkpoint %s was saved after the last finite loss (step %d): it is no "
                "longer trusted, so no resume takes it",
                path,
                self.good_step,
            )

    def save_due(self) -> bool:
        """Whether a checkpoint is due after this step: a stop that keeps its work, or the
        interval (checkpoint.every). The time from here to `published` is the save's."""
        due = self.reason == "preempted" or self.interval.due(self.step)
        if due:
            self._save_asked = time.perf_counter()
        return due

    def published(self, step: int, path: Path) -> None:
        """The framework's save of step `step` at `path` is complete: its manifest is written
        (rank 0), and with checkpoint.every = "auto" its time sets the interval."""
        if self.rank == 0:
            publish(path, step, self.framework)
        took = time.perf_counter() - (self._save_asked or time.perf_counter())
        if self.interval.measuring:
            self.interval.measured(took, took)
        self.interval.saved(step)
        self.saved_step = step
        self._published[step] = path
        self._last = time.perf_counter()  # the save is no step's time
        self._save_asked = None
        log.info("checkpoint step %d written to %s", step, path)

    def evaluated(self, step: int, loss: float, end_step: int | None) -> None:
        """An evaluation at `step` measured `loss`; with early_stopping.target and the run's
        last step known, the forecast may stop the run."""
        self.val_steps.append(step)
        self.val_losses.append(loss)
        target = self.config.early_stopping.target
        if target is None or end_step is None or self.reason is not None:
            return
        decision = cannot_reach(self.val_steps, self.val_losses, target, end_step)
        if decision:
            self._stop("forecast", decision.reason)

    def _stop(self, reason: str, why: str) -> None:
        self.reason, self.why = reason, why
        log.warning("%s: stopping at step %d: %s", self.framework, self.step, why)

    @property
    def stop_reason(self) -> str | None:
        """preempted, diverged, forecast, or None to go on."""
        return self.reason

    def rates(self) -> dict[str, float | None]:
        """This attempt's samples/s, tokens/s and MFU so far (None where unknown)."""
        seconds = self.train_seconds
        samples = self.samples - self._at_begin[0]
        tokens = self.tokens - self._at_begin[1]
        mfu = None
        if self.peak and self.flops and seconds > 0:
            mfu = self.flops / seconds / (self.peak * self.world_size)
        return {
            "samples_per_second": samples / seconds if seconds > 0 else None,
            "tokens_per_second": tokens / seconds if seconds > 0 and tokens else None,
            "mfu": mfu,
        }

    def live(self) -> dict[str, float]:
        """What the framework's own logs carry: dollars so far, tokens/s, MFU (where known)."""
        figures = {k: v for k, v in self.rates().items() if v is not None}
        if self.meter is not None:
            self.meter.update(self.resumed_seconds + self.train_seconds, self.tokens, self.samples)
            figures["usd"] = self.meter.usd
        return {f"thrifty/{k}": v for k, v in figures.items()}

    # --- the record ------------------------------------------------------------------------

    def flush(self) -> None:
        """Write the pending step records with the meter's snapshot (rank 0)."""
        if not self._pending or self.rank != 0:
            return
        last = self._pending[-1]
        last["samples"], last["tokens"] = self.samples, self.tokens
        if self.meter is not None:
            elapsed = self.resumed_seconds + self.train_seconds
            last["cost"] = self.meter.update(elapsed, self.tokens, self.samples).to_dict()
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            for record in self._pending:
                f.write(json.dumps(redact_value(record)) + "\n")
        self._pending.clear()

    def end(self, finished: bool = True) -> int:
        """The attempt's end: the record completed (summary.json), the watch stopped, and the
        exit code a relaunch wrapper needs: 75 after a preemption (the same command resumes),
        1 for a diverged run, else 0."""
        self.watcher.stop()
        reason = self.reason or ("finished" if finished else "stopped")
        if self.rank == 0:
            self.flush()
            self._write_summary(reason)
        self.release()
        if reason == "preempted":
            log.warning(
                "%s: preempted (%s) at step %d%s: run the same command to resume (exit code %d)",
                self.framework,
                self.why,
                self.step,
                f", saved as step {self.saved_step}" if self.saved_step == self.step else "",
                EXIT_PREEMPTED,
            )
            return EXIT_PREEMPTED
        return 1 if reason == "diverged" else 0

    def release(self) -> None:
        """Stop watching and let go of the record's lock (idempotent): the attempt is over."""
        self.watcher.stop()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def _write_summary(self, reason: str) -> None:
        wall = time.perf_counter() - self.fit_start
        cost = None
        if self.meter is not None:
            self.meter.update(self.resumed_seconds + self.train_seconds, self.tokens, self.samples)
            cost = self.meter.summary(wall)
        seconds = self.train_seconds
        rates = self.rates()
        summary = {
            "stop_reason": reason,
            "why": self.why or None,
            "framework": self.framework,
            "steps": self.step,
            "samples": self.samples,
            "tokens": self.tokens,
            "train_loss": last_finite(self.losses),
            "val_loss": self.val_losses[-1] if self.val_losses else None,
            "wall_seconds": wall,
            "training_seconds": self.resumed_seconds + seconds,
            **rates,
            "world_size": self.world_size,
            "breakdown": step_breakdown(
                self.data_seconds, self.compute_seconds, self.step - self.first_step
            ),
            "cost": cost.to_dict() if cost is not None else None,
        }
        write_json(self.run_dir / "summary.json", summary)
        spent = f"; {cost.describe()}" if cost is not None else ""
        log.info("%s: %s after %d steps%s", self.framework, reason, self.step, spent)


def device_peak(config: TrainConfig, device: Any, dtype: str) -> float | None:
    """The device's peak FLOP/s in `dtype` for MFU: measure.peak_tflops (or
    THRIFTY_PEAK_TFLOPS) where given, the catalog's figure on a GPU; None on a CPU without a
    given peak (measuring one would cost the run a benchmark) or for a device not known."""
    import torch

    from thrifty.errors import ThriftyError
    from thrifty.measure.peak import PEAK_ENV, peak_flops

    device = torch.device(device)
    given = config.measure.peak_tflops
    if given is None and device.type != "cuda" and not os.environ.get(PEAK_ENV):
        return None
    try:
        return peak_flops(device, dtype, given_tflops=given).flops_per_second
    except ThriftyError:
        return None


def _meter(config: TrainConfig, world_size: int) -> CostMeter | None:
    """The cost meter [cost] describes (None without a price: the ledger then counts the
    seconds from the step records)."""
    cost = config.cost
    if cost.instance is None and cost.usd_per_gpu_hour is None:
        return None
    return CostMeter.from_config(cost, world_size=world_size)


def agreed(flag: bool) -> bool:
    """Whether any rank raised `flag`, where torch.distributed runs several (one small
    all-reduce: every rank asks at the same step boundary); `flag` itself otherwise."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    tensor = torch.tensor([int(flag)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())
