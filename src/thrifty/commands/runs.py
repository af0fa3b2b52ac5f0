"""`thrifty runs`: the team's ledger, one row a job, its dollars summed across relaunches.

Registering only builds the parser; the handler imports the ledger when it runs.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from thrifty.console import add_output_options
from thrifty.errors import ThriftyError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `runs` to the `thrifty` command line."""
    parser = subparsers.add_parser(
        "runs",
        help="the ledger of your runs: dollars, work thrown away, savings, checkpoint storage",
        description="Find every thrifty run under the folders given (a sweep's or a tune's "
        "trials under it) and print one row a job: start, state, steps, wall time, GPU-hours, "
        "dollars as it ran (every relaunch and resume included), the work preemptions threw "
        "away, what a stop before the budget saved, what a tune's levers saved, and the bytes "
        "its checkpoints keep with their price a month. Run directories of one job on several "
        "machines (they share a checkpoint location) are one row. A bucket prefix "
        "(s3://BUCKET/PREFIX, gs://...) adds the checkpoint locations under it; only their "
        "listing, manifests and lease are read.",
    )
    parser.add_argument(
        "paths", nargs="*", default=["runs"], metavar="DIR",
        help="folders holding runs, or bucket prefixes (default: runs/)",
    )  # fmt: skip
    parser.add_argument("--by", choices=("month", "config", "sweep"), help="totals by group")
    parser.add_argument(
        "--since", metavar="DATE", help="only runs started on or after DATE (YYYY-MM-DD, UTC)"
    )
    parser.add_argument(
        "--case-study",
        action="store_true",
        help="lay the runs out as the seeds' case study: runs a year, hours per run, price "
        "per hour, each lever's share of the saving beside the article's",
    )
    parser.add_argument(
        "--lifecycle",
        type=int,
        metavar="DAYS",
        help="write each bucket's lifecycle rule (S3 and GCS formats) that keeps the newest "
        "checkpoints and the final one and expires the superseded ones DAYS days after they "
        "were written",
    )
    parser.add_argument(
        "--catalog", metavar="FILE", help="a catalog file adding to the built-in prices"
    )
    parser.add_argument(
        "--instance",
        metavar="NAME",
        help="the catalog instance to weigh on-demand, spot and 1-/3-year commitments on for "
        "the runs' GPU-hours a month (default: the [cost] instance most of them ran on)",
    )
    add_output_options(
        parser,
        out="with --lifecycle: the folder to write BUCKET.s3-lifecycle.json or "
        "BUCKET.gcs-lifecycle.json in (default: print them)",
        overwrite="replace a lifecycle file thrifty wrote there before",
        json="print the ledger as JSON",
    )
    parser.set_defaults(handler=run_runs_command)


def parse_since(text: str | None) -> datetime | None:
    """--since as a UTC midnight; a malformed date is one line naming the form."""
    if text is None:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    except ValueError:
        raise ThriftyError(f"--since {text!r} is invalid: give a date as YYYY-MM-DD") from None


def run_runs_command(args: argparse.Namespace) -> int:
    """Print the ledger (or its JSON); with --lifecycle, the bucket rules too."""
    from thrifty.console import console, to_json
    from thrifty.ledger.book import read_ledger
    from thrifty.ledger.case_study import case_study
    from thrifty.ledger.groups import grouped
    from thrifty.plan.catalog import load_catalog

    if args.lifecycle is not None and args.lifecycle < 1:
        raise ThriftyError(
            f"--lifecycle {args.lifecycle} is invalid: give a whole number of days, 1 or more"
        )
    catalog = load_catalog(args.catalog)
    ledger = read_ledger(args.paths, since=parse_since(args.since), catalog=catalog)
    _say_skipped(ledger)
    groups = grouped(ledger.jobs, args.by) if args.by else []
    study = case_study(ledger.jobs) if args.case_study else None
    article = _article() if args.case_study else None
    lifecycle = _lifecycle(ledger, args) if args.lifecycle is not None else []
    commitment = monthly_commitment(ledger.jobs, catalog, args.instance)
    if args.json:
        data = _as_json(ledger, groups, study, article, lifecycle)
        data["commitment"] = commitment
        print(to_json(data))
        return 0
    from thrifty.ledger.tables import WIDTH

    out = console()
    if not out.is_terminal:
        out.width = WIDTH
    _print(out, ledger, groups, study, article, lifecycle)
    if commitment is not None:
        out.print(commitment["line"], markup=False, soft_wrap=True)
    return 0


def monthly_commitment(jobs: list, catalog: Any, instance: str | None) -> dict[str, Any] | None:
    """Which pricing pays least for the runs' GPU-hours a month: on-demand, spot with its
    expected interruptions (the 5-10% advisor bucket, jobs as long as the runs' mean), or a
    1- or 3-year commitment on `instance` (default: the [cost] instance most GPU-hours ran
    on). None without runs; a line saying what is missing when no instance is known."""
    from thrifty.plan.commitment import commitment_plan
    from thrifty.plan.spot import interruption_rate
    from thrifty.plan.tables import commitment_lines

    timed = [j for j in jobs if j.gpu_hours > 0]
    if not timed:
        return None
    months = _months(timed)
    gpu_hours = sum(j.gpu_hours for j in timed) / months
    name = instance or _usual_instance(timed)
    amount = f"{gpu_hours:,.1f}" if gpu_hours >= 10 else f"{gpu_hours:.3g}"
    head = f"commitment: {amount} GPU-hours a month ({months} month{'s' if months > 1 else ''})"
    if name is None:
        return {"gpu_hours_per_month": gpu_hours, "months": months, "instance": None,
                "line": f"{head}: give --instance NAME to weigh on-demand, spot and 1-/3-year "
                "commitments for them"}  # fmt: skip
    found = catalog.instance(name)
    if not found.commitments():
        return {"gpu_hours_per_month": gpu_hours, "months": months, "instance": found.name,
                "line": f"{head}: {found.name} has no committed price in the catalog; give "
                "--instance with one (see 'thrifty prices --instances')"}  # fmt: skip
    mean_hours = sum(j.seconds for j in timed) / len(timed) / 3600
    plan = commitment_plan(
        found,
        rate_per_hour=interruption_rate(advisor_bucket="5-10%"),
        job_hours=max(mean_hours, 1 / 60),
        instance_hours_per_month=gpu_hours / found.gpu_count,
    )
    usage = plan.usage
    assert usage is not None  # given instance-hours
    line = f"{head} on {found.name}: {commitment_lines(plan)[-1]}"
    if found.spot_per_hour is not None:
        line += " (spot at the 5-10% advisor bucket)"
    cheapest = usage.cheapest
    return {"gpu_hours_per_month": gpu_hours, "months": months, "instance": found.name,
            "cheapest": cheapest, "monthly_usd": usage.monthly_usd,
            "utilisation": usage.utilisation, "committed_instances": usage.committed_instances,
            "plan": plan.as_dict(), "line": line}  # fmt: skip


def _months(jobs: list) -> int:
    """Calendar months from the first run's start to the last's, both counted."""
    starts = [j.started for j in jobs]
    first, last = min(starts), max(starts)
    return (last.year - first.year) * 12 + last.month - first.month + 1


def _usual_instance(jobs: list) -> str | None:
    """The [cost] instance that most of the GPU-hours ran on, if any did."""
    hours: dict[str, float] = {}
    for job in jobs:
        cost = job.last.config.get("cost")
        name = cost.get("instance") if isinstance(cost, dict) else None
        if isinstance(name, str) and name:
            hours[name] = hours.get(name, 0.0) + job.gpu_hours
    return max(hours, key=hours.__getitem__) if hours else None


def _say_skipped(ledger: Any) -> None:
    from thrifty.console import say

    for line in ledger.skipped:
        say("runs", line)
    for line in ledger.notes:
        say("runs", line)


def _article() -> Any:
    """The article's own levers per year ($905,952 -> $168,149), for the shares beside ours."""
    from thrifty.commands.plan.case_study import case_study as article_study

    return article_study().article_levers


def _as_json(ledger: Any, groups: list, study: Any, article: Any, lifecycle: list) -> dict:
    from thrifty.ledger.groups import job_dict, total

    return {
        "runs": [job_dict(j) for j in ledger.jobs],
        "groups": [g.to_dict() for g in groups],
        "total": total("total", ledger.jobs).to_dict(),
        "case_study": None if study is None else study.to_dict(),
        "article": None if article is None else article.as_dict(),
        "lifecycle": lifecycle,
        "storage_prices": {k: v.dated_source for k, v in ledger.storage_prices.items()},
        "skipped": ledger.skipped,
        "notes": ledger.notes,
    }


def _print(out: Any, ledger: Any, groups: list, study: Any, article: Any, lifecycle: list) -> None:
    from thrifty.ledger.tables import case_lines, case_table, runs_table, storage_lines

    out.print(runs_table(ledger.jobs, groups))
    for line in storage_lines(ledger):
        out.print(line, markup=False, soft_wrap=True)
    if study is not None:
        out.print(case_table(study, article))
        for line in case_lines(study, article):
            out.print(line, markup=False, soft_wrap=True)
    elif article is not None:
        out.print("case study: no run has a price ([cost]): nothing to lay out", markup=False)
    for item in lifecycle:
        out.print(item["summary"], markup=False, soft_wrap=True)
        if item.get("file") is None:
            out.print(item["text"], markup=False, soft_wrap=True)


def _lifecycle(ledger: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each bucket's rules: written to --out, or kept to print."""
    from thrifty.console import to_json
    from thrifty.ledger.lifecycle import apply_command, configuration, plan
    from thrifty.ledger.tables import fmt_bytes

    plans = plan(list(ledger.locations.values()), args.lifecycle)
    if not plans:
        raise ThriftyError(
            "--lifecycle: none of these runs keeps its checkpoints in a bucket (s3://, gs://): "
            "a local disk has no lifecycle rules"
        )
    items = []
    for p in plans:
        text = to_json(configuration(p))
        kind = "gcs" if p.protocol == "gs" else "s3"
        file = (
            _write(Path(args.out), f"{p.bucket}.{kind}-lifecycle.json", text, args.overwrite)
            if args.out
            else None
        )
        summary = (
            f"{p.protocol}://{p.bucket}: {len(p.expire)} superseded checkpoint folder(s) "
            f"({fmt_bytes(p.expire_bytes)}) expire {p.days} days after they were written; "
            f"{len(p.keep)} kept ({fmt_bytes(p.keep_bytes)}): apply with "
            f"{apply_command(p, str(file) if file else 'FILE')}"
        )
        items.append({"bucket": p.bucket, "protocol": p.protocol, "file": str(file) if file else None,
                      "summary": summary, "text": text, "configuration": configuration(p)})  # fmt: skip
    return items


def _write(out: Path, name: str, text: str, overwrite: bool) -> Path:
    """Write a lifecycle file into --out: a file already there is replaced only with
    --overwrite, and only when thrifty wrote it (its rules are thrifty's)."""
    from thrifty.console import prepare_out, refuse_file

    refuse_file(out)
    target = out / name
    if target.exists():
        if not _own_lifecycle(target):
            raise ThriftyError(
                f"{target} exists and thrifty did not write it: it is never replaced; move it "
                "away or give another --out"
            )
        if not overwrite:
            raise ThriftyError(f"{target} exists: give --overwrite to replace it, or another --out")
    prepare_out(out)
    target.write_text(text + "\n", encoding="utf-8")
    return target


def _own_lifecycle(path: Path) -> bool:
    """A lifecycle file `thrifty runs` wrote: S3 rules whose IDs are thrifty's, or GCS rules
    that each name the prefixes they match."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict):
        return False
    rules = data.get("Rules")
    if isinstance(rules, list):
        return all(
            isinstance(r, dict) and str(r.get("ID", "")).startswith("thrifty-") for r in rules
        )
    gcs = data.get("lifecycle", {}).get("rule") if isinstance(data.get("lifecycle"), dict) else None
    return isinstance(gcs, list) and all(
        isinstance(r, dict) and "matchesPrefix" in r.get("condition", {}) for r in gcs
    )
