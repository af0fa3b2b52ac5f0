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
    show.print(compute_line(c))


def compute_line(c: dict[str, Any]) -> str:
    """What the sweep's trials paid against what an unpruned sweep would have paid (every
    trial once to its end, in a process of its own: one start-up each), and the difference:
    "pruning saved N%", or "pruning cost N% more" when it paid more."""
    paid = f"compute: {c['seconds']:,.1f} s of trials"
    if c.get("sessions") is not None and c.get("startup_seconds") is not None:
        paid += f" in {c['sessions']} sessions ({c['startup_seconds']:,.1f} s of start-ups)"
    line = (
        f"{paid}; every trial once to its end, one start-up each, would have taken "
        f"{c['unpruned_seconds']:,.1f} s ({saving(c['seconds'], c['unpruned_seconds'])})"
    )
    if c["cost"] is not None:
        line += f"; ${c['cost']:,.4f}, unpruned ${c['unpruned_cost']:,.4f}"
    if c.get("estimated_trials"):
        line += (
            f"; {c['estimated_trials']} trial(s) without measured sessions counted at their "
            "step time, evaluations left out"
        )
    return line


def saving(paid: float, unpruned: float) -> str:
    """ "pruning saved 16%", or "pruning cost 25% more" when `paid` exceeds `unpruned`."""
    if not unpruned or paid <= unpruned:
        return f"pruning saved {1 - paid / unpruned if unpruned else 0.0:.0%}"
    return f"pruning cost {paid / unpruned - 1:.0%} more"
