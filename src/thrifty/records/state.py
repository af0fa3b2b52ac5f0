"""What a run has done: its counters (saved with every checkpoint) and what `fit()` returns."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from thrifty.records.stop import StopReason
from thrifty.records.stop_signals import EXIT_PREEMPTED


@dataclass
class TrainState:
    """Counters of the run so far: everything a checkpoint needs besides the tensors."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already consumed
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0  # training wall time, across restarts (run.max_time counts it)
    initial_val_loss: float | None = None
    val_loss: float | None = None
    eval_pending: bool = False  # an evaluation put off by a preemption, done on resume
    val_steps: list[int] = field(default_factory=list)  # where the forecast's points were taken
    val_losses: list[float] = field(default_factory=list)

    def advance(self, samples: int, tokens: int, seconds: float, micro_batches: int) -> None:
        """One optimizer step done, over `micro_batches` of this epoch."""
        self.seconds = seconds
        self.step += 1
        self.batch_in_epoch += micro_batches
        self.samples += samples
        self.tokens += tokens

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """In place: whoever holds this object sees the restored counters."""
        fresh = TrainState(**state)
        for f in fields(self):
            setattr(self, f.name, getattr(fresh, f.name))


@dataclass
class FitResult:
    """What `Trainer.fit()` achieved. Rates are per second of training (compile warm-up excluded)."""

    steps: int
    samples: int
    tokens: int
    train_loss: float
    val_loss: float | None
    initial_val_loss: float | None
    best_val_loss: float | None
    tokens_per_second: float
    samples_per_second: float
    stop_reason: str
    wall_seconds: float  # this attempt's, from fit() to its end
    precision: str
    num_workers: int
    checkpointed_blocks: list[str] = field(default_factory=list)
    run_dir: str | None = None
    # The training seconds the run kept, across every attempt (a resumed run's are more than
    # this attempt's wall_seconds); None in a summary written before it was recorded.
    training_seconds: float | None = None
    mfu: float | None = None  # model FLOP/s ÷ the device's peak for the dtype used
    breakdown: dict[str, float] | None = None  # mean seconds per step of each phase
    cost: dict[str, Any] | None = None  # GPU-hours, dollars, the on-demand equivalent
    world_size: int = 1  # processes (each with its own device) that trained together
    strategy: str = "single"  # single | ddp | fsdp
    parameters: int = 0  # trainable parameters of the model
    step_seconds: float | None = None  # mean seconds per optimizer step (warm-up excluded)
    # The newest checkpoint: step, location, whether its upload finished, the local copy.
    checkpoint: dict[str, Any] | None = None
    # What the guard did and saved: skipped steps, rollbacks (steps and dollars lost), the
    # forecast, and the steps and dollars a stop before the budget did not spend.
    guard: dict[str, Any] | None = None
    micro_batch: int = 0  # samples per forward/backward at the end (halved by out-of-memory)
    # batch.micro = "auto": the sizes tried, whether each fitted, the one chosen.
    micro_batch_search: dict[str, Any] | None = None
    peak_memory_bytes: float | None = None  # the device's peak allocation (CUDA)
    stop_detail: str | None = None  # stop_reason "callback": the callback's own words

    @property
    def exit_code(self) -> int:
        """The exit code a script should end with (`sys.exit(result.exit_code)`), the one
        `thrifty train` ends with: 75 when preempted (EX_TEMPFAIL: a requeue wrapper relaunches
        the script, which resumes from the emergency checkpoint), 1 when the run diverged or
        its data raised (relaunching would fail the same way), 0 for every other stop."""
        if self.stop_reason == StopReason.PREEMPTED:
            return EXIT_PREEMPTED
        if self.stop_reason in (StopReason.DIVERGED, StopReason.DATA_ERROR):
            return 1
        return 0


class RunClock:
    """Training time of the run (across restarts), and where the current step began."""

    def __init__(self, seconds_before: float) -> None:
        self.seconds_before = seconds_before
        self.started = self.step_start = time.perf_counter()

    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.started
