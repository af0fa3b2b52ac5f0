"""The Trainer: one training loop that applies every cost lever from one config.

A Trainer is built whole in `__init__`: device, precision, strategy, optimizer, schedule, data,
the run checkpointer, the run's callbacks. `fit()` opens the run (resuming it if a checkpoint
exists) and loops over the windows: each step (`thrifty.run.step`) calls the levers it uses, it
does not branch on them, and at its end the run's callbacks decide, in order, on the votes
every rank cast: the preemption notice, the budget, the evaluation (early stopping, the
forecast), the checkpoint saver, the user's callbacks, and the guard that records the step
(`thrifty.callbacks`). `close()` (or `with Trainer(...) as trainer:`) leaves the process group.
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
from torch.utils.data import Dataset

from thrifty.callbacks import Callback, Callbacks, StepEnd
from thrifty.callbacks.budget import BudgetCheck
from thrifty.callbacks.checkpoint_saver import CheckpointSaver, PreemptionNotice
from thrifty.callbacks.evaluation import Evaluation
from thrifty.callbacks.guard import Guard, stop_saved
from thrifty.checkpointing.store.manifest import step_dir
from thrifty.config import RunConfig, TrainConfig
from thrifty.data.batching import check_token_budget
from thrifty.errors import DataSourceError, ThriftyError
from thrifty.levers.accumulation import LossFn, count_tokens
from thrifty.levers.optimizer import OptimizerArg
from thrifty.levers.precision import LossScaler
from thrifty.levers.user_scheduler import SchedulerArg
from thrifty.measure import instruments
from thrifty.measure.monitor import RunMonitor
from thrifty.measure.timing import maybe_trace
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
from thrifty.run.evaluation import validation_loss
from thrifty.run.inputs import check_inputs
from thrifty.run.setup import assemble_run, set_up_levers
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
        check_inputs(
            model,
            train_data,
            val_data,
            cfg.batch,
            eval_micro=cfg.eval.micro,
            target=cfg.early_stopping.target,
            sampler=sampler,
            batch_sampler=batch_sampler,
        )
        self._order = {"sampler": sampler, "batch_sampler": batch_sampler}
        self.model, self.val_data, self.loss_fn = model, val_data, loss_fn
        # Trained from a script: fit() shows the result and the exit code the script should end
        # with. `thrifty train` sets False: it shows the result and exits with the code itself.
        self.from_script = True
        self.diagnosis: Any = None  # set by fit(): what limited the steps, what to change
        self.checkpoint_status: dict[str, Any] | None = None  # the newest save, once fit() ends
        self.run_dir: Path | None = None
        self._fitted = False
        self.callbacks = Callbacks(callbacks or [])  # the user's, in the order given
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
        levers = set_up_levers(
            self.model,
            train_data,
            cfg,
            dist,
            device,
            optimizer=optimizer,
            loss_fn=self.loss_fn,
            collate_fn=collate_fn,
        )
        self.device, self.precision = levers.device, levers.precision
        self.strategy, self.geometry = levers.strategy, levers.geometry  # resolved once
        self.flops, self.held, self.micro_search = levers.flops, levers.held, levers.micro_search
        self.set_up = levers.set_up
        self.checkpointed_blocks, self.optimizer = levers.checkpointed_blocks, levers.optimizer
        run = assemble_run(
            self.model,
            train_data,
            cfg,
            dist,
            levers,
            collate_fn=collate_fn,
            order=self._order,
            scheduler=scheduler,
            loss_fn=self.loss_fn,
            log_event=self.log_event,
        )
        self.batches, self.forward_model, self.parts = run.batches, run.forward_model, run.parts
        self.state, self.budget, self.checkpointer = run.state, run.budget, run.checkpointer
        self.halving, self.train_step = run.halving, run.train_step
        self.events = self._events()
        log_setup(self.dist, self.precision, self.micro, self.accumulation)
        log_checkpointing(cfg.activation_checkpointing.policy, self.checkpointed_blocks, self.held)

    def _events(self) -> Callbacks:
        """The run's callbacks in the order they are called: thrifty's own around the user's
        (`thrifty.callbacks.events`). Each decides at a step's end from the votes it cast."""
        cfg = self.config
        self.guard = Guard(
            cfg.guard,
            self.checkpointer,
            self.dist,
            log_every=cfg.run.log_every,
            log_event=self.log_event,
        )
        self.evaluation = Evaluation(
            self.state,
            self.budget,
            self.parts.early_stopping,
            self.parts.guard,
            lambda: self.evaluate(),  # looked up when called: a subclass's
            every=cfg.eval.every,
            target=cfg.early_stopping.target,
            guard_config=cfg.guard,
            warmup_steps=cfg.schedule.warmup_steps,
            validates=self.val_data is not None,
            hear=self.callbacks,
            log_event=self.log_event,
        )
        return Callbacks(
            [
                PreemptionNotice(self.checkpointer),
                BudgetCheck(self.budget, self.state, self.dist.world_size),
                self.evaluation,
                CheckpointSaver(self.checkpointer, self.guard, self._saved),
                *self.callbacks.items,
                self.guard,
            ]
        )

    def log_event(self, **fields: Any) -> None:
        """An event of the current step in metrics.jsonl (rank 0's)."""
        metrics = self.checkpointer.metrics
        if metrics is not None:
            metrics.write([{"step": self.state.step, **fields}])

    @property
    def micro(self) -> int:
        """The micro-batch set up (measured with batch.micro = "auto"): `geometry.micro`."""
        return self.geometry.micro

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step on each rank: `geometry.accumulation`."""
        return self.geometry.accumulation

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
                show_result(result, self.diagnosis, from_script=self.from_script)
            elif self.from_script and self.dist.is_main and stop_line(result, from_script=True):
                # the script's logging: the exit code too
                log.warning(stop_line(result, from_script=True))
        return result

    def _fit(self) -> FitResult:
        wall_start = time.perf_counter()
        # A stop signal before the loop is "nothing to save yet" (StopRequested), on every rank.
        stops = active_stop_signals()
        stops.check(self._agreed)  # before the run directory is claimed
        self.run_dir = self.checkpointer.open()
        stops.resume_step = self.state.step
        cfg = self.config
        monitor = instruments.build_monitor(
            cfg.measure,
            cfg.cost,
            self.device,
            self.precision,
            self.dist,
            step_flops=self.flops.flops * self.accumulation if self.flops else None,
            metrics=self.checkpointer.metrics,
            budget=self.budget,
            progress=self.state,
            lost=self.checkpointer.lost,
            bar=cfg.run.progress,
            compiled=cfg.compile.mode != "off",
            allow_tf32=cfg.precision.allow_tf32,
        )
        self.checkpointer.cost = monitor.cost
        self.monitor = monitor
        if monitor.cost is not None:
            monitor.cost.begin(wall_start)  # an attempt is billed from the start of fit()
        s = self.state
        try:
            stops.check(self._agreed)  # the checkpoint is loaded: still nothing to save
            self.events.fit_start(self)
            finished = self.evaluation.before_loop(stops)
            windows = self.batches.windows(s, self.dist) if finished is None else iter(())
            reason = StopReason.decide(finished, StopReason.DATA_EXHAUSTED)
            self.clock = clock = RunClock(s.seconds)
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
            reason = StopReason.decide(self.guard.flush(), reason)
            if self.batches.error is not None:
                # The data raised (a worker lost to the group's SIGTERM, a source gone): every
                # finished step is saved, and a stop that was asked for is a preemption (its
                # save an emergency one; a source gone is no preemption, nor another rank's).
                self.checkpointer.save(emergency=self.checkpointer.preempted)
                reason = (
                    StopReason.PREEMPTED if self.checkpointer.preempted else StopReason.DATA_ERROR
                )
            self.events.stop(s.step, reason)
            # A diverged run keeps its last good checkpoint as the newest.
            final = reason.saves_final and self.config.checkpoint.final
            if final:
                self.checkpointer.save(final=True)
            self.dist.timeouts.end(self.dist.rank)  # rank 0 uploads while the others wait
            self.checkpoint_status = self.checkpointer.finish()
            self.dist.barrier()  # no rank leaves while rank 0 still writes the checkpoint
            if final and self.checkpointer.newest_step == s.step:
                self._saved(s.step)
        except BaseException:
            self.checkpointer.abandon()
            raise
        finally:
            monitor.close()
            self.batches.close()
        facts = self._facts(reason, monitor)
        result = fit_result(facts, reason, monitor, time.perf_counter() - wall_start)
        if reason is StopReason.CALLBACK:
            result.stop_detail = self.callbacks.stop_detail or self.events.stop_detail
        if self.dist.is_main:
            self.diagnosis = write_outputs(facts, result, monitor)
        if reason is StopReason.DATA_ERROR:
            raise DataSourceError(
                f"the training data raised {self.batches.error} after step {s.step}, which is "
                "saved: fix the source and run the same command to resume there"
            )
        self.events.fit_end(result)
        return result

    def _facts(self, reason: StopReason, monitor: RunMonitor) -> RunFacts:
        """What reporting needs of this run, as it ended with `reason`."""
        early, guard = self.parts.early_stopping, self.parts.guard
        return RunFacts(
            set_up=self.set_up,
            report=self.config.log.report,
            device=self.device,
            precision=self.precision,
            progress=self.state,
            strategy=self.strategy.name,
            world_size=self.dist.world_size,
            parameters=sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            checkpointed_blocks=self.checkpointed_blocks,
            flops=self.flops,
            geometry=self.geometry,
            micro_now=self.micro_now,
            micro_search=self.micro_search.to_dict() if self.micro_search else None,
            num_workers=self.batches.num_workers,
            worker_choice=self.batches.worker_choice,
            best_val_loss=early.best if early.history else None,
            guard=guard.summary(),
            guard_saved=stop_saved(reason, self.budget, self.state, monitor),
            run_dir=self.run_dir,
            checkpoint=self.checkpoint_status,
            metrics=self.checkpointer.metrics,
        )

    def _agreed(self, flag: bool) -> bool:
        """Whether any rank raised `flag` (a collective: every rank asks at the same point)."""
        return self.dist.any_of(flag)[0]

    def _step(self, window: list[Any], monitor: RunMonitor, clock: RunClock) -> StopReason | None:
        """One optimizer step on `window`, then its end: the run's callbacks in order decide
        on the votes every rank cast (`thrifty.callbacks.events`). The stop reason, or None."""
        s, timer, events = self.state, monitor.timer, self.events
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
            """This rank's word, read once backward is done: its counts and the callbacks'
            votes (a preemption notice, its clock, a save due), summed on the step's one
            agreement across the ranks."""
            return [samples, tokens, *events.vote(s.step + 1)]

        loss, grad_norm, skipped, heard = self.train_step.run(
            window, counts, timer, totals and totals[::2], say if self.dist.enabled else None
        )
        seconds = clock.seconds()
        if heard is None:  # one process: its own votes are the sum
            votes = events.vote(s.step + 1)
        else:  # every rank's say, agreed on with the out-of-memory verdict
            samples, tokens = (totals or heard)[:2]
            votes = heard[2:]
        s.advance(samples, tokens, seconds, self.accumulation)
        self.dist.timeouts.step_done(s.step)
        record = {
            "step": s.step,
            "loss": loss,
            "grad_norm": grad_norm,
            "skipped": skipped,
            "lr": lr,
            "samples": s.samples,
            "tokens": s.tokens,
            "step_seconds": 0.0,  # the guard's, the last callback: the step's whole time
            "samples_in_step": samples,
            "tokens_in_step": tokens,
        }
        info = StepEnd(s.step, record)
        events.step_end(info, votes)
        return info.reason

    def _saved(self, step: int) -> None:
        """Step `step`'s checkpoint is saved: the callbacks that listen hear where it is on
        this machine (rank 0, once written: they wait for the background write; None on the
        other ranks)."""
        if not self.callbacks.hears_saves:
            return
        manager = self.checkpointer.manager
        location = None
        if manager is not None:
            manager.wait(uploads=False)
            location = os.path.join(manager.local_dir, step_dir(step))
        self.callbacks.save(step, location)

    def evaluate(self) -> float | None:
        """Mean validation loss (weighted by samples, or tokens with a loss_mask), or None."""
        if self.val_data is None:
            return None
        self.strategy.before_eval()
        e = self.config.eval
        micro = e.micro or self.micro
        return validation_loss(
            self.model,
            self.forward_model,
            self.batches.eval_loader(self.val_data, self.dist.rank, micro),
            device=self.device,
            precision=self.precision,
            loss_fn=self.loss_fn,
            dist=self.dist,
            max_batches=e.batches,
            micro=micro,
        )
