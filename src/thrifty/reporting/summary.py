"""What a run reports when `fit()` ends: the FitResult, and on rank 0 the diagnosis of what
limited its steps (diagnosis.json), for a finished run summary.json, and for every run its
report (report.html), both handed to the loggers that keep files (MLflow).

All of it is built from `RunFacts`, the record the Trainer fills in as `fit()` ends: reporting
reads that record, not the Trainer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from thrifty.data.geometry import BatchGeometry
from thrifty.levers.activation_checkpointing import micro_that_fits
from thrifty.levers.precision import Precision
from thrifty.measure import instruments
from thrifty.measure.monitor import RunMonitor
from thrifty.records.state import FitResult, TrainState
from thrifty.records.stop import StopReason
from thrifty.rundir.files import MetricsLog, write_json


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFacts:
    """A run's set-up and where it ended, as `fit()` hands them to reporting."""

    set_up: instruments.SetUp  # the levers set up, as the diagnosis names them
    report: bool  # log.report: the run writes report.html
    device: torch.device
    precision: Precision
    progress: TrainState  # the counters and losses
    strategy: str  # "single", "ddp", "fsdp"
    world_size: int
    parameters: int  # trainable parameters
    checkpointed_blocks: list[str]  # the blocks activation checkpointing wraps
    flops: Any  # the FLOP count of one micro-batch at `geometry.micro` (None: not counted)
    geometry: BatchGeometry  # the batch set up (its micro measured with batch.micro = "auto")
    micro_now: int  # the micro-batch at the end: out-of-memory errors halve it
    micro_search: dict[str, Any] | None  # how batch.micro = "auto" chose
    num_workers: int
    worker_choice: Any  # how data.num_workers = "auto" chose (None: given)
    best_val_loss: float | None
    guard: dict[str, Any]  # the run guard's summary
    guard_saved: dict[str, Any] | None  # what a stop before the budget did not spend
    run_dir: Path | None
    checkpoint: dict[str, Any] | None  # where the newest checkpoint is (rank 0)
    metrics: MetricsLog | None  # rank 0's, whose loggers keep the files


def fit_result(facts: RunFacts, reason: str, monitor: RunMonitor, wall_seconds: float) -> FitResult:
    """The run's figures: counters, losses, rates, cost, the guard's savings, the newest save."""
    f, s = facts, facts.progress
    return FitResult(
        steps=s.step,
        samples=s.samples,
        tokens=s.tokens,
        train_loss=monitor.train_loss,
        # Measured after training began, or None: with no evaluation since step 0 the newest
        # val loss is the initial one, not a final one.
        val_loss=s.val_loss if s.val_steps else None,
        initial_val_loss=s.initial_val_loss,
        best_val_loss=f.best_val_loss,
        tokens_per_second=monitor.meter.tokens_per_second,
        samples_per_second=monitor.meter.samples_per_second,
        stop_reason=reason,
        wall_seconds=wall_seconds,
        training_seconds=s.seconds,
        precision=f.precision.name,
        num_workers=f.num_workers,
        checkpointed_blocks=f.checkpointed_blocks,
        run_dir=str(f.run_dir) if f.run_dir else None,
        mfu=monitor.mfu,
        breakdown=monitor.mean_phases(),
        cost=monitor.cost.summary(wall_seconds).to_dict() if monitor.cost is not None else None,
        world_size=f.world_size,
        strategy=f.strategy,
        parameters=f.parameters,
        step_seconds=monitor.meter.step_seconds,
        checkpoint=f.checkpoint,
        guard={**f.guard, "saved": f.guard_saved},
        micro_batch=f.micro_now,
        micro_batch_search=f.micro_search,
        peak_memory_bytes=(
            float(torch.cuda.max_memory_allocated(f.device)) if f.device.type == "cuda" else None
        ),
    )


def write_outputs(facts: RunFacts, result: FitResult, monitor: RunMonitor) -> Any:
    """Rank 0: diagnose the run and write diagnosis.json (with what the guard saved, beside
    the bottleneck), summary.json (the FitResult and the run's set-up) and the report. A run
    preempted or stopped by its data writes no summary: summary.json marks a finished run.
    Returns the diagnosis."""
    f = facts
    diagnosis = instruments.diagnose_run(
        monitor,
        f.device,
        f.precision,
        flops=f.flops,
        micro=f.geometry.micro,
        accumulation=f.geometry.accumulation,
        num_workers=f.num_workers,
        worker_choice=f.worker_choice,
        set_up=f.set_up,
    )
    if f.run_dir is None:
        return diagnosis
    if diagnosis is not None:
        write_json(f.run_dir / "diagnosis.json", {**diagnosis.to_dict(), "guard": f.guard})
    finished = not StopReason(result.stop_reason).unfinished
    if finished:
        write_json(f.run_dir / "summary.json", run_summary(f, result, monitor))
    publish(f, f.run_dir, finished)
    return diagnosis


def run_summary(facts: RunFacts, result: FitResult, monitor: RunMonitor) -> dict[str, Any]:
    """summary.json's contents: the FitResult and the set-up that explains it."""
    choice = facts.worker_choice
    summary = asdict(result)
    summary["final_val_loss"] = summary.pop("val_loss")
    summary["precision_reason"] = facts.precision.reason
    summary["accumulation_steps"] = facts.geometry.accumulation
    summary["effective_batch"] = facts.geometry.effective
    if monitor.peak is not None:  # what the MFU is measured against
        summary["mfu_basis"] = {
            "flops_per_step": monitor.flops_per_step,
            "peak_flops_per_second": monitor.peak.flops_per_second,
            "peak_source": monitor.peak.source,
        }
    if choice is not None:
        measured = {str(k): v for k, v in choice.seconds_per_batch.items()}
        summary["num_workers_measured_seconds_per_batch"] = measured
    fits = checkpointing_fits(facts)
    if fits:
        summary["activation_checkpointing_fits"] = fits
    return summary


def checkpointing_fits(facts: RunFacts) -> dict[str, int]:
    """On a GPU with batch.micro = "auto": the largest micro-batch each heavier checkpointing
    policy would fit, by the run's measured memory (`micro_that_fits`); `thrifty tune` skips a
    policy that cannot make room for a larger micro-batch than this run's."""
    search, count = facts.micro_search, facts.flops
    if facts.device.type != "cuda" or not search or count is None:
        return {}
    memory = torch.cuda.get_device_properties(facts.device).total_memory
    policy = facts.set_up.checkpointing
    limit = (1 - search["margin"]) * memory
    return micro_that_fits(
        search["tried"],
        limit,
        count.block_bytes,
        count.input_bytes,
        facts.geometry.micro,
        policy,
        count.head_bytes,
    )


def publish(facts: RunFacts, run_dir: Path, finished: bool) -> None:
    """Write the run's report (log.report), preempted or not, and hand summary.json and the
    report to the loggers that keep files (MLflow's artifacts)."""
    files = [run_dir / "summary.json"] if finished else []
    if facts.report:
        from thrifty.reporting import write_run_report

        report = write_run_report(run_dir)
        if report is not None:
            files.append(report)
    metrics = facts.metrics
    for sink in metrics.sinks if metrics is not None else ():
        sink.finish(files, finished)
