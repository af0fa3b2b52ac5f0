"""Printing a run's summary for people."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


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
        ("final val loss", result.val_loss),
        ("final train loss", result.train_loss),
        ("tokens/s", result.tokens_per_second),
        ("samples/s", result.samples_per_second),
        ("precision", result.precision),
        ("num_workers", result.num_workers),
        ("stop reason", result.stop_reason),
        ("wall seconds", result.wall_seconds),
        ("run directory", result.run_dir),
    ]
    for name, value in rows:
        if name.startswith("token") and not result.tokens:
            continue  # not a token-based task
        table.add_row(name, _fmt(value))
    Console().print(table)
