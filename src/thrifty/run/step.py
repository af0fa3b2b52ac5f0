"""One optimizer step over an accumulation window: forward and backward over its micro-batches,
each weighted by its share, then unscale, clip, the guarded optimizer step and the schedule.

The Trainer's loop (`thrifty.run.trainer`) hands each window here and keeps the boundary (budget,
evaluation, preemption, saves); this is the hot path, read top to bottom in `TrainStep.run`.
An out-of-memory error halves the micro-batch and replays the window, on every rank together.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from thrifty.checkpointing.saving.checkpointer import RunParts
from thrifty.levers.accumulation import LossFn, Weighting, call_model, to_device
from thrifty.levers.micro_batch import Halving, first_sample, is_out_of_memory
from thrifty.levers.precision import Precision
from thrifty.measure.guard import guarded_step
from thrifty.measure.timing import NullTimer
from thrifty.strategies.base import Strategy
from thrifty.strategies.process_group import Distributed

log = logging.getLogger("thrifty")

StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor | bool | None, list[int] | None]


class TrainStep:
    """The train step of one run, built once with what it uses; `run` is called per window."""

    def __init__(
        self,
        dist: Distributed,
        strategy: Strategy,
        precision: Precision,
        device: torch.device,
        parts: RunParts,
        *,
        forward_model: nn.Module,
        loss_fn: LossFn | None,
        halving: Halving,
        log_event: Callable[..., None],
        normalize: str,
        grad_clip: float,
        guarded: bool,
    ) -> None:
        """`normalize` is batch.normalize (how the micro-batches' losses are weighted),
        `grad_clip` optimizer.grad_clip (0: no clipping), `guarded` guard.enabled (a non-finite
        step is skipped). Twelve parameters: everything the step touches, each built once by
        the Trainer."""
        self.dist, self.strategy = dist, strategy
        self.precision, self.device, self.parts = precision, device, parts
        self.forward_model, self.loss_fn = forward_model, loss_fn
        self.halving, self.log_event = halving, log_event
        self.grad_clip, self.guarded = grad_clip, guarded
        self.optimizer = parts.optimizer
        self.params = [p for p in parts.model.parameters() if p.requires_grad]
        self.weighting = Weighting(normalize, parts.model)
        self._said_weighting = False

    def run(
        self,
        window: list[Any],
        counts: tuple[list[int], list[int]],
        timer: NullTimer,
        totals: list[int] | None = None,
        say: Callable[[], list[int]] | None = None,
    ) -> StepResult:
        """One optimizer step over an accumulation window; returns (loss, grad norm, skipped)
        as tensors on the device — reading them would force a host sync, so the caller batches
        that — and what the ranks agreed on. `skipped` (None with the guard off) is True where
        a non-finite loss or gradient left the step out.
        `counts` are the window's samples and loss tokens per micro-batch
        (`self.weighting.counts`), counted on the host; `totals` the samples and loss tokens
        of the window over all ranks (None: one process);
        `say()` this rank's boundary word, summed over the ranks (None: one process)."""
        p, strategy = self.parts, self.strategy
        if self.halving.times:  # the micro-batch an earlier out-of-memory error left
            window = self.halving.apply(window)
            counts = self.weighting.counts(window)
        if not self._said_weighting and (len(window) > 1 or self.dist.enabled):
            # Once, at the first window that weighs several losses: it needs a batch to say.
            log.info("accumulation: %s", self.weighting.describe(window[0]))
            self._said_weighting = True
        while True:
            try:
                window_loss, heard = self._accumulate(window, counts, timer, totals, say)
                break
            except torch.OutOfMemoryError as exc:
                error = str(exc)
            # Outside the handler, whose frames held the failed attempt's tensors.
            window = self.halving.halve(window, error, self.optimizer)
            self.log_event(event="out_of_memory", micro_batch=self.halving.now)
            counts = self.weighting.counts(window)
        # The true gradients' norm, recorded at every step (clipping or not): it is the first
        # sign of a run going wrong. Unscaled first, so neither clipping nor the record sees
        # the loss scale.
        p.scaler.unscale_(self.optimizer)
        grad_norm = strategy.clip_norm(self.params, self.grad_clip)
        skipped = guarded_step(
            self.optimizer,
            p.scaler,
            window_loss,
            grad_norm,
            enabled=self.guarded,
            local_loss=not self.dist.enabled,
        )
        p.scheduler.step()  # set back at the next flush for a skipped step
        self.optimizer.zero_grad(set_to_none=True)
        timer.mark("optimizer")
        # The loss is this rank's: averaged when logged.
        return window_loss, grad_norm, skipped, heard

    def _accumulate(
        self,
        window: list[Any],
        counts: tuple[list[int], list[int]],
        timer: NullTimer,
        totals: list[int] | None,
        say: Callable[[], list[int]] | None,
    ) -> tuple[torch.Tensor, list[int] | None]:
        """Forward and backward over the window's micro-batches, each weighted by its share;
        the window's mean loss (fp32, on the device), and `say()` summed over the ranks. Raises
        OutOfMemoryError when any rank ran out of memory: a rank that did takes part in the
        others' gradient synchronization first, so every rank replays the window together and
        none waits in a collective. The verdict rides on the step's one host-side agreement."""
        weights = self.weighting.weights(window, counts, totals, self.dist.world_size)
        window_loss: torch.Tensor | None = None
        failed: str | None = None
        last = len(window) - 1
        for i, (batch, weight) in enumerate(zip(window, weights, strict=True)):
            if failed is None:
                try:
                    share = self._micro_step(batch, weight, i == last, timer)
                except RuntimeError as exc:  # a device's OutOfMemoryError, or the CPU's
                    if not is_out_of_memory(exc):
                        raise
                    failed = str(exc)
                else:
                    window_loss = share if window_loss is None else window_loss + share
                    continue
            if i == last:  # out of the handler: the failed attempt's tensors are freed
                one = first_sample(batch)
                self.strategy.join_sync(
                    functools.partial(self._micro_step, one, 0.0, True, NullTimer())
                )
        heard = None
        if say is not None:
            verdict, *heard = self.dist.sum_ints([int(failed is not None), *say()])
            if verdict:
                failed = failed or "out of memory on another rank"
        if failed is not None:
            raise torch.OutOfMemoryError(failed)
        assert window_loss is not None  # a window holds at least one micro-batch
        return window_loss, heard

    def _micro_step(self, batch: Any, weight: Any, sync: bool, timer: NullTimer) -> torch.Tensor:
        """One micro-batch's forward and backward, its loss weighted by `weight`; returns the
        weighted loss (fp32, detached), the record's share."""
        batch = to_device(batch, self.device, self.device.type == "cuda")
        timer.mark("host_to_device")
        with self.strategy.grad_sync(sync):  # gradients cross ranks once per window
            with self.precision.autocast():
                loss = call_model(self.forward_model, batch, self.loss_fn)
            timer.mark("forward")
            weighted = loss * weight
            self.parts.scaler.scale(weighted).backward()
        timer.mark("backward")
        # A low-precision loss is weighted in fp32 for the record.
        return weighted.detach() if loss.dtype == torch.float32 else loss.detach().float() * weight
