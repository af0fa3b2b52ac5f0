"""Printing a run's summary for people."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from thrifty.console import dash
from thrifty.levers.activation_checkpointing import policy_savings
from thrifty.plan.units import fmt_bytes
from thrifty.records.stop import StopReason


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return dash(value)  # the run directory as named, whatever its characters


def print_summary(result: Any) -> None:
    """A two-column table of a FitResult."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="thrifty run summary", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    rows = [
        ("steps", result.steps),
        ("samples", result.samples),
        ("tokens", result.tokens),
        ("initial val loss", result.initial_val_loss),
        ("final val loss", _final_val_loss(result)),
        ("final train loss", result.train_loss),
        ("tokens/s", result.tokens_per_second),
        ("samples/s", result.samples_per_second),
        ("MFU", None if result.mfu is None else f"{result.mfu:.1%}"),
        (
            "processes",
            f"{result.world_size} ({result.strategy})" if result.world_size > 1 else None,
        ),
        ("precision", result.precision),
        ("num_workers", result.num_workers),
        ("stop reason", result.stop_reason),
        ("wall seconds", _wall(result)),
        (
            "dollars",
            None if not result.cost else f"${result.cost['usd']:.4f} ({result.cost['pricing']})",
        ),
        ("guard", _guard_line(getattr(result, "guard", None))),
        ("run directory", result.run_dir),
    ]
    for name, value in rows:
        if name.startswith("token") and not result.tokens:
            continue  # not a token-based task
        if name in ("processes", "guard") and value is None:
            continue  # one process; nothing the guard did
        table.add_row(name, _fmt(value))
    Console().print(table)


def _final_val_loss(result: Any) -> float | str | None:
    """The val loss measured after training began; a run evaluated only before its first
    step says so, rather than repeating the initial loss as a final one."""
    if result.val_loss is None and result.initial_val_loss is not None:
        return "not measured (no evaluation after step 0)"
    return result.val_loss


def _wall(result: Any) -> str | float:
    """This attempt's wall seconds; a resumed run's say the training seconds of every attempt
    too, the figure its report shows."""
    kept = getattr(result, "training_seconds", None)
    if kept is None or kept <= result.wall_seconds + 0.5:
        return result.wall_seconds
    return f"{result.wall_seconds:,.4g} this attempt; {kept:,.4g} of training in all attempts"


def _guard_line(guard: dict[str, Any] | None) -> str | None:
    """What the guard did, in one cell: skipped steps, rollbacks, the forecast, the saving."""
    if not guard:
        return None
    parts = []
    if guard.get("skipped_steps"):
        parts.append(f"{guard['skipped_steps']} non-finite steps skipped")
    for r in guard.get("rollbacks") or []:
        usd = f", ${r['usd_lost']:.4f}" if r.get("usd_lost") is not None else ""
        parts.append(
            f"rolled back {r['from_step']} → {r['to_step']} ({r['steps_lost']} steps{usd})"
        )
    forecast = guard.get("forecast")
    if forecast and forecast.get("stopped"):
        parts.append(
            f"forecast {forecast['value']:.4g} (band {forecast['low']:.4g}–{forecast['high']:.4g}) "
            f"at step {forecast['at_step']} misses target {forecast['target']:.4g}"
        )
    saved = guard.get("saved")
    if saved:
        usd = f", ${saved['usd']:.4f}" if saved.get("usd") is not None else ""
        parts.append(f"{saved['by']} left {saved['steps_not_run']} steps unpaid{usd}")
    return "; ".join(parts) or None


def print_diagnosis(diagnosis: Any, result: Any = None) -> None:
    """Where the step time goes, what limits it, and what to change, in that order."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title="where each step's time goes", show_header=True)
    table.add_column("phase")
    table.add_column("share", justify="right")
    seconds = diagnosis.measured.seconds() if diagnosis.measured is not None else {}
    table.add_column("ms/step", justify="right")
    for phase, share in diagnosis.breakdown.items():
        table.add_row(
            phase.replace("_", " "), f"{share:.1%}", f"{seconds.get(phase, 0.0) * 1e3:.1f}"
        )
    console.print(table)
    mfu = "n/a" if diagnosis.mfu is None else f"{diagnosis.mfu:.1%}"
    console.print(f"[bold]bottleneck: {diagnosis.bottleneck}[/bold]  (MFU {mfu})")
    for line in diagnosis.evidence:
        console.print(escape(f"  • {line}"))
    if diagnosis.recommendations:
        console.print("[bold]recommendations[/bold] (data first, then memory, then compute):")
        for i, rec in enumerate(diagnosis.recommendations, 1):
            console.print(escape(f"  {i}. [{rec.area}] {rec.text} — expected: {rec.expected}"))
    if result is not None and result.cost:
        c = result.cost
        console.print(
            f"cost: {c['gpu_hours']:.4f} GPU-hours, ${c['usd']:.4f} at {c['pricing']} "
            f"(on-demand would have been ${c['on_demand_usd']:.4f})"
        )


@contextlib.contextmanager
def console_for_api(logger_name: str = "thrifty") -> Iterator[bool]:
    """While a Trainer is used from Python (a notebook, a script): if nobody has configured
    logging, show thrifty's lines as the command line does, and yield True so the caller
    prints the summary too. A caller that configured logging (or the command line) keeps
    its own setup and gets False."""
    from thrifty.redact import RedactingFilter

    logger = logging.getLogger(logger_name)
    if logger.hasHandlers():
        yield False
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("thrifty: %(message)s"))
    handler.addFilter(RedactingFilter())  # no credential in a notebook's output either
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield True
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def show_result(result: Any, diagnosis: Any, *, from_script: bool = False) -> None:
    """What a person sees when a run ends: the summary, the diagnosis, and how to resume.
    `from_script`: the run was trained from Python, so the stop line tells the script to end
    with the exit code (`thrifty train` exits with it itself)."""
    from thrifty.checkpointing.saving.saves import local_only_message

    print_summary(result)
    if diagnosis is not None:
        print_diagnosis(diagnosis, result)
    status = getattr(result, "checkpoint", None)
    if status and status.get("location") and not status.get("uploaded"):
        print(f"thrifty: warning: {local_only_message(status)}")
    if diagnosis is not None and diagnosis.busy:
        print(f"thrifty: warning: {diagnosis.busy}")
    line = stop_line(result, from_script=from_script)
    if line:
        print(f"thrifty: {line}")


def stop_line(result: Any, *, from_script: bool = False) -> str:
    """How a run that did not finish ended, and the exit code that tells a requeue wrapper
    what to do; `from_script`: the line a script ends with it. "" for a run that finished."""
    from thrifty.records.stop_signals import EXIT_PREEMPTED

    guard = getattr(result, "guard", None) or {}
    if result.stop_reason == StopReason.DIVERGED:
        what = (
            f"the run diverged: {guard.get('diverged')}; its newest checkpoint is the last "
            "good state"
        )
        code = 1
    elif result.stop_reason == StopReason.PREEMPTED:
        what = f"preempted at step {result.steps}; checkpoint saved"
        code = EXIT_PREEMPTED
    else:
        return ""
    if not from_script:
        resume = ", run the same command to resume" if code == EXIT_PREEMPTED else ""
        return f"{what}{resume} (exit code {code})"
    relaunch = (
        " so a requeue wrapper relaunches it, and run it again to resume"
        if code == EXIT_PREEMPTED
        else " so a requeue wrapper does not relaunch it"
    )
    return f"{what}: end the script with sys.exit(result.exit_code) (exit code {code}){relaunch}"


def log_checkpointing(policy: Any, blocks: list[str], held: dict[str, int]) -> None:
    """The blocks activation checkpointing recomputes and, as measured, the activation memory
    they free against what the repeated blocks hold and what each other policy would free."""
    if not blocks:
        return
    counted = f"{len(blocks)} block{'s' if len(blocks) != 1 else ''}"
    freed = sum(held.get(name, 0) for name in blocks)
    if not freed:
        logging.getLogger("thrifty").info(
            "activation checkpointing: %s (%s)", counted, ", ".join(blocks)
        )
        return
    others = ", ".join(
        f"{name} {fmt_bytes(size)}"
        for name, size in policy_savings(list(held), held).items()
        if name != policy
    )
    logging.getLogger("thrifty").info(
        "activation checkpointing: %s (%s) recompute what holds %s of the %s the repeated "
        "blocks save per micro-batch "
        "(measured; %s)",
        counted,
        ", ".join(blocks),
        fmt_bytes(freed),
        fmt_bytes(sum(held.values())),
        others,
    )


def log_setup(dist: Any, precision: Any, micro: int, accumulation: int) -> None:
    """The set-up's lines: processes, precision and why, the batch."""
    log = logging.getLogger("thrifty")
    if dist.enabled:
        log.info(dist.describe())
    log.info("precision: %s (%s)", precision.name, precision.reason)
    processes = f" × {dist.world_size} processes" if dist.enabled else ""
    log.info(
        "batch: micro %d × %d accumulation steps%s = effective %d",
        micro,
        accumulation,
        processes,
        micro * accumulation * dist.world_size,
    )
