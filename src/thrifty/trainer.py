"""The Trainer: one training loop that applies every cost lever from one config.

A Trainer is built whole in `__init__`: device, precision, strategy, optimizer, schedule, data,
the run checkpointer. `fit()` opens the run (resuming it if a checkpoint exists) and loops; each
step (`_train_step`) calls the levers it uses, it does not branch on them, and the step
boundary (`_boundary`) asks the budget, the evaluation, the preemption watch, the guard and the
checkpointer whether to go on. `close()` (or `with Trainer(...) as trainer:`) leaves the
process group.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from thrifty.config import RunConfig, TrainConfig
from thrifty.data.batching import TrainBatches, starting_accumulation
from thrifty.data.sources import is_stream
from thrifty.errors import ConfigError, DataSourceError, ThriftyError
from thrifty.inputs import check_inputs
from thrifty.levers.accumulation import (
    LossFn,
    call_model,
    loss_weights,
    to_device,
    uses_tokens,
    window_counts,
)
from thrifty.levers.activation_checkpointing import apply_activation_checkpointing
from thrifty.levers.compile import compile_model
from thrifty.levers.early_stopping import EarlyStopping
from thrifty.levers.micro_batch import (
    Halving,
    MicroSearch,
    first_sample,
    is_out_of_memory,
    measure_micro,
    scaled_count,
)
from thrifty.levers.optimizer import OptimizerArg, make_optimizer
from thrifty.levers.precision import LossScaler, Precision, resolve_precision
from thrifty.levers.user_scheduler import SchedulerArg, run_scheduler
from thrifty.measure import instruments
from thrifty.measure.monitor import RunMonitor
from thrifty.measure.timing import NullTimer, maybe_trace
from thrifty.records.budget import Budget
from thrifty.records.state import FitResult, RunClock, TrainState
from thrifty.records.stop_signals import StopSignals, active_stop_signals
from thrifty.reporting.end_of_run import console_for_api, log_setup, show_result
from thrifty.reporting.summary import fit_result, write_outputs
from thrifty.run.checkpointer import Layout, RunCheckpointer, Stateful
from thrifty.run.evaluation import validation_loss
from thrifty.run.guard import RunGuard, guarded_step
from thrifty.run.rng import seed_everything
from thrifty.run.watch import RunWatch
from thrifty.strategies.choice import make_strategy
from thrifty.strategies.device import resolve_device
from thrifty.strategies.process_group import Distributed, check_same_config, init_distributed
from thrifty.strategies.timeouts import lost_rank_error

__all__ = ["FitResult", "Trainer", "TrainState", "resolve_device"]

log = logging.getLogger("thrifty")


class Trainer:
    """Train `model` on `train_data` with the levers `config` turns on.

    `model` returns the loss itself, an output with `.loss`, or logits for `loss_fn(output,
    batch)`. `train_data` is a map-style Dataset (thrifty builds the loader; your `sampler` or
    `batch_sampler` replaces its shuffle), an IterableDataset (a stream), or your DataLoader,
    used as is: `thrifty.data.sources` says how each resumes. `val_data` is map-style.
    `optimizer` is an Optimizer or a factory `model -> Optimizer`, called once the model is
    wrapped (the form FSDP needs: it replaces the parameters with their shards). It defaults to
    the one `config.optimizer` describes; with either, its lr is scaled by the linear scaling
    rule when `optimizer.reference_batch` is set, and scheduled: by `config.schedule`, or by
    `scheduler`, an LRScheduler built on that optimizer or a factory `optimizer -> LRScheduler`,
    stepped once per optimizer step in its place (thrifty.levers.user_scheduler).

    Under torchrun the Trainer joins the process group; `close()` leaves it (a `with` block
    does so on exit).
    """

    def __init__(
        self,
        model: nn.Module,
        train_data: Any,
        config: TrainConfig | None = None,
        *,
        optimizer: OptimizerArg = None,
        scheduler: SchedulerArg = None,
        val_data: Dataset | None = None,
        loss_fn: LossFn | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
    ) -> None:
        self.config = cfg = config or TrainConfig(run=RunConfig(max_epochs=1))
        check_inputs(model, train_data, val_data, cfg, sampler=sampler, batch_sampler=batch_sampler)
        self._order = {"sampler": sampler, "batch_sampler": batch_sampler}
        self.model, self.val_data, self.loss_fn = model, val_data, loss_fn
        # Who drives this Trainer: messages name CLI flags ("cli") or Python arguments ("api").
        self.interface = "api"
        self.diagnosis: Any = None  # set by fit(): what limited the steps, what to change
        self.checkpoint_status: dict[str, Any] | None = None  # the newest save, once fit() ends
        self.run_dir: Path | None = None
        self._fitted = False
        # Under torchrun: join the process group; this rank's device is cuda:LOCAL_RANK.
        self.dist: Distributed
        self.dist, device = init_distributed(cfg.distributed, cfg.run.device)
        try:
            with console_for_api():  # the set-up's lines, as `thrifty train` shows them
                self._build(device, train_data, optimizer, collate_fn, scheduler)
        except BaseException:
            self.dist.close()  # the caller gets no Trainer to close it with
            raise

    def _build(
        self,
        device: str,
        train_data: Dataset,
        optimizer: OptimizerArg,
        collate_fn: Callable[[list[Any]], Any] | None,
        scheduler: SchedulerArg = None,
    ) -> None:
        """Each lever applied once, in the order they depend on one another."""
        cfg, dist = self.config, self.dist
        check_same_config(dist, cfg.to_dict(secrets=False))
        self.device = resolve_device(device)
        self.precision: Precision = resolve_precision(cfg.precision.mode, self.device)
        auto = cfg.batch.micro == "auto"
        # The micro-batch until measured (with "auto": one sample, for the FLOP count).
        self.micro = 1 if auto else cfg.batch.fixed_micro
        self.effective_batch = cfg.batch.effective or self.micro * dist.world_size
        self.accumulation = starting_accumulation(cfg.batch, dist.world_size, self.micro, auto)
        self.micro_search: MicroSearch | None = None
        self.strategy = make_strategy(dist)
        given = isinstance(optimizer, torch.optim.Optimizer)
        self.strategy.check(self.precision, optimizer_given=given, auto_micro=auto)
        # The same seed everywhere built the same initial weights; from here on each rank
        # draws its own random numbers (dropout), and rank 0 those of a single process.
        seed_everything(cfg.run.seed + dist.rank)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.precision.allow_tf32
            torch.backends.cudnn.allow_tf32 = cfg.precision.allow_tf32
        self.model.to(self.device)
        # Counted before activation checkpointing: model FLOPs only, not the recomputation.
        self.flops = instruments.count_step_flops(
            self.model,
            train_data,
            cfg,
            self.device,
            self.precision,
            self.loss_fn,
            collate_fn,
            self.micro,
        )
        try:
            policy = cfg.activation_checkpointing.policy
            self.checkpointed_blocks = apply_activation_checkpointing(self.model, policy)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        # Wrapped after activation checkpointing (FSDP shards the checkpointed blocks) and
        # before the optimizer is built (FSDP replaces the parameters with their shards).
        wrapped = self.strategy.wrap(self.model, self.precision)
        self.optimizer = make_optimizer(
            optimizer, self.model, cfg.optimizer, self.device, self.effective_batch
        )
        if auto:
            self._find_micro(wrapped, train_data, collate_fn)
        self.halving = Halving(self.micro, self.device)  # out-of-memory errors survived
        self.batches = TrainBatches(
            train_data,
            cfg,
            self.device,
            collate_fn,
            micro=self.micro,
            accumulation=self.accumulation,
            rank=dist.rank,
            world_size=dist.world_size,
            **self._order,
        )
        self.forward_model = compile_model(wrapped, cfg.compile.mode)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        self.state = TrainState()
        self.budget = Budget.of(cfg.run, self.batches.steps_per_epoch)
        scheduler, horizon, make_scheduler = run_scheduler(
            scheduler, self.optimizer, cfg, self.budget.epoch_steps, self.effective_batch
        )
        parts = Stateful(
            self.model,
            self.optimizer,
            scheduler,
            self.precision.make_scaler(),
            EarlyStopping(cfg.early_stopping.patience, cfg.early_stopping.min_delta),
            RunGuard(cfg.guard),
            self.batches,
        )
        layout = Layout(
            self.effective_batch, self.accumulation, self.batches.steps_per_epoch, horizon
        )
        self.checkpointer = RunCheckpointer(
            cfg, dist, self.strategy, parts, self.state, layout, make_scheduler
        )
        self.watch = RunWatch(cfg, dist, self.checkpointer, self.budget)
        self.parts = parts
        log_setup(
            self.dist, self.precision, self.checkpointed_blocks, self.micro, self.accumulation
        )

    def _find_micro(
        self, wrapped: nn.Module, data: Dataset, collate_fn: Callable[[list[Any]], Any] | None
    ) -> None:
        """batch.micro = "auto": measured, then the accumulation makes up the effective batch."""
        world = self.dist.world_size

        def call(batch: Any) -> torch.Tensor:
            with self.strategy.grad_sync(False), self.precision.autocast():
                return call_model(wrapped, batch, self.loss_fn)

        search = measure_micro(
            self.model,
            self.optimizer,
            data,
            collate_fn or default_collate,
            call,
            device=self.device,
            per_rank=self.effective_batch // world,  # at most the data's: see measure_micro
            margin=self.config.batch.memory_margin,
            agree=lambda fits: not self.dist.any_of(not fits)[0],
            stream=is_stream(data),
        )
        self.micro, self.micro_search = search.chosen, search
        self.accumulation = self.config.batch.accumulation_steps(world, self.micro)
        if self.flops is not None:  # counted on one sample: FLOPs and activations scale with it
            self.flops = scaled_count(self.flops, self.micro)

    @property
    def micro_now(self) -> int:
        """The micro-batch the steps use now: an out-of-memory error halves it."""
        return self.halving.now

    @property
    def scaler(self) -> LossScaler:
        return self.parts.scaler

    # ------------------------------------------------------------------------------------
    # Life cycle

    def close(self) -> None:
        """Let go of the run directory and leave the process group (if this Trainer joined
        it). Idempotent."""
        self.checkpointer.release()
        self.dist.close()

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, error: type[BaseException] | None, *_: object) -> None:
        if error is None:
            self.dist.barrier()  # the ranks leave together; after an error none waits for another
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit for bit (see `RunCheckpointer.state_dict`)."""
        return self.checkpointer.state_dict()

    def load_state_dict(self, state: dict[str, Any], *, shards: str | None = None) -> None:
        """Restore a `state_dict()`; refuses one written for another model, batch or layout."""
        self.checkpointer.load_state_dict(state, shards=shards)

    # ------------------------------------------------------------------------------------
    # The loop

    def fit(self) -> FitResult:
        """Train until a budget, the data (run.max_epochs), early stopping or a preemption
        ends the run. Resumes from the newest valid checkpoint when `checkpoint.resume = auto`.

        Used from Python with no logging configured, it shows the same lines and summary as
        `thrifty train`; configure logging (or pass `rich`-free handlers) to take them over."""
        if self._fitted:
            raise ThriftyError(
                "fit() already ran on this Trainer: build a new Trainer to train again (with a "
                "larger run.max_steps it continues from the run's checkpoint)"
            )
        self._fitted = True
        with console_for_api() as speak:
            try:
                result = self._fit()
            except Exception as exc:  # a rank gone: one line and the exit code to resume with
                lost = lost_rank_error(exc, self.dist, self.checkpointer.newest_step)
                if lost is None:
                    raise
                raise lost from exc
            finally:
                self.checkpointer.release()
            if speak and self.dist.is_main:
                show_result(result, self.diagnosis)
        return result

    def _fit(self) -> FitResult:
        wall_start = time.perf_counter()
        # `thrifty train` answers a stop signal before the loop with "nothing to save yet"
        # (StopRequested): checked where nothing is half-done, on every rank together.
        stops = active_stop_signals()
        stops.check(self._agreed)  # before the run directory is claimed
        self.run_dir = self.checkpointer.open(self.interface)
        stops.resume_step = self.state.step
        monitor = instruments.build_monitor(
            self.config,
            self.device,
            self.precision,
            self.dist,
            step_flops=self.flops.flops * self.accumulation if self.flops else None,
            metrics=self.checkpointer.metrics,
            budget=self.budget,
            progress=self.state,
            lost=self.checkpointer.lost,
        )
        s = self.state
        try:
            stops.check(self._agreed)  # the checkpoint is loaded: still nothing to save
            reason, windows = self._before_loop(stops)
            clock = RunClock(s.seconds)
            self.checkpointer.start()  # from here a stop signal saves a checkpoint
            stops.check(self._agreed)  # one that came before the watcher took over
            stops.past_set_up = True
            self.dist.timeouts.begin(s.step)
            with maybe_trace(self.config.measure.trace, self.config.measure.trace_steps) as trace:
                clock.step_start = time.perf_counter()
                monitor.start()  # the first sync point: intervals are measured sync to sync
                monitor.timer.start()
                for window in windows:
                    stop = self._step(window, monitor, clock)
                    trace()
                    if stop is not None:
                        reason = stop
                        break
                    clock.step_start = time.perf_counter()
                    monitor.timer.start()
            reason = self.watch.flush(monitor) or reason
            if self.batches.error is not None:
                # The data raised (a worker lost to the group's SIGTERM, a source gone): every
                # finished step is saved, and a stop that was asked for is a preemption (its
                # save an emergency one; a source gone is no preemption, nor another rank's).
                self.checkpointer.save(emergency=self.checkpointer.preempted)
                reason = "preempted" if self.checkpointer.preempted else "data_error"
            # A diverged run keeps its last good checkpoint as the newest.
            final = reason not in ("preempted", "diverged", "data_error")
            if final and self.config.checkpoint.final:
                self.checkpointer.save(final=True)
            self.dist.timeouts.end(self.dist.rank)  # rank 0 uploads while the others wait
            self.checkpoint_status = self.checkpointer.finish()
            self.dist.barrier()  # no rank leaves while rank 0 still writes the checkpoint
        except BaseException:
            self.checkpointer.abandon()
            raise
        finally:
            monitor.close()
            self.batches.close()
        result = fit_result(self, reason, monitor, time.perf_counter() - wall_start)
        if self.dist.is_main:
            self.diagnosis = write_outputs(self, result, monitor)
        if reason == "data_error":
            raise DataSourceError(
                f"the training data raised {self.batches.error} after step {s.step}, which is "
                "saved: fix the source and run the same command to resume there"
            )
        return result

    def _agreed(self, flag: bool) -> bool:
        """Whether any rank raised `flag` (a collective: every rank asks at the same point)."""
        return self.dist.any_of(flag)[0]

    def _before_loop(self, stops: StopSignals) -> tuple[str, Any]:
        """The evaluations before the first step, which a stop signal ends at once: the initial
        one, or one a preemption put off (it comes first, as it would have). Returns the stop
        reason if the loop ends without a step, and the windows to train on: none when the run
        was preempted at its last step, its budget spent."""
        s = self.state
        with stops.interruptible():
            if s.step == 0:
                s.initial_val_loss = s.val_loss = self.evaluate()
            pending = self.evaluate() if s.eval_pending else None
        finished = self.budget.exceeded(s.step, s.tokens, s.seconds)
        if s.eval_pending:
            stop = self.watch.evaluated(pending)  # always recorded: `or` would skip it
            finished = finished or stop
        windows = self.batches.windows(s, self.dist) if finished is None else iter(())
        return finished or "data_exhausted", windows

    def _step(self, window: list[Any], monitor: RunMonitor, clock: RunClock) -> str | None:
        """One optimizer step on `window` and its boundary; the stop reason, or None."""
        cfg, s, timer = self.config, self.state, monitor.timer
        timer.mark("data_wait")
        lr = self.optimizer.param_groups[0]["lr"]
        counts = window_counts(window)
        samples, tokens = sum(counts[0]), sum(counts[1])
        totals = None
        if self.dist.enabled and uses_tokens(window, cfg.batch.normalize):
            # Token weights need the window's tokens over all ranks before backward.
            totals = self.dist.sum_ints([samples, tokens])

        def say() -> list[int]:
            """This rank's word at the boundary, read once backward is done: the counts, a
            preemption notice, its clock, a save due."""
            out_of_time = self.budget.out_of_time(clock.seconds())
            due = self.checkpointer.due(s.step + 1)
            return [samples, tokens, self.checkpointer.preempted, out_of_time, due]

        loss, grad_norm, skipped, heard = self._train_step(
            window, counts, timer, totals, say if self.dist.enabled else None
        )
        seconds = clock.seconds()
        preempted, due = self.checkpointer.preempted, self.checkpointer.due(s.step + 1)
        time_up = False
        if heard is not None:  # every rank's say, agreed on with the out-of-memory verdict
            samples, tokens = totals or heard[:2]
            preempted, time_up, due = (n > 0 for n in heard[2:])
        s.advance(samples, tokens, seconds, self.accumulation)
        self.dist.timeouts.step_done(s.step)
        reason = self._boundary(preempted, time_up, due, loss, skipped, monitor, clock)
        monitor.add(
            {
                "step": s.step,
                "loss": loss,
                "grad_norm": grad_norm,
                "skipped": skipped,
                "lr": lr,
                "samples": s.samples,
                "tokens": s.tokens,
                "step_seconds": time.perf_counter() - clock.step_start,
                "samples_in_step": samples,
                "tokens_in_step": tokens,
            },
            timer.finish(),
        )
        if len(monitor.pending) >= cfg.run.log_every or reason is not None:
            reason = self.watch.flush(monitor) or reason
        return reason

    def _train_step(
        self,
        window: list[Any],
        counts: tuple[list[int], list[int]],
        timer: NullTimer,
        totals: list[int] | None = None,
        say: Callable[[], list[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | bool | None, list[int] | None]:
        """One optimizer step over an accumulation window; returns (loss, grad norm, skipped) as
        tensors on the device — reading them would force a host sync, so the caller batches
        that — and what the ranks agreed on. `skipped` (None with the guard off) is True where
        a non-finite loss or gradient left the step out.
        `counts` are the window's samples and tokens per micro-batch, counted on the host;
        `totals` the samples and tokens of the window over all ranks (None: one process);
        `say()` this rank's boundary word, summed over the ranks (None: one process)."""
        p, strategy = self.parts, self.strategy
        if self.halving.times:  # the micro-batch an earlier out-of-memory error left
            window = self.halving.apply(window)
            counts = window_counts(window)
        while True:
            try:
                window_loss, heard = self._accumulate(window, counts, timer, totals, say)
                break
            except torch.OutOfMemoryError as exc:
                error = str(exc)
            # Outside the handler, whose frames held the failed attempt's tensors.
            window = self.halving.halve(window, error, self.optimizer)
            self.watch.log_event(event="out_of_memory", micro_batch=self.halving.now)
            counts = window_counts(window)
        # The true gradients' norm, recorded at every step (clipping or not): it is the first
        # sign of a run going wrong. Unscaled first, so neither clipping nor the record sees
        # the loss scale.
        p.scaler.unscale_(self.optimizer)
        grad_norm = strategy.clip_norm(self._params, self.config.optimizer.grad_clip)
        skipped = guarded_step(
            self.optimizer,
            p.scaler,
            window_loss,
            grad_norm,
            enabled=self.config.guard.enabled,
            local_loss=not self.dist.enabled,
        )
        p.scheduler.step()  # set back at the next flush for a skipped step
        self.optimizer.zero_grad(set_to_none=True)
        timer.mark("optimizer")
        return (
            window_loss,
            grad_norm,
            skipped,
            heard,
        )  # the loss is this rank's: averaged when logged

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
        weights = loss_weights(
            window, self.config.batch.normalize, counts, totals, self.dist.world_size
        )
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

    def _boundary(
        self,
        preempted: bool,
        time_up: bool,
        due: bool,
        loss: torch.Tensor,
        skipped: torch.Tensor | bool | None,
        monitor: RunMonitor,
        clock: RunClock,
    ) -> str | None:
        """After a step, with every rank's say agreed on: the budget, the preemption notice,
        the evaluation, the guard and the save interval. Returns the stop reason, or None."""
        cfg, s = self.config, self.state
        reason = self.budget.exceeded(s.step, s.tokens, s.seconds)
        if time_up and reason is None:  # another rank's clock ran out first
            reason = "max_time"
        # A preemption notice leaves 30 s (GCP, Azure) to 2 min (AWS): the emergency
        # checkpoint comes first, before any evaluation due at this step.
        eval_due = self.val_data is not None and (
            s.step % cfg.eval.every == 0 or reason is not None
        )
        if preempted:
            reason = "preempted"
            s.eval_pending = eval_due  # done first thing on resume
        elif eval_due:
            monitor.pause()  # evaluation is not training: left out of the interval
            eval_start = time.perf_counter()
            stop = self.watch.evaluated(self.evaluate())  # always evaluated: `or` would skip it
            reason = reason or stop
            monitor.resume()
            clock.step_start += time.perf_counter() - eval_start  # evaluation is not step time
        if preempted or (due and reason is None):
            # The guard sees every step before a save: none is written while a loss spike
            # builds, or from a run that diverged.
            reason = self.watch.flush(monitor, self.watch.current(loss, skipped)) or reason
            if preempted or not (self.watch.suspect or reason == "diverged"):
                if preempted and self.checkpointer.saves is not None:
                    self.checkpointer.saves.emergency_begins(s.step)  # for a Ctrl-C meanwhile
                monitor.timer.add("checkpoint", self.checkpointer.save(emergency=preempted))
        return reason

    def evaluate(self) -> float | None:
        """Mean validation loss (weighted by samples, or tokens with a loss_mask), or None."""
        if self.val_data is None:
            return None
        self.strategy.before_eval()
        e = self.config.eval
        return validation_loss(
            self.model,
            self.forward_model,
            self.batches.eval_loader(self.val_data, self.dist.rank),
            device=self.device,
            precision=self.precision,
            loss_fn=self.loss_fn,
            dist=self.dist,
            max_batches=e.batches,
            micro=e.micro or self.micro,
        )
