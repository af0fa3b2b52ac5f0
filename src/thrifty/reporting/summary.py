"""What a run reports when `fit()` ends: the FitResult, and on rank 0 the diagnosis of what
limited its steps (diagnosis.json), for a finished run summary.json, and for every run its
report (report.html), both handed to the loggers that keep files (MLflow)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from thrifty.measure import instruments
from thrifty.measure.monitor import RunMonitor
from thrifty.records.directory import write_json
from thrifty.records.state import FitResult

if TYPE_CHECKING:
    from thrifty.trainer import Trainer

UNFINISHED = ("preempted", "data_error")  # stop reasons of a run resumed later


def fit_result(
    trainer: Trainer, reason: str, monitor: RunMonitor, wall_seconds: float
) -> FitResult:
    """The run's figures: counters, losses, rates, cost, the guard's savings, the newest save."""
    t, s = trainer, trainer.state
    early, guard = t.parts.early_stopping, t.parts.guard
    return FitResult(
        steps=s.step,
        samples=s.samples,
        tokens=s.tokens,
        train_loss=monitor.train_loss,
        val_loss=s.val_loss,
        initial_val_loss=s.initial_val_loss,
        best_val_loss=early.best if early.history else None,
        tokens_per_second=monitor.meter.tokens_per_second,
        samples_per_second=monitor.meter.samples_per_second,
        stop_reason=reason,
        wall_seconds=wall_seconds,
        precision=t.precision.name,
        num_workers=t.batches.num_workers,
        checkpointed_blocks=t.checkpointed_blocks,
        run_dir=str(t.run_dir) if t.run_dir else None,
        mfu=monitor.mfu,
        breakdown=monitor.mean_phases(),
        cost=monitor.cost.summary().to_dict() if monitor.cost is not None else None,
        world_size=t.dist.world_size,
        strategy=t.strategy.name,
        parameters=sum(p.numel() for p in t.model.parameters() if p.requires_grad),
        step_seconds=monitor.meter.step_seconds,
        checkpoint=t.checkpoint_status,
        guard={**guard.summary(), "saved": t.watch.saved(reason, monitor)},
        micro_batch=t.micro_now,
        micro_batch_search=t.micro_search.to_dict() if t.micro_search else None,
        peak_memory_bytes=(
            float(torch.cuda.max_memory_allocated(t.device)) if t.device.type == "cuda" else None
        ),
    )


def write_outputs(trainer: Trainer, result: FitResult, monitor: RunMonitor) -> Any:
    """Rank 0: diagnose the run and write diagnosis.json (with what the guard saved, beside
    the bottleneck), summary.json (the FitResult and the run's set-up) and the report. A run
    preempted or stopped by its data writes no summary: summary.json marks a finished run.
    Returns the diagnosis."""
    t = trainer
    diagnosis = instruments.diagnose_run(
        monitor,
        t.config,
        t.device,
        t.precision,
        flops=t.flops,
        micro=t.micro,
        accumulation=t.accumulation,
        num_workers=t.batches.num_workers,
        worker_choice=t.batches.worker_choice,
    )
    if t.run_dir is None:
        return diagnosis
    if diagnosis is not None:
        guard = t.parts.guard.summary()
        write_json(t.run_dir / "diagnosis.json", {**diagnosis.to_dict(), "guard": guard})
    finished = result.stop_reason not in UNFINISHED
    if finished:
        write_json(t.run_dir / "summary.json", run_summary(t, result, monitor))
    publish(t, t.run_dir, finished)
    return diagnosis


def run_summary(trainer: Trainer, result: FitResult, monitor: RunMonitor) -> dict[str, Any]:
    """summary.json's contents: the FitResult and the set-up that explains it."""
    t, choice = trainer, trainer.batches.worker_choice
    summary = asdict(result)
    summary["final_val_loss"] = summary.pop("val_loss")
    summary["precision_reason"] = t.precision.reason
    summary["accumulation_steps"] = t.accumulation
    summary["effective_batch"] = t.effective_batch
    if monitor.peak is not None:  # what the MFU is measured against
        summary["mfu_basis"] = {
            "flops_per_step": monitor.flops_per_step,
            "peak_flops_per_second": monitor.peak.flops_per_second,
            "peak_source": monitor.peak.source,
        }
    if choice is not None:
        measured = {str(k): v for k, v in choice.seconds_per_batch.items()}
        summary["num_workers_measured_seconds_per_batch"] = measured
    return summary


def publish(trainer: Trainer, run_dir: Path, finished: bool) -> None:
    """Write the run's report (log.report), preempted or not, and hand summary.json and the
    report to the loggers that keep files (MLflow's artifacts)."""
    files = [run_dir / "summary.json"] if finished else []
    if trainer.config.log.report:
        from thrifty.reporting import write_run_report

        report = write_run_report(run_dir)
        if report is not None:
            files.append(report)
    metrics = trainer.checkpointer.metrics
    for sink in metrics.sinks if metrics is not None else ():
        sink.finish(files, finished)
