"""`thrifty launch` from parsed arguments to a submitted job: check the input, print the cost,
then print, write, or write and submit the engine's job file.

Every check runs before anything is printed or written, so bad input is one line and exit
code 2 with nothing left behind.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from thrifty.config import TrainConfig, load_config, parse_duration, parse_set_args
from thrifty.errors import ConfigError, ThriftyError
from thrifty.fleet import skypilot, slurm
from thrifty.fleet.cost import pick_instance
from thrifty.fleet.job import (
    FleetJob,
    check_bucket,
    check_storage,
    job_name,
    parse_gpus,
    relative_config,
    requirements_beside,
)

SUFFIX = {"skypilot": ".sky.yaml", "slurm": ".sbatch"}


def run(args: argparse.Namespace) -> int:
    """The whole command; returns its exit code (the engine's, once submitted)."""
    config = load_config(args.config, parse_set_args(args.overrides))
    job = build_job(args, config, Path.cwd())
    out = out_path(args)
    if not args.dry_run:
        _check_out(out, args.overwrite)
        if args.engine == "skypilot":
            skypilot.sky_executable()  # SkyPilot missing: the one line with its install
    print_cost(args, job, config)
    text = job_text(job, args.engine)
    if args.dry_run:
        print(f"\n--- {out} (not written: --dry-run) ---")
        sys.stdout.write(text)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if args.engine == "slurm":
        os.chmod(out, 0o755)
    return _submit(args.engine, out, job)


def build_job(args: argparse.Namespace, config: TrainConfig, cwd: Path) -> FleetJob:
    """The job from the command line and the config; raises one line for bad input."""
    from thrifty.plan.catalog import load_catalog

    catalog = load_catalog(config.cost.catalog)
    names = [gpu.name for gpu in catalog.gpus.values()]
    gpus = parse_gpus(args.gpus, names, catalog.gpu)
    if args.instance is not None:  # checked here, before the cost, which only prints
        pick_instance(catalog, gpus.name, gpus.per_node, args.instance)
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts {args.max_restarts} is invalid: give 0 or more")
    check_bucket(args.bucket, args.engine)
    check_storage(args.nodes, args.bucket or config.checkpoint.location, args.engine, args.spot)
    rel = relative_config(args.config, cwd)
    return FleetJob(
        name=job_name(config.run.name),
        config=rel,
        gpus=gpus,
        nodes=args.nodes,
        spot=args.spot,
        location=args.bucket,
        overrides=tuple(args.overrides),
        requirements=requirements_beside(rel, cwd),
        signals=tuple(config.spot.signals),
        upload_deadline=config.checkpoint.upload_deadline_seconds,
        max_restarts=args.max_restarts,
        time_limit=None if args.time is None else parse_duration(args.time, "--time"),
    )


def print_cost(args: argparse.Namespace, job: FleetJob, config: TrainConfig) -> None:
    """The planner's estimate for the job, before anything is submitted."""
    from thrifty.fleet.cost import cost_lines, fleet_cost, job_work

    work = job_work(
        config,
        job.nodes * job.gpus.per_node,
        params=args.params,
        tokens=args.tokens,
        seq=args.seq,
    )
    try:
        cost = fleet_cost(
            config,
            work,
            gpu=job.gpus.name,
            per_node=job.gpus.per_node,
            nodes=job.nodes,
            instance=args.instance,
            mfu=args.mfu,
        )
    except ThriftyError as exc:  # a figure the planner refuses: the job may still run
        print(f"Cost: no estimate ({exc})")
        return
    print("\n".join(cost_lines(cost)))


def job_text(job: FleetJob, engine: str) -> str:
    """The engine's job file."""
    if engine == "slurm":
        return slurm.sbatch_script(job)
    from thrifty import __version__

    return skypilot.task_yaml(job, version=__version__, exit_codes=skypilot.exit_codes_supported())


def out_path(args: argparse.Namespace) -> Path:
    """--out, or `<config>.sky.yaml` / `<config>.sbatch` beside the config."""
    if args.out is not None:
        return Path(args.out)
    config = Path(args.config)
    return config.with_name(config.stem + SUFFIX[args.engine])


def _check_out(out: Path, overwrite: bool) -> None:
    if out.is_dir():
        raise ThriftyError(f"--out {out} is a directory: give a file")
    if out.exists() and not overwrite:
        raise ThriftyError(f"{out} exists: give --overwrite to replace it, or another --out")


def _submit(engine: str, out: Path, job: FleetJob) -> int:
    if engine == "skypilot":
        print(f"wrote {out}; submitting: {skypilot.submit_hint(out, job)}", flush=True)
        return skypilot.submit(out, job)
    sbatch = slurm.sbatch_executable()
    if sbatch is None:
        print(
            f"wrote {out}; no sbatch here: submit it on the cluster with {slurm.submit_hint(out)}"
        )
        return 0
    print(f"wrote {out}; submitting: {slurm.submit_hint(out)}", flush=True)
    return slurm.submit(out, sbatch)
