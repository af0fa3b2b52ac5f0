"""The sweep's table on the console: every trial, the best, compute and dollars."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from thrifty.console import Table, console, dash


def _num(value: Any, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={_num(v) if isinstance(v, float) else v}" for k, v in params.items())


def print_table(record: dict[str, Any], out: Path) -> None:
    """Print `record` (sweep.json) as a table, then the best trial and what pruning saved."""
    table = Table(title=f"thrifty sweep: {dash(record['study'])}")
    for name in ("trial", "state", "loss", "steps", "seconds", "USD", "parameters", "why"):
        table.add_column(
            name, justify="right" if name in ("loss", "steps", "seconds", "USD") else "left"
        )
    for t in record["trials"]:
        why = (t.get("pruned") or {}).get("reason") or t.get("error") or ""
        table.add_row(
            str(t["number"]),
            dash(t["state"]),
            _num(t["value"]),
            dash(t["steps"]),
            _num(t["seconds"], ".1f"),
            _num(t["cost"], ".4f"),
            dash(_params(t["params"])),
            dash(why),
        )
    show = console()
    show.print(table)
    c, best = record["compute"], record["best"]
    if best is not None:
        show.print(
            f"best: trial {best['number']}, loss {best['value']:.6g} "
            f"({dash(_params(best['params']))}); "
            f"`thrifty train {dash(shlex.quote(str(out / 'best.toml')))}` runs it",
            soft_wrap=True,  # the command whole on its line, to copy
        )
    saved = c["saved_seconds"] / c["unpruned_seconds"] if c["unpruned_seconds"] else 0.0
    line = (
        f"compute: {c['seconds']:,.1f} s of trials; every trial to its end would have taken "
        f"{c['unpruned_seconds']:,.1f} s (pruning saved {saved:.0%})"
    )
    if c["cost"] is not None:
        line += f"; ${c['cost']:,.4f}, unpruned ${c['unpruned_cost']:,.4f}"
    show.print(line)
