"""Never pay for a wasted run: skip non-finite steps, detect loss spikes, forecast the end.

`GuardConfig` is the `[guard]` section. `NonFiniteCounter` counts consecutive non-finite steps
(the Trainer skips them) and says when the run has diverged. `SpikeDetector` watches the
training loss and confirms a spike when it stays far above its recent level for a few steps in a
row; the Trainer then rolls back to the newest good checkpoint. `RunGuard` runs them as a list
of `Detector`s (`DivergenceDetector`, `LossSpikeDetector`), each judging every step logged, and
hands the run the most severe verdict: a new fault check is one more detector. The forecast
keys configure `thrifty.measure.forecast.cannot_reach`, which judges the evaluations (not the
steps: `thrifty.callbacks.guard.Guard` asks it at each flush) and reads `early_stopping.target` (validated by
`check_target`).

Everything here is plain Python: importing it (through the config) stays cheap.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thrifty.config.guard import GuardConfig

if TYPE_CHECKING:
    import torch

log = logging.getLogger("thrifty")


class NonFiniteCounter:
    """Consecutive non-finite steps: the Trainer skips each one; too many in a row is divergence.

    `update(finite)` once per optimizer step; True means stop the run as diverged (more than
    `max_skipped` in a row). `skipped` counts every step skipped in the run.
    """

    def __init__(self, max_skipped: int = 10) -> None:
        self.max_skipped = max_skipped
        self.consecutive = 0
        self.skipped = 0

    def update(self, finite: bool) -> bool:
        """Record one step; True when the run has diverged (the step must not be applied)."""
        if finite:
            self.consecutive = 0
            return False
        self.consecutive += 1
        self.skipped += 1
        return self.consecutive > self.max_skipped

    def state_dict(self) -> dict[str, Any]:
        return {"consecutive": self.consecutive, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consecutive = int(state["consecutive"])
        self.skipped = int(state["skipped"])


class SpikeDetector:
    """Confirms a loss spike: `steps` losses in a row far above the running level.

    The running mean and standard deviation cover the last `window` good losses only; a
    candidate is held aside, so a sustained spike cannot inflate the baseline it is measured
    against. No decision until `window` losses have been seen (the first steps of a run fall
    too fast for a level to mean anything). With `ratio`, a candidate is a loss above
    ratio × the running mean instead of mean + sigma × std. Non-finite losses are ignored:
    `NonFiniteCounter` handles those.
    """

    def __init__(
        self, *, sigma: float = 6.0, steps: int = 3, window: int = 50, ratio: float | None = None
    ) -> None:
        self.sigma, self.steps, self.window, self.ratio = sigma, steps, window, ratio
        self.baseline: deque[float] = deque(maxlen=window)
        self.pending: list[float] = []
        self.spikes = 0

    @classmethod
    def from_config(cls, config: GuardConfig) -> SpikeDetector:
        return cls(
            sigma=config.spike_sigma,
            steps=config.spike_steps,
            window=config.spike_window,
            ratio=config.spike_ratio,
        )

    def threshold(self) -> float | None:
        """The loss above which a step is a spike candidate; None during warm-up."""
        if len(self.baseline) < self.window:
            return None
        n = len(self.baseline)
        mean = sum(self.baseline) / n
        if self.ratio is not None:
            # Measured from |mean| so a loss that may be negative still gets a sane bar.
            return mean + (self.ratio - 1) * abs(mean)
        std = math.sqrt(sum((x - mean) ** 2 for x in self.baseline) / (n - 1))
        # A floor so a perfectly flat loss (a fixed batch, a constant) does not turn rounding
        # noise into spikes: 0.5% of the level.
        return mean + self.sigma * max(std, 5e-3 * abs(mean), 1e-12)

    def update(self, loss: float) -> bool:
        """Record one step's training loss; True when a spike is confirmed (then roll back)."""
        if not math.isfinite(loss):
            return False
        bar = self.threshold()
        if bar is None or loss <= bar:
            self.pending.clear()
            self.baseline.append(float(loss))
            return False
        self.pending.append(float(loss))
        if len(self.pending) < self.steps:
            return False
        self.pending.clear()
        self.spikes += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        """Plain floats and ints: loads with `torch.load(..., weights_only=True)`."""
        return {
            "baseline": list(self.baseline),
            "pending": list(self.pending),
            "spikes": self.spikes,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline = deque((float(x) for x in state["baseline"]), maxlen=self.window)
        self.pending = [float(x) for x in state["pending"]]
        self.spikes = int(state["spikes"])


# --------------------------------------------------------------------------------------------
# In the training loop: the skip on the device, the schedule set back, the run's guard state


def step_unless_skipped(optimizer: Any, scaler: Any, ok: Any, *, warn: Any = None) -> Any:
    """The optimizer step, left out where `ok` (a bool tensor on the device) is False; returns
    whether it was: a bool tensor on the device, or a bool where the flag was read anyway.

    Fused optimizers skip on the device through the `found_inf` tensor the fp16 loss scaler
    uses, so no host synchronization is added. An enabled scaler skips overflowing steps
    itself. Any other optimizer needs the flag on the host: free on CPU, one synchronization
    per step on a GPU (`warn(message)` is called once to say so).
    """
    if scaler.is_enabled():  # fp16: a non-finite loss leaves non-finite gradients, and
        scaler.step(optimizer)  # the scaler skips those steps (and lowers its scale)
        scaler.update()
        return None
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        skipped = ~ok
        optimizer.found_inf = skipped.float()
        optimizer.grad_scale = None
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf, optimizer.grad_scale
        return skipped
    if ok.device.type != "cpu" and warn is not None:
        warn(
            f"guard: {type(optimizer).__name__} has no fused kernel to skip a non-finite step "
            "on the device, so each step reads one flag back (one GPU sync per step); use a "
            "fused optimizer (e.g. AdamW(fused=True)) to avoid it"
        )
    if not bool(ok):
        return True
    optimizer.step()
    return False


def rewind_schedule(scheduler: Any, steps: int) -> None:
    """Set a LambdaLR back by `steps` skipped steps: a skipped step does not advance the
    learning-rate schedule. Applied when the skip is known on the host (the metrics flush),
    where a user's scheduler also has its rate looked at (one warning line if it collapsed
    early: thrifty.levers.scheduler_checks.CollapseWatch)."""
    rewind = getattr(scheduler, "rewind", None)
    if rewind is not None:  # a user's scheduler (thrifty.levers.user_scheduler) replays itself
        rewind(steps)
        scheduler.flushed()
        return
    if steps <= 0:
        return
    scheduler.last_epoch -= steps
    lrs = [
        base * fn(scheduler.last_epoch)
        for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs


def scale_learning_rate(scheduler: Any, factor: float) -> None:
    """Multiply the schedule's peak learning rates (and the current ones) by `factor`."""
    if factor == 1.0:
        return
    scheduler.base_lrs = [lr * factor for lr in scheduler.base_lrs]
    for group in scheduler.optimizer.param_groups:
        group["lr"] *= factor
        group["initial_lr"] = group.get("initial_lr", group["lr"]) * factor
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


@dataclass
class Verdict:
    """What the guard makes of the steps just flushed; from one detector, what it found at one
    step (`diverged` or `spike_start`)."""

    skipped: int = 0  # steps newly skipped (the schedule is set back by as many)
    diverged: str | None = None  # why the run must stop as diverged
    spike_start: int | None = None  # a confirmed spike began at this step: roll back

    @property
    def severity(self) -> int:
        """Which verdict wins when detectors disagree on a step: stopping the run as diverged
        (2), over rolling back a spike (1), over carrying on (0)."""
        return 2 if self.diverged is not None else 1 if self.spike_start is not None else 0


class Detector:
    """One check of the run guard, judging each step the run logged. A new fault check is a
    subclass added to `RunGuard.detectors`; the base class checks nothing and keeps no state.

    `observe` runs once per step, at the metrics flush (the loss is on the host by then): keep
    it cheap. A verdict with `diverged` stops the run as diverged (its text is the reason the
    summary gives); one with `spike_start` rolls the run back to before that step.
    """

    def observe(self, step: int, loss: float, skipped: bool) -> Verdict | None:
        """Judge optimizer step `step`: its training loss (the mean over the ranks) and whether
        it was `skipped` (its loss or gradients were not finite, so it was not applied; `loss`
        may then be NaN or inf). None: nothing to act on."""
        return None

    @property
    def suspect(self) -> bool:
        """Something is building that a later step may confirm: no checkpoint now."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """This detector's part of the guard's checkpointed state: top-level keys of it,
        unique among the detectors; plain values only (loaded with `weights_only=True`)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from the guard's whole state. A detector added after the checkpoint was
        written finds none of its keys there: it then keeps its fresh state."""


class DivergenceDetector(Detector):
    """Too many non-finite steps in a row (`NonFiniteCounter`): the run has diverged. Its
    state keys, "nonfinite" and "last_finite", are those of checkpoints written before the
    detectors."""

    def __init__(self, max_skipped: int) -> None:
        self.counter = NonFiniteCounter(max_skipped)
        self.last_finite: tuple[int, float] | None = None  # (step, loss)

    def observe(self, step: int, loss: float, skipped: bool) -> Verdict | None:
        if not skipped:
            self.counter.consecutive = 0  # `counter.update(True)`, without a call per step
            self.last_finite = (step, loss)
            return None
        if not self.counter.update(False):
            return None
        last = (
            f"the last finite loss was {self.last_finite[1]:.4g} at step {self.last_finite[0]}"
            if self.last_finite
            else "no step had a finite loss"
        )
        return Verdict(
            diverged=f"{self.counter.consecutive} steps in a row up to step {step} had a "
            f"non-finite loss or gradient (guard.max_skipped = {self.counter.max_skipped}); "
            f"{last}"
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "nonfinite": self.counter.state_dict(),
            "last_finite": list(self.last_finite) if self.last_finite else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counter.load_state_dict(state["nonfinite"])
        last = state.get("last_finite")
        self.last_finite = (int(last[0]), float(last[1])) if last else None


class LossSpikeDetector(Detector):
    """A confirmed loss spike (`SpikeDetector`, fed the applied steps only): roll back to
    before the step it began at. Its state key is "spikes"."""

    def __init__(self, config: GuardConfig) -> None:
        self.spikes = SpikeDetector.from_config(config)

    def observe(self, step: int, loss: float, skipped: bool) -> Verdict | None:
        if skipped or not self.spikes.update(loss):
            return None
        return Verdict(spike_start=step - self.spikes.steps + 1)

    @property
    def suspect(self) -> bool:
        return bool(self.spikes.pending)

    def state_dict(self) -> dict[str, Any]:
        return {"spikes": self.spikes.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spikes.load_state_dict(state["spikes"])


class RunGuard:
    """The run's guard against waste: its detectors judge each step (non-finite steps in a
    row, loss spikes), and it keeps the rollbacks and the forecast. Fed the steps' records
    when the metrics are flushed (their losses are on the host by then: no extra
    synchronization).

    `detectors` is the list of checks, `DivergenceDetector` and `LossSpikeDetector` by
    default; every detector sees every step, and where several have a verdict on the same
    step the most severe (`Verdict.severity`) is the guard's. A new check is one `Detector`
    appended to the list.
    """

    def __init__(self, config: GuardConfig) -> None:
        self.config = config
        self.divergence = DivergenceDetector(config.max_skipped)  # it counts the skipped steps
        self.detectors: list[Detector] = [self.divergence, LossSpikeDetector(config)]
        self.rollbacks: list[dict[str, Any]] = []
        self.forecast: dict[str, Any] | None = None  # the latest forecast, for the summary
        self.stopped: str | None = None  # why the run stopped as diverged
        self.observed_step = 0  # steps up to here are counted: a step seen twice counts once

    @property
    def suspect(self) -> bool:
        """A spike is building (not yet confirmed): no checkpoint should be written now."""
        return any(detector.suspect for detector in self.detectors)

    def observe(self, records: list[dict[str, Any]]) -> Verdict:
        """Judge the steps flushed, in order, up to the first one with a verdict (the steps
        after it are judged again at the next flush, once the run has acted on it)."""
        verdict = Verdict()
        if not self.config.enabled:
            return verdict
        detectors = self.detectors
        for record in records:
            step, loss = record["step"], record["loss"]
            if step <= self.observed_step:
                continue
            self.observed_step = step
            # A non-finite loss (averaged over the ranks, so every rank agrees) is a skipped
            # step too: under fp16 the loss scaler is what left it out.
            skipped = True if record.get("skipped") else not math.isfinite(loss)
            if skipped:
                verdict.skipped += 1
            found: Verdict | None = None
            for detector in detectors:
                seen = detector.observe(step, loss, skipped)
                if seen is not None and (found is None or seen.severity > found.severity):
                    found = seen
            if found is not None:
                verdict.diverged, verdict.spike_start = found.diverged, found.spike_start
                return verdict
        return verdict

    def summary(self) -> dict[str, Any]:
        return {
            "skipped_steps": self.divergence.counter.skipped,
            "rollbacks": list(self.rollbacks),
            "forecast": self.forecast,
            "diverged": self.stopped,
        }

    def state_dict(self) -> dict[str, Any]:
        """The rollbacks, the last step observed, and each detector's keys (for the built-in
        ones: "nonfinite", "last_finite", "spikes", as before the detectors)."""
        state: dict[str, Any] = {
            "rollbacks": [dict(r) for r in self.rollbacks],
            "observed_step": self.observed_step,
        }
        for detector in self.detectors:
            part = detector.state_dict()
            clash = state.keys() & part.keys()
            if clash:
                raise ValueError(
                    f"guard detector {type(detector).__name__} saves state under "
                    f"{sorted(clash)}, which another part of the guard's state uses: give its "
                    "keys names of their own"
                )
            state.update(part)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for detector in self.detectors:
            detector.load_state_dict(state)
        self.rollbacks = [dict(r) for r in state["rollbacks"]]
        self.observed_step = int(state.get("observed_step", 0))


def guarded_step(
    optimizer: Any,
    scaler: Any,
    window_loss: torch.Tensor,
    grad_norm: torch.Tensor,
    *,
    enabled: bool,
    local_loss: bool,
) -> torch.Tensor | bool | None:
    """The optimizer step of a window, left out (with the guard `enabled`) where its loss or
    gradients are not finite; whether it was, as a tensor on the device or a bool where the
    flag was read anyway (None with the guard off). `local_loss`: this rank's loss may be
    judged here (one process); with several, the verdict must be the same on every rank, and
    the norm of the synchronized gradients is (the loss is judged at the flush, averaged over
    the ranks)."""
    import torch

    if not enabled:
        scaler.step(optimizer)
        scaler.update()
        return None
    if scaler.is_enabled():
        # fp16: the scaler skips steps with non-finite gradients itself (an overflow is its
        # business, not divergence).
        step_unless_skipped(optimizer, scaler, grad_norm)
        return ~torch.isfinite(window_loss) if local_loss else None
    judged = (grad_norm, window_loss) if local_loss else (grad_norm,)
    if grad_norm.device.type == "cpu" and not getattr(optimizer, "_step_supports_amp_scaling", 0):
        # On a CPU the flag is read on the host anyway, and reading the two values costs less
        # than the tensor operations that would compute it.
        if all(math.isfinite(t.item()) for t in judged):
            optimizer.step()
            return False
        return True
    ok = torch.isfinite(grad_norm)
    if local_loss:
        ok &= torch.isfinite(window_loss)
    return step_unless_skipped(optimizer, scaler, ok, warn=_warn_once)


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)
