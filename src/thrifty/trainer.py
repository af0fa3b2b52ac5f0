"""The Trainer: one training loop that applies every cost lever from one config.

A Trainer is built whole in `__init__`: device, precision, strategy, optimizer, schedule, data,
the run checkpointer. `fit()` opens the run (resuming it if a checkpoint exists) and loops over
the windows: each step (`thrifty.run.step`) calls the levers it uses, it does not branch on
them, and the step boundary (`thrifty.run.boundary`) asks the budget, the evaluation, the
preemption watch, the guard and the checkpointer whether to go on. `close()` (or `with Trainer(...) as trainer:`) leaves the
process group.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from thrifty.callbacks import Callback, Callbacks
from thrifty.checkpoint.manifest import step_dir
from thrifty.config import RunConfig, TrainConfig
from thrifty.data.batching import TrainBatches, check_token_budget, starting_accumulation
from thrifty.data.sources import is_stream
from thrifty.errors import ConfigError, DataSourceError, ThriftyError
from thrifty.inputs import check_inputs
from thrifty.levers.accumulation import LossFn, call_model, count_tokens
from thrifty.levers.activation_checkpointing import apply_activation_checkpointing
from thrifty.levers.compile import compile_model
from thrifty.levers.early_stopping import EarlyStopping
from thrifty.levers.fp8 import apply_fp8
from thrifty.levers.micro_batch import Halving, MicroSearch, measure_micro, scaled_count
from thrifty.levers.optimizer import OptimizerArg, make_optimizer
from thrifty.levers.precision import LossScaler, Precision, resolve_precision
from thrifty.levers.user_scheduler import SchedulerArg, run_scheduler
from thrifty.measure import instruments
from thrifty.measure.monitor import RunMonitor
from thrifty.measure.timing import maybe_trace
from thrifty.records.budget import Budget
from thrifty.records.state import FitResult, RunClock, TrainState
from thrifty.records.stop import StopReason
from thrifty.records.stop_signals import active_stop_signals
from thrifty.reporting.end_of_run import (
    console_for_api,
    log_checkpointing,
    log_setup,
    show_result,
    stop_line,
)
from thrifty.reporting.summary import RunFacts, fit_result, write_outputs
from thrifty.run.boundary import StepBoundary
from thrifty.run.checkpointer import Layout, RunCheckpointer, RunParts
from thrifty.run.evaluation import validation_loss
from thrifty.run.guard import RunGuard
from thrifty.run.rng import seed_everything
from thrifty.run.step import TrainStep
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
    `callbacks` are `thrifty.callbacks.Callback` instances, called in the order given at the
    run's events (fit start, evaluation end, save, step end, stop, fit end): at a step's end
    after thrifty's own budget, evaluation, guard and save; one may stop the run, add figures
    to the step's record in metrics.jsonl, and vote with integers summed across the ranks.

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
        callbacks: list[Callback] | None = None,
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
        # None without callbacks: the step then pays nothing for them.
        self.callbacks = Callbacks(callbacks) if callbacks else None
        self._stop_detail: str | None = None  # a callback's words for its stop
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
        check_token_budget(train_data, collate_fn, cfg.run.max_tokens)  # before any cost
        self.device = resolve_device(device)
        self.precision: Precision = resolve_precision(cfg.precision.mode, self.device)
        auto = cfg.batch.micro == "auto"
        # The micro-batch until measured (with "auto": one sample, for the FLOP count).
        self.micro = 1 if auto else cfg.batch.fixed_micro
        self.effective_batch = cfg.batch.effective or self.micro * dist.world_size
        self.accumulation = starting_accumulation(cfg.batch, dist.world_size, self.micro)
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
        if self.precision.name == "fp8":  # after the FLOP count, before anything wraps it
            apply_fp8(self.model)
        policy = cfg.activation_checkpointing.policy
        self.held = instruments.held_on_every_rank(self.dist, self.flops, policy)
        try:
            self.checkpointed_blocks = apply_activation_checkpointing(self.model, policy, self.held)
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
        self.state = TrainState()
        self.budget = Budget.of(cfg.run, self.batches.steps_per_epoch)
        scheduler, horizon, make_scheduler = run_scheduler(
            scheduler,
            self.optimizer,
            cfg,
            self.budget.epoch_steps,
            self.effective_batch,
            self.batches.steps_per_epoch,
        )
        parts = RunParts(
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
        self.halving = Halving(self.micro, self.device)  # out-of-memory errors survived
        self.train_step = TrainStep(
            cfg,
            dist,
            self.strategy,
            self.precision,
            self.device,
            parts,
            forward_model=self.forward_model,
            loss_fn=self.loss_fn,
            halving=self.halving,
            log_event=self.watch.log_event,
        )
        self.boundary = StepBoundary(
            cfg,
            self.state,
            self.budget,
            self.watch,
            self.checkpointer,
            lambda: self._evaluated(self.evaluate()),  # looked up when called: a subclass's
            validates=self.val_data is not None,
        )
        log_setup(self.dist, self.precision, self.micro, self.accumulation)
        log_checkpointing(cfg.activation_checkpointing.policy, self.checkpointed_blocks, self.held)

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
                show_result(result, self.diagnosis, self.interface)
            elif self.interface == "api" and self.dist.is_main and stop_line(result, "api"):
                log.warning(stop_line(result, "api"))  # the script's logging: the exit code too
        return result

    def _fit(self) -> FitResult:
        wall_start = time.perf_counter()
        # A stop signal before the loop is "nothing to save yet" (StopRequested), on every rank.
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
        self.checkpointer.cost = monitor.cost
        if monitor.cost is not None:
            monitor.cost.begin(wall_start)  # an attempt is billed from the start of fit()
        s = self.state
        try:
            stops.check(self._agreed)  # the checkpoint is loaded: still nothing to save
            if self.callbacks:
                self.callbacks.fit_start(self)
            finished = self.boundary.before_loop(stops)
            windows = self.batches.windows(s, self.dist) if finished is None else iter(())
            reason = StopReason.decide(finished, StopReason.DATA_EXHAUSTED)
            clock = RunClock(s.seconds)
            self.checkpointer.start()  # from here a stop signal saves a checkpoint
            stops.check(self._agreed)  # one that came before the watcher took over
            stops.past_set_up = True
            self.dist.timeouts.begin(s.step)
            if self.device.type == "cuda":
                # peak_memory_bytes is the steps' peak: not the set-up's (the FLOP count's eager
                # step before checkpointing and compile, the micro-batch search's probes).
                torch.cuda.reset_peak_memory_stats(self.device)
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
            reason = StopReason.decide(self.watch.flush(monitor), reason)
            if self.batches.error is not None:
                # The data raised (a worker lost to the group's SIGTERM, a source gone): every
                # finished step is saved, and a stop that was asked for is a preemption (its
                # save an emergency one; a source gone is no preemption, nor another rank's).
                self.checkpointer.save(emergency=self.checkpointer.preempted)
                reason = (
                    StopReason.PREEMPTED if self.checkpointer.preempted else StopReason.DATA_ERROR
                )
            if self.callbacks:
                self.callbacks.stop(s.step, reason)
            # A diverged run keeps its last good checkpoint as the newest.
            final = reason.saves_final and self.config.checkpoint.final
            if final:
                self.checkpointer.save(final=True)
            self.dist.timeouts.end(self.dist.rank)  # rank 0 uploads while the others wait
            self.checkpoint_status = self.checkpointer.finish()
            self.dist.barrier()  # no rank leaves while rank 0 still writes the checkpoint
            if final and self.callbacks and self.checkpointer.newest_step == s.step:
                self.callbacks.save(s.step, self._save_location(s.step))
        except BaseException:
            self.checkpointer.abandon()
            raise
        finally:
            monitor.close()
            self.batches.close()
        facts = self._facts(reason, monitor)
        result = fit_result(facts, reason, monitor, time.perf_counter() - wall_start)
        if reason is StopReason.CALLBACK:
            result.stop_detail = self._stop_detail
        if self.dist.is_main:
            self.diagnosis = write_outputs(facts, result, monitor)
        if reason is StopReason.DATA_ERROR:
            raise DataSourceError(
                f"the training data raised {self.batches.error} after step {s.step}, which is "
                "saved: fix the source and run the same command to resume there"
            )
        if self.callbacks:
            self.callbacks.fit_end(result)
        return result

    def _facts(self, reason: StopReason, monitor: RunMonitor) -> RunFacts:
        """What reporting needs of this run, as it ended with `reason`."""
        early, guard = self.parts.early_stopping, self.parts.guard
        return RunFacts(
            config=self.config,
            device=self.device,
            precision=self.precision,
            progress=self.state,
            strategy=self.strategy.name,
            world_size=self.dist.world_size,
            parameters=sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            checkpointed_blocks=self.checkpointed_blocks,
            flops=self.flops,
            micro=self.micro,
            micro_now=self.micro_now,
            micro_search=self.micro_search.to_dict() if self.micro_search else None,
            accumulation=self.accumulation,
            effective_batch=self.effective_batch,
            num_workers=self.batches.num_workers,
            worker_choice=self.batches.worker_choice,
            best_val_loss=early.best if early.history else None,
            guard=guard.summary(),
            guard_saved=self.watch.saved(reason, monitor),
            run_dir=self.run_dir,
            checkpoint=self.checkpoint_status,
            metrics=self.checkpointer.metrics,
        )

    def _agreed(self, flag: bool) -> bool:
        """Whether any rank raised `flag` (a collective: every rank asks at the same point)."""
        return self.dist.any_of(flag)[0]

    def _step(self, window: list[Any], monitor: RunMonitor, clock: RunClock) -> StopReason | None:
        """One optimizer step on `window` and its boundary; the stop reason, or None."""
        cfg, s, timer = self.config, self.state, monitor.timer
        timer.mark("data_wait")
        lr = self.optimizer.param_groups[0]["lr"]
        weighting = self.train_step.weighting
        counts = weighting.counts(window)  # samples and loss tokens: the weights' basis
        samples, tokens = sum(counts[0]), sum(count_tokens(b) for b in window)
        totals = None
        if self.dist.enabled and weighting.by_tokens(window):
            # Token weights need the window's loss tokens over all ranks before backward:
            # samples, tokens and loss tokens; the step weighs by totals[::2].
            totals = self.dist.sum_ints([samples, tokens, sum(counts[1])])

        def say() -> list[int]:
            """This rank's word at the boundary, read once backward is done: the counts, a
            preemption notice, its clock, a save due."""
            out_of_time = self.budget.out_of_time(clock.seconds())
            due = self.checkpointer.due(s.step + 1)
            word = [samples, tokens, self.checkpointer.preempted, out_of_time, due]
            # The callbacks' votes ride on the same sum: no collective of their own.
            return word + self.callbacks.vote(s.step + 1) if self.callbacks else word

        loss, grad_norm, skipped, heard = self.train_step.run(
            window, counts, timer, totals and totals[::2], say if self.dist.enabled else None
        )
        seconds = clock.seconds()
        preempted, due = self.checkpointer.preempted, self.checkpointer.due(s.step + 1)
        time_up = False
        if heard is not None:  # every rank's say, agreed on with the out-of-memory verdict
            samples, tokens = (totals or heard)[:2]
            preempted, time_up, due = (n > 0 for n in heard[2:5])
        s.advance(samples, tokens, seconds, self.accumulation)
        self.dist.timeouts.step_done(s.step)
        reason = self.boundary.after_step(preempted, time_up, due, loss, skipped, monitor, clock)
        record = {
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
        }
        # A step saved is written out with its checkpoint, before the save (written in the
        # background) is published: a run killed after it resumes with that step's record.
        saved = self.checkpointer.newest_step == s.step
        if self.callbacks:
            votes = heard[5:] if heard is not None else None
            reason = self._step_end(self.callbacks, record, votes, reason, saved)
        monitor.add(record, timer.finish())
        if len(monitor.pending) >= cfg.run.log_every or reason is not None or saved:
            reason = StopReason.decide(self.watch.flush(monitor), reason)
        return reason

    def _step_end(
        self,
        callbacks: Callbacks,
        record: dict[str, Any],
        votes: list[int] | None,
        reason: StopReason | None,
        saved: bool,
    ) -> StopReason | None:
        """The callbacks' part of the step's end, after thrifty's own: the save this step made,
        then `on_step_end`, whose stop joins `reason`. `votes` is the ranks' sum of the
        callbacks' votes (None with one process: this process's own are the sum)."""
        step = self.state.step
        if saved:
            callbacks.save(step, self._save_location(step))
        if votes is None:
            votes = callbacks.vote(step)
        asked = callbacks.step_end(step, record, votes)
        if asked is None:
            return reason
        log.warning("a callback stops the run at step %d: %s", step, asked)
        if self._stop_detail is None:
            self._stop_detail = asked
        return StopReason.decide(reason, StopReason.CALLBACK)

    def _save_location(self, step: int) -> str | None:
        """Where step `step`'s checkpoint is on this machine, once written (rank 0): a callback
        that listens for saves waits for the background write; None on the other ranks."""
        manager = self.checkpointer.manager
        if manager is None:
            return None
        assert self.callbacks is not None
        if self.callbacks.hears_saves:
            manager.wait(uploads=False)
        return os.path.join(manager.local_dir, step_dir(step))

    def _evaluated(self, val_loss: float | None) -> float | None:
        """An evaluation's loss, heard by the callbacks before thrifty judges it."""
        if self.callbacks and self.val_data is not None:
            self.callbacks.evaluation_end(self.state.step, val_loss)
        return val_loss

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
