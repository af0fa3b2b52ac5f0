"""The printed report of `thrifty chaos`: one row a kill, then the verdicts (`--json` prints
the report itself)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from thrifty.console import dash

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

COLUMNS = (
    "kill",
    "aimed at",
    "killed after",
    "last step logged",
    "resumed from",
    "steps lost",
    "cut short",
)


def print_report(report: Mapping[str, Any]) -> None:
    from rich.console import Console

    console = Console()
    ref = report["reference"]
    console.print(
        f"reference run: {ref['steps']} steps in {ref['wall_seconds']:.1f} s; a checkpoint every "
        f"{report['every']} steps; --seed {report['seed']}"
    )
    console.print(_kills_table(report))
    if report.get("finished_before_kill"):
        console.print(f"the run finished before kill {report['finished_before_kill']} could land")
    if report.get("effective_time"):
        console.print(effective_time_line(report["effective_time"]), soft_wrap=True)
    if "state" in report:
        _print_comparison(console, report)
    if report["failure"]:
        console.print(f"[bold red]failed:[/] {report['failure']}")
    tensors = report.get("state", {}).get("model", {}).get("compared")
    verdict = "[bold green]yes[/]" if report["weights_match"] else "[bold red]no[/]"
    console.print(
        f"final weights match bit for bit: {verdict}"
        + (f" ({tensors} tensors)" if report["weights_match"] and tensors else "")
    )


def _kills_table(report: Mapping[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title=f"thrifty chaos: {len(report['kills'])} of {report['kills_planned']} kills")
    for name in COLUMNS:
        text = name in ("aimed at", "cut short")
        table.add_column(name, justify="left" if text else "right", overflow="fold")
    for k in report["kills"]:
        resumed = dash(k["resumed"])
        if k["resumed"] is None and not report["failure"]:
            resumed = "[bold red]started over[/]"
        table.add_row(
            str(k["number"]),
            f"{k['kind']} {k['target']}",
            f"{k['moment']:.2f} s",
            dash(k["reached"]),
            resumed,
            dash(k["steps_lost"]),
            _cut_short(k),
        )
    return table


def _print_comparison(console: Console, report: Mapping[str, Any]) -> None:
    """Final step, losses, the rest of the training state, and which weights differ."""
    steps = report["final_step"]
    if steps["reference"] != steps["chaos"]:
        console.print(
            f"final checkpoint: [bold red]step {steps['chaos']}[/], the reference "
            f"ends at step {steps['reference']}"
        )
    first = report["first_loss_difference"]
    console.print(
        f"loss at every step: identical ({report['losses_compared']} steps)"
        if first is None
        else f"loss at every step: [bold red]differs[/], first at step {first}"
    )
    if report["diverged_before_first_resume"]:
        console.print(
            f"  step {first} comes before the first resume (step {report['kills'][0]['resumed']}"
            "): this config does not reproduce even without kills (random data or model "
            "set-up outside run.seed, or nondeterministic ops)"
        )
    rest = {k: v for k, v in report["state"].items() if k != "model"}
    differ = [
        f"{k} ({', '.join(v['differs'][:3])}"
        + (f" and {v['differ_count'] - 3} more" if v["differ_count"] > 3 else "")
        + ")"
        for k, v in rest.items()
        if not v["identical"]
    ]
    console.print(
        f"rest of the training state ({', '.join(rest)}): "
        + ("identical" if not differ else f"[bold red]differs[/] in {'; '.join(differ)}")
    )
    model = report["state"].get("model")
    if model and not model["identical"]:
        where = ", ".join(model["differs"][:5])
        more = model["differ_count"] - min(5, len(model["differs"]))
        console.print(f"weights that differ: {where}" + (f" and {more} more" if more else ""))


def _cut_short(kill: Mapping[str, Any]) -> str:
    parts = [f"save {s}" for s in kill["torn_saves"]]
    parts += [f"delete {s}" for s in kill["cut_deletions"]]
    return ", ".join(parts) or "-"


def effective_time_line(effective: Mapping[str, Any]) -> str:
    """'effective training time: 71% (12.3 s of steps in 17.3 s over 3 attempts, ...)'."""
    text = (
        f"effective training time: {_percent(effective['fraction'])} "
        f"({effective['useful_step_seconds']:.1f} s of steps in "
        f"{effective['wall_seconds']:.1f} s over {len(effective['attempt_seconds'])} attempts, "
        f"relaunches included; the reference run: {_percent(effective['reference_fraction'])})"
    )
    if effective["seconds_per_kill"] is not None:
        text += f"; each kill cost {effective['seconds_per_kill']:.1f} s"
    return text


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.0f}%"
