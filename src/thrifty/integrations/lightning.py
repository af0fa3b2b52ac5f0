"""thrifty inside Lightning: `fit(trainer, model, ..., config=...)` in place of
`trainer.fit(model, ...)`.

    from thrifty.integrations import lightning as thrifty_pl
    thrifty_pl.fit(trainer, model, datamodule=dm, config="thrifty.toml")

What it adds (`ThriftyCallback`, also usable on its own in `Trainer(callbacks=[...])`, with
`ckpt_path=thrifty_pl.newest_checkpoint(trainer)` to resume):
- a stop signal (SIGTERM, SIGINT, SIGUSR1) or a cloud's interruption notice saves a checkpoint
  with `trainer.save_checkpoint` at the next optimizer step and sets `trainer.should_stop`;
  `fit` then ends the process with exit code 75 (Lightning's own SIGTERM handling stops the
  loop and exits 0: a requeue wrapper sees success). thrifty's handler replaces Lightning's
  while the training loop runs, so Lightning does not also stop on the same signal;
- the same command resumes from the newest checkpoint with a manifest, in
  `ROOT/thrifty/checkpoints/step-N.ckpt` (ROOT: the Trainer's `default_root_dir`); a file a
  kill cut short is passed over with one line. A mid-epoch resume is exact where the loader
  has a `state_dict` (torchdata's `StatefulDataLoader`), which Lightning saves and restores;
  with a plain DataLoader, Lightning restarts the epoch's data on resume;
- `checkpoint.every` (steps, a duration, or "auto": Young/Daly from the first save), keeping
  the newest `checkpoint.keep_last` of thrifty's own saves (Lightning's ModelCheckpoint keeps
  its own files as it always does);
- the cost meter and the run's record in `ROOT/thrifty/`, for `thrifty runs`;
- a stop through `trainer.should_stop`, without a save, for a training loss that is not finite
  (read once every `run.log_every` steps: reading it is a host sync), and for a run the
  forecast says cannot reach `early_stopping.target` (from the logged `val_loss`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from thrifty.errors import ThriftyError
from thrifty.integrations.session import (
    RECORD_DIR,
    Session,
    agreed,
    device_peak,
    load_sections,
    manifest_of,
    newest_complete,
)
from thrifty.reporting.end_of_run import console_for_api

FRAMEWORK = "lightning"

try:
    from lightning.pytorch.callbacks import Callback
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "thrifty.integrations.lightning needs Lightning: pip install 'thrifty[lightning]'"
    ) from exc


def checkpoint_dir(root: str | Path) -> Path:
    """Where thrifty's saves of a Lightning run go: ROOT/thrifty/checkpoints."""
    return Path(root) / RECORD_DIR / "checkpoints"


class ThriftyCallback(Callback):
    """Lightning's callback: `config` is a TOML path, a dict of sections or a TrainConfig
    (the sections that apply: run.name, checkpoint, spot, cost, early_stopping, guard,
    measure, log)."""

    def __init__(self, config: Any = None) -> None:
        self.sections = load_sections(config, FRAMEWORK)
        self.session: Session | None = None
        self._step = 0
        self._began = self._last_end = 0.0
        self._samples = self._tokens = 0
        self._per_token = 0.0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # After Lightning registered its signal handlers: the watcher's replace them while
        # the loop runs, and give them back at the end.
        self.session = Session(
            self.sections,
            trainer.default_root_dir,
            framework=FRAMEWORK,
            world_size=trainer.world_size,
            rank=trainer.global_rank,
        )
        self._step = trainer.global_step
        dtype = _dtype(str(trainer.precision))
        self.session.begin(self._step, device_peak(self.sections, pl_module.device, dtype))
        # Model FLOPs per token, for a token model (6 per parameter: forward and backward).
        self._per_token = 6.0 * sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        self._last_end = time.perf_counter()

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._samples and not self._tokens:  # the first micro-batch of a step
            self._began = time.perf_counter()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        session = self.session
        if session is None:
            return
        samples, tokens = _shape_counts(batch)
        self._samples += samples
        self._tokens += tokens
        step = trainer.global_step
        if step == self._step:  # accumulating: no optimizer step yet
            return
        self._step = step
        loss = None
        if step % self.sections.run.log_every == 0:  # a host sync: once per record interval
            loss = _loss(outputs)
        world = trainer.world_size
        session.step_end(
            step,
            samples=self._samples * world,
            tokens=self._tokens * world,
            loss=loss,
            data_seconds=max(0.0, self._began - self._last_end),
            flops=self._tokens * world * self._per_token,
        )
        if loss is not None and trainer.is_global_zero and trainer.loggers:
            live = session.live()  # the user's loggers get the dollars: plain floats, no tensor
            for logger in trainer.loggers:
                logger.log_metrics(live, step=step)
        self._samples = self._tokens = 0
        stop = session.stop_reason is not None
        if world > 1:
            stop = agreed(stop)
        if stop and session.stop_reason is None:
            session.watcher.request("another rank was asked to stop")
            session.step_end(step)
        if session.stop_reason != "diverged" and session.save_due():
            self._save(trainer, step)
        if stop:
            trainer.should_stop = True
        self._last_end = time.perf_counter()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        session = self.session
        value = trainer.callback_metrics.get("val_loss")
        if session is None or value is None or trainer.sanity_checking:
            return
        end = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        session.evaluated(trainer.global_step, float(value), end)
        if session.stop_reason is not None:
            trainer.should_stop = True

    def _save(self, trainer: Any, step: int) -> None:
        """`trainer.save_checkpoint` (every rank calls it; rank 0 writes), then the manifest,
        then the oldest of thrifty's own saves beyond checkpoint.keep_last removed."""
        assert self.session is not None
        folder = checkpoint_dir(trainer.default_root_dir)
        path = folder / f"step-{step}.ckpt"
        if trainer.is_global_zero:
            folder.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(str(path))
        trainer.strategy.barrier()
        self.session.published(step, path)
        if trainer.is_global_zero:
            _keep_newest(folder, self.sections.checkpoint.keep_last)


def _shape_counts(batch: Any) -> tuple[int, int]:
    """Samples and tokens of a batch from its shapes alone (no read of device memory):
    `input_ids` of a dict, else the first integer tensor of two or more dimensions."""
    if isinstance(batch, Mapping):
        ids = batch.get("input_ids")
        tensors = [ids] if isinstance(ids, torch.Tensor) else list(batch.values())
    elif isinstance(batch, (list, tuple)):
        tensors = list(batch)
    else:
        tensors = [batch]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not tensors:
        return 0, 0
    samples = int(tensors[0].shape[0]) if tensors[0].dim() else 1
    ids = next((t for t in tensors if t.dim() >= 2 and not t.is_floating_point()), None)
    return samples, int(ids.numel()) if ids is not None else 0


def _dtype(precision: str) -> str:
    """The matmul dtype of a Lightning precision ("bf16-mixed", "16-mixed", "32-true", ...)."""
    if precision.startswith("bf16"):
        return "bf16"
    return "fp16" if precision.startswith("16") else "fp32"


def _loss(outputs: Any) -> float | None:
    loss: Any = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    try:
        return float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None


def _keep_newest(folder: Path, keep: int) -> None:
    """Remove thrifty's own saves in `folder` (step-N.ckpt with its manifest) beyond the
    newest `keep` complete ones."""
    saves = sorted(
        (int(p.stem.split("-", 1)[1]), p)
        for p in folder.glob("step-*.ckpt")
        if p.stem.split("-", 1)[1].isdigit() and manifest_of(p).is_file()
    )
    for _, path in saves[:-keep]:
        manifest_of(path).unlink(missing_ok=True)  # first: a half-removed save is not trusted
        path.unlink(missing_ok=True)


def newest_checkpoint(trainer: Any) -> str | None:
    """The newest complete save of thrifty's under the Trainer's root, or None; one line for
    each newer file passed over (a save a kill cut short)."""
    folder = checkpoint_dir(trainer.default_root_dir)
    if not folder.is_dir():
        return None
    candidates = []
    for path in folder.glob("step-*.ckpt"):
        step = path.stem.split("-", 1)[1]
        if step.isdigit():
            candidates.append((int(step), path))
    found = newest_complete(candidates)
    return None if found is None else str(found)


def fit(
    trainer: Any,
    model: Any,
    train_dataloaders: Any = None,
    val_dataloaders: Any = None,
    datamodule: Any = None,
    ckpt_path: str | None = None,
    *,
    config: Any = None,
    exit_on_stop: bool = True,
) -> ThriftyCallback:
    """`trainer.fit(model, ...)` with thrifty's callback; returns the callback (its
    `session` holds the run's figures).

    `ckpt_path` left out resumes from thrifty's newest complete save (checkpoint.resume =
    "auto", the default; "never" starts from scratch; a path resumes from it). A run stopped by
    a signal or a cloud notice exits with code 75 (`SystemExit`) once its checkpoint is
    written, and a diverged one with 1; `exit_on_stop=False` returns instead."""
    with console_for_api():
        callback = ThriftyCallback(config)
        if ckpt_path is None:
            resume = callback.sections.checkpoint.resume
            if resume == "auto":
                ckpt_path = newest_checkpoint(trainer)
            elif resume != "never":
                if not Path(resume).is_file():
                    raise ThriftyError(
                        f"checkpoint.resume = {resume!r} is not a checkpoint file: give a .ckpt "
                        'Lightning saved, or "auto"'
                    )
                ckpt_path = resume
        trainer.callbacks.append(callback)
        try:
            trainer.fit(
                model,
                train_dataloaders=train_dataloaders,
                val_dataloaders=val_dataloaders,
                datamodule=datamodule,
                ckpt_path=ckpt_path,
            )
        except BaseException:
            if callback.session is not None:
                callback.session.release()
            raise
        finally:
            trainer.callbacks.remove(callback)
        code = callback.session.end() if callback.session is not None else 0
    if code and exit_on_stop:
        raise SystemExit(code)
    return callback
