"""thrifty inside the Hugging Face `Trainer`: `fit(trainer, config=...)` in place of
`trainer.train()`.

    from thrifty.integrations import transformers as thrifty_hf
    thrifty_hf.fit(trainer, config={"cost": {"usd_per_gpu_hour": 2.5}})

What it adds (`ThriftyCallback`, also usable on its own with `trainer.add_callback`):
- a stop signal (SIGTERM, SIGINT, SIGUSR1) or a cloud's interruption notice sets the
  Trainer's `should_save` and `should_training_stop` at the next optimizer step: the Trainer
  saves `checkpoint-N` with its own save, thrifty writes the checkpoint's manifest once that
  save returned, and `fit` ends the process with exit code 75;
- the same command resumes from the newest checkpoint-N with a manifest: a folder a kill cut
  short is passed over with one line (and left in place), where `resume_from_checkpoint=True`
  would take the newest folder, complete or not;
- `checkpoint.every` (steps, a duration, or "auto": Young/Daly from the first save) adds
  saves to the Trainer's own `save_steps`;
- the cost meter and the run's record in `OUTPUT_DIR/thrifty/`, for `thrifty runs`;
- a stop, through `should_training_stop`, for a loss or gradient norm that is not finite
  (without a save: the newest checkpoint stays the last good one) and for a run the
  forecast says cannot reach `early_stopping.target` (from the `eval_loss` of its
  evaluations).

Tokens are read from the Trainer's own FLOP count (6 × parameters × input tokens per batch,
`PreTrainedModel.floating_point_ops`), so tokens/s needs no change to the data; the data wait
is the time from one optimizer step's end to the next one's beginning (the Trainer fetches a
step's batches in between).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from thrifty.errors import ThriftyError
from thrifty.integrations.session import (
    Session,
    agreed,
    device_peak,
    load_sections,
    newest_complete,
)
from thrifty.reporting.end_of_run import console_for_api

FRAMEWORK = "transformers"
_PREFIX = "checkpoint-"

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "thrifty.integrations.transformers needs transformers and accelerate: "
        "pip install 'thrifty[transformers]'"
    ) from exc


class ThriftyCallback(TrainerCallback):
    """The Trainer's callback: `config` is a TOML path, a dict of sections or a TrainConfig
    (the sections that apply: run.name, checkpoint, spot, cost, early_stopping, guard,
    measure, log). `trainer` (optional) lets tokens be read from its FLOP count."""

    def __init__(self, config: Any = None, trainer: Any = None) -> None:
        self.sections = load_sections(config, FRAMEWORK)
        self.trainer = trainer
        self.session: Session | None = None
        self._step_began = 0.0
        self._last_end = 0.0
        self._flos = 0.0  # the Trainer's FLOP count of this process at the last step end
        self._per_token: float | None = None
        self._world = self._samples = 1

    # --- the Trainer's events -------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._world = args.world_size  # a property of the Trainer's that checks backends
        self._samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.session = Session(
            self.sections,
            args.output_dir,
            framework=FRAMEWORK,
            world_size=self._world,
            rank=args.process_index,
        )
        model: Any = kwargs.get("model")
        if hasattr(model, "num_parameters"):
            self._per_token = 6.0 * model.num_parameters(exclude_embeddings=True)
        self._flos = self._flos_now(state)
        dtype = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
        self.session.begin(state.global_step, device_peak(self.sections, args.device, dtype))
        self._last_end = time.perf_counter()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step_began = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        session = self.session
        if session is None:
            return
        flos = self._flos_now(state)
        # The Trainer adds each micro-batch's FLOPs to its count and zeroes it after a log or a
        # save, which follow this event: what it holds past the last reading is this step's.
        step_flos = flos - self._flos if flos >= self._flos else flos
        self._flos = flos
        tokens = round(step_flos / self._per_token) if self._per_token else 0
        world = self._world
        session.step_end(
            state.global_step,
            samples=self._samples * world,
            tokens=tokens * world,
            data_seconds=max(0.0, self._step_began - self._last_end),
            flops=step_flos * world,
        )
        stop = session.stop_reason is not None
        if world > 1:
            stop = agreed(stop)
        if stop and session.stop_reason is None:  # another rank's signal
            session.watcher.request("another rank was asked to stop")
            session.step_end(state.global_step)  # records nothing new: the reason
        if session.stop_reason == "diverged":
            control.should_save = False  # the newest checkpoint stays the last good one
        elif session.save_due():
            control.should_save = True
        if stop:
            control.should_training_stop = True
        self._last_end = time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session is None:
            return
        path = Path(args.output_dir) / f"{_PREFIX}{state.global_step}"
        if path.is_dir():
            self.session.published(state.global_step, path)
        self._last_end = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """The loss and gradient norm the Trainer logged: one not finite stops the run
        (the Trainer's `logging_nan_inf_filter` hides a non-finite loss; its gradient norm
        it does not)."""
        session = self.session
        if session is None or not logs:
            return
        if "loss" in logs:  # a training log: the user's loggers get the dollars beside it
            logs.update(session.live())
        loss, norm = logs.get("loss"), logs.get("grad_norm")
        if isinstance(norm, (int, float)) and not math.isfinite(norm):
            loss = float("nan")  # what the Trainer's filter hid from its logged loss
        if isinstance(loss, (int, float)):
            session.logged(state.global_step, float(loss))
        if session.stop_reason == "diverged":
            control.should_training_stop = True
            control.should_save = False

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
    ) -> None:
        loss = (metrics or {}).get("eval_loss")
        if self.session is None or not isinstance(loss, (int, float)):
            return
        self.session.evaluated(state.global_step, float(loss), state.max_steps or None)
        if self.session.stop_reason is not None:
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last_end = time.perf_counter()

    # --- helpers ---------------------------------------------------------------------------

    def _flos_now(self, state: Any) -> float:
        """This process's FLOP count as the Trainer holds it (`current_flos`); without the
        Trainer at hand, the count it stored (`state.total_flos`)."""
        if self.trainer is not None:
            return float(getattr(self.trainer, "current_flos", 0.0) or 0.0)
        return float(state.total_flos or 0.0)


def newest_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest complete `checkpoint-N` folder of `output_dir` (one with thrifty's
    manifest whose files match it), or None; one line for each newer folder passed over."""
    root = Path(output_dir)
    if not root.is_dir():
        return None
    candidates = []
    for path in root.iterdir():
        step = path.name[len(_PREFIX) :]
        if path.name.startswith(_PREFIX) and step.isdigit() and path.is_dir():
            candidates.append((int(step), path))
    found = newest_complete(candidates)
    return None if found is None else str(found)


def fit(trainer: Any, config: Any = None, *, exit_on_stop: bool = True, **train_kwargs: Any) -> Any:
    """`trainer.train(**train_kwargs)` with thrifty's callback; returns its TrainOutput.

    `resume_from_checkpoint` left out (or True) resumes from the newest complete checkpoint
    in the Trainer's output directory (with checkpoint.resume = "auto", the default; "never"
    starts from scratch; a path resumes from it). A run stopped by a signal or a cloud notice
    exits with code 75 (`SystemExit`) once its checkpoint is written, and a diverged one with
    1; `exit_on_stop=False` returns instead (`callback.session.stop_reason` says why)."""
    with console_for_api():
        callback = ThriftyCallback(config, trainer=trainer)
        resume = train_kwargs.pop("resume_from_checkpoint", None)
        if resume is None or resume is True:
            resume = _resume_from(trainer.args.output_dir, callback.sections.checkpoint.resume)
        # First: the Trainer's printer and loggers read the figures it adds to each log.
        trainer.callback_handler.callbacks.insert(0, callback)
        try:
            output = trainer.train(resume_from_checkpoint=resume, **train_kwargs)
        except BaseException:
            if callback.session is not None:
                callback.session.release()
            raise
        finally:
            trainer.remove_callback(callback)
        code = callback.session.end() if callback.session is not None else 0
    if code and exit_on_stop:
        raise SystemExit(code)
    return output


def _resume_from(output_dir: str, resume: str) -> str | None:
    if resume == "never":
        return None
    if resume == "auto":
        return newest_checkpoint(output_dir)
    if not Path(resume).is_dir():
        raise ThriftyError(
            f"checkpoint.resume = {resume!r} is not a checkpoint folder: give a checkpoint-N "
            'folder the Trainer saved, or "auto"'
        )
    return resume
