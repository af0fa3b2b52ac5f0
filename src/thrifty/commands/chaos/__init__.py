"""`thrifty chaos`: SIGKILL a training job at random moments, resume it after each kill, and check
that it ends with the same bits as a run that was never interrupted; and say what the kills cost
in time (the effective training time: its steps' time over the wall time of all its attempts).

Both runs train the same resolved config (`<out>/config.toml`) in child processes
(`python -m thrifty train`), so a kill is what a reclaimed spot machine does: no signal handler,
no emergency save, the process and its data-loader workers gone mid-instruction.

How the kill moments are chosen (reproducible with `--seed`, in steps, not in seconds):

* the steps after the first checkpoint (`every + 1` .. the reference run's last step − 1) are cut
  into K equal spans, and each kill aims at a random step of its own span, so kills spread over
  the run and every kill has a published checkpoint to come back to;
* half the kills (rounded up, at random) aim at a *save*: a multiple of `--every` in their span.
  Once the step before it is logged, the folder of that checkpoint is polled every 0.5 ms; as
  soon as it holds files written by this attempt but no manifest yet (the background write is
  under way), the job is killed after a random delay of up to half the save time observed so far
  in this run. A save quicker than the poll is caught just after it, instead;
* the other kills aim at a step: once the step is logged, the job is killed after a random
  delay of up to one median step time (measured in the reference run), i.e. somewhere inside
  the next step.

After each kill, a checkpoint folder that the killed process wrote to and that has no manifest
is reported as cut short: a torn save (above the newest published checkpoint) or a half-done
deletion of an old one (below it; the manifest is deleted first). Readers must ignore both.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from thrifty.children import Children
from thrifty.commands.chaos.compare import compare_states
from thrifty.commands.chaos.kills import Kill, plan_kills
from thrifty.commands.chaos.report import print_report
from thrifty.commands.chaos.runner import Attempt, run_both
from thrifty.console import add_config_options, add_output_options, prepare_out, refuse_file
from thrifty.errors import ThriftyError

__all__ = [
    "Attempt",
    "Kill",
    "compare_states",
    "plan_kills",
    "print_report",
    "register",
    "run_chaos",
]

EXIT_MATCH = 0
EXIT_MISMATCH = 1
DEFAULT_KILLS = 3
DEFAULT_EVERY = 5
OUR_FILES = ("config.toml", "chaos.json", "reference", "chaos", "reference.log")  # + chaos-N.log


def register(subparsers: argparse._SubParsersAction) -> None:
    chaos = subparsers.add_parser(
        "chaos",
        help="SIGKILL a training job at random moments, resume it, and check the final weights "
        "bit for bit against an uninterrupted run",
        description="Train CONFIG once without interruption, then again while SIGKILLing it "
        "--kills times at random moments (some during checkpoint saves) and resuming after "
        "each kill; print the steps each kill lost, the effective training time (the useful "
        "steps' time over the wall time, relaunches included) and whether the final weights "
        "match the uninterrupted run bit for bit. Exit codes: 0 identical, 1 different (or the "
        "interrupted run failed to resume), 2 bad input.",
    )
    for flag, default, metavar, text in (
        ("--kills", DEFAULT_KILLS, "K", "how many times to SIGKILL the job"),
        ("--every", DEFAULT_EVERY, "N", "checkpoint every N steps in both runs"),
        ("--seed", 0, "S", "seed for choosing the kill moments"),
    ):
        chaos.add_argument(
            flag, type=int, default=default, metavar=metavar, help=f"{text} (default {default})"
        )
    chaos.add_argument("--steps", type=int, metavar="N", help="optimizer steps (run.max_steps)")
    add_config_options(chaos)
    add_output_options(
        chaos,
        out="where both runs go (default runs/chaos-<run.name>)",
        overwrite="replace the runs of an earlier chaos in --out",
        json=True,
    )
    chaos.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="the longest one training process may run (default: 1 h for the "
        "reference run; 3 × its wall time + 60 s for each resumed attempt)",
    )
    chaos.set_defaults(handler=run_chaos)


def run_chaos(args: argparse.Namespace) -> int:
    """The handler: exit 0 when the killed run ends with the reference's bits, else 1."""
    from thrifty.config import dump_toml
    from thrifty.rundir.files import write_json

    _check_args(args)
    out = Path(args.out) if args.out else None
    config, dropped = _resolve_config(args)
    out = out or Path("runs") / f"chaos-{config['run'].get('name', 'run')}"
    _prepare_out(out, args.overwrite)
    config_path = out / "config.toml"
    config_path.write_text(dump_toml(config))
    children = Children()
    try:
        report = run_both(args, out, config_path, children, dropped)
    finally:
        children.kill_all()
    write_json(out / "chaos.json", report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return EXIT_MATCH if report["match"] else EXIT_MISMATCH


def _check_args(args: argparse.Namespace) -> None:
    if args.kills < 1:
        raise ThriftyError(f"--kills {args.kills} is invalid: give 1 or more")
    if args.every < 1:
        raise ThriftyError(f"--every {args.every} is invalid: give a number of steps, 1 or more")
    if args.steps is not None and args.steps < 1:
        raise ThriftyError(f"--steps {args.steps} is invalid: give 1 or more")
    if args.timeout is not None and not args.timeout > 0:
        raise ThriftyError(f"--timeout {args.timeout:g} is invalid: give seconds, more than 0")
    if not hasattr(os, "killpg"):
        raise ThriftyError("thrifty chaos needs POSIX signals (SIGKILL): run it on Linux or macOS")


def _resolve_config(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """The user's config and --set values, plus what chaos needs; and what it had to drop."""
    from thrifty.config import TrainConfig, load_config, parse_set_args

    pairs: list[tuple[str, Any]] = list(parse_set_args(args.overrides))
    if args.steps is not None:
        pairs.append(("run.max_steps", args.steps))
    data = load_config(args.config, pairs).to_dict(secrets=False)
    dropped = []
    run = data["run"]
    for key in ("out", "overwrite"):
        run.pop(key, None)
    if run.pop("max_time", None) is not None:
        dropped.append("run.max_time (a wall-clock budget ends two runs at different steps)")
    if all(run.get(k) is None for k in ("max_steps", "max_tokens", "max_epochs")):
        raise ThriftyError(
            "thrifty chaos needs a budget that ends both runs at the same step: set "
            "run.max_steps (or --steps), run.max_tokens or run.max_epochs"
            + ("; run.max_time is a wall-clock budget and is not used" if dropped else "")
        )
    run.update(deterministic=True, log_every=1, progress="off")
    ckpt = data["checkpoint"]
    for key in ("location", "local_dir"):
        if ckpt.pop(key, None) is not None:
            dropped.append(f"checkpoint.{key} (chaos checkpoints to each run's own directory)")
    if ckpt.get("resume", "auto") != "auto":
        dropped.append(f"checkpoint.resume = {ckpt['resume']!r} (chaos resumes automatically)")
    ckpt.update(every=args.every, resume="auto", storage_options={})
    data["spot"] = {"provider": "none"}
    TrainConfig.from_dict(data)  # still valid
    return data, dropped


def _prepare_out(out: Path, overwrite: bool) -> None:
    """Refuse a non-empty --out unless --overwrite, which deletes only what chaos wrote."""
    refuse_file(out)
    entries = list(out.iterdir()) if out.is_dir() else []
    if entries and not overwrite:
        raise ThriftyError(
            f"--out {out} is not empty: choose another --out, or replace its runs with --overwrite"
        )
    prepare_out(out, [entry for entry in entries if _ours(entry.name)])


def _ours(name: str) -> bool:
    return name in OUR_FILES or (name.startswith("chaos-") and name.endswith(".log"))
