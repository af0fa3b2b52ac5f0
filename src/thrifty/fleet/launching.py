"""`thrifty launch` from its `LaunchRequest` to a submitted job: check the input, print the
cost, then print, write, or write and submit the engine's job file.

Every check runs before anything is printed or written, so bad input is one line and exit
code 2 with nothing left behind.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from thrifty.config import TrainConfig, load_config, parse_duration, parse_set_args
from thrifty.errors import ConfigError, ThriftyError
from thrifty.fleet import skypilot, slurm, wheel
from thrifty.fleet.cost import pick_instance
from thrifty.fleet.files import check_job_file, write_atomic
from thrifty.fleet.job import (
    FleetJob,
    SweepJob,
    check_bucket,
    check_storage,
    job_name,
    parse_gpus,
    relative_config,
    requirements_beside,
    storage_extra,
)
from thrifty.fleet.request import LaunchRequest
from thrifty.redact import redact_text

SUFFIX = {"skypilot": ".sky.yaml", "slurm": ".sbatch"}


def run(request: LaunchRequest) -> int:
    """The whole command; returns its exit code (the engine's, once submitted)."""
    config = load_config(request.config, parse_set_args(request.overrides))
    cwd = Path.cwd()
    job = build_job(request, config, cwd)
    out = out_path(request)
    if not request.dry_run:
        check_job_file(out, request.overwrite)
        if request.engine == "skypilot":
            skypilot.sky_executable()  # SkyPilot missing: the one line with its install
            wheel.check_ship(cwd)
    text = job_text(job, request.engine)
    if not request.dry_run and request.engine == "skypilot":
        _ship(cwd)
    print_cost(request, job, config)
    if request.dry_run:
        print(f"\n--- {out} (not written: --dry-run) ---")
        sys.stdout.write(text)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text.encode(), 0o755 if request.engine == "slurm" else 0o644)
    return _submit(request.engine, out, job)


def build_job(request: LaunchRequest, config: TrainConfig, cwd: Path) -> FleetJob:
    """The job from the request and the config; raises one line for bad input."""
    from thrifty.plan.catalog import load_catalog

    catalog = load_catalog(config.cost.catalog)
    names = [gpu.name for gpu in catalog.gpus.values()]
    gpus = parse_gpus(request.gpus, names, catalog.gpu)
    if request.cost.instance is not None:  # checked here, before the cost, which only prints
        pick_instance(catalog, gpus.name, gpus.per_node, request.cost.instance)
    if request.max_restarts < 0:
        raise ConfigError(f"--max-restarts {request.max_restarts} is invalid: give 0 or more")
    rel = relative_config(request.config, cwd)
    sweep = sweep_job(request, config, cwd)
    check_bucket(request.bucket, request.engine)
    # A sweep's nodes share only the study: one that dies leaves its trials to the others,
    # which resume them from a bucket and start them again without one. A SkyPilot spot
    # relaunch is always a new machine: its trials' saves must be in a bucket.
    nodes = 1 if sweep is not None else request.nodes
    check_storage(nodes, request.bucket or config.checkpoint.location, request.engine, request.spot)
    workers = config.data.num_workers
    return FleetJob(
        name=job_name(config.run.name),
        config=rel,
        gpus=gpus,
        nodes=request.nodes,
        spot=request.spot,
        location=request.bucket,
        overrides=request.overrides,
        requirements=requirements_beside(rel, cwd),
        signals=tuple(config.spot.signals),
        upload_deadline=config.checkpoint.upload_deadline_seconds,
        max_restarts=request.max_restarts,
        time_limit=None if request.time is None else parse_duration(request.time, "--time"),
        storage_extra=storage_extra(request.bucket or config.checkpoint.location),
        loader_workers=None if workers == "auto" else int(workers),
        sweep=sweep,
    )


def sweep_job(request: LaunchRequest, config: TrainConfig, cwd: Path) -> SweepJob | None:
    """`--sweep SPACE.toml`: one sweep worker per node (None without it). With --bucket each
    trial checkpoints to a folder of its own there (`thrifty.search.sweep.trial`); more than one
    node needs --storage, the study they share."""
    given = request.sweep
    if given is None:
        if request.storage or request.study:
            raise ConfigError("--storage and --study are a sweep's: give --sweep SPACE.toml too")
        return None
    if not Path(given).is_file():
        raise ConfigError(f"--sweep {given}: no such file; give the sweep's SPACE.toml")
    if request.nodes > 1 and not request.storage:
        raise ConfigError(
            f"--nodes {request.nodes} with --sweep needs --storage URL: the study the nodes share "
            "(e.g. postgresql://user:pass@host/db); without it each node would sweep alone"
        )
    study = check_study_name(request.study, config.run.name)
    return SweepJob(
        space=relative_config(given, cwd),
        storage=request.storage,
        study=study,
        out=f"runs/sweep-{study}",
    )


# A study's name is one folder's on every node (`runs/sweep-NAME`): letters, digits, `.`, `_`
# and `-`, not starting with `-` (an option to the node's parser) and not `.` or `..`.
STUDY_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]{0,127}")


def check_study_name(given: str | None, run_name: str) -> str:
    """The sweep's study name (--study, else run.name), refused in one line unless it is one
    plain path component: it names every node's output folder, before any machine is paid for."""
    name = given if given is not None else run_name
    what = f"--study {name!r}" if given is not None else f"run.name {name!r} (the study's name)"
    if not STUDY_NAME.fullmatch(name) or name.strip(".") == "":
        fix = "give --study NAME" if given is None else "give another --study"
        raise ConfigError(
            f"{what} is invalid for --sweep: it names each node's folder runs/sweep-NAME, so "
            "it must be 1 to 128 letters, digits, '.', '_' or '-', not starting with '-' and "
            f"not '.' or '..'; {fix}"
        )
    return name


def print_cost(request: LaunchRequest, job: FleetJob, config: TrainConfig) -> None:
    """The planner's estimate for the job, before anything is submitted."""
    from thrifty.fleet.cost import cost_lines, fleet_cost, job_work

    work = job_work(
        config,
        job.nodes * job.gpus.per_node,
        params=request.cost.params,
        tokens=request.cost.tokens,
        seq=request.cost.seq,
    )
    try:
        cost = fleet_cost(
            config,
            work,
            gpu=job.gpus.name,
            per_node=job.gpus.per_node,
            nodes=job.nodes,
            instance=request.cost.instance,
            mfu=request.cost.mfu,
        )
    except ThriftyError as exc:  # a figure the planner refuses: the job may still run
        print(f"Cost: no estimate ({redact_text(str(exc))})")
        return
    print("\n".join(cost_lines(cost)))


def job_text(job: FleetJob, engine: str) -> str:
    """The engine's job file."""
    if engine == "slurm":
        from thrifty import __version__

        return slurm.sbatch_script(job, version=__version__)
    return skypilot.task_yaml(
        job,
        wheel=wheel.wheel_path(wheel.running_version()),
        exit_codes=skypilot.exit_codes_supported(),
        secrets=skypilot.secrets_supported(),
    )


def out_path(request: LaunchRequest) -> Path:
    """--out, or `<config>.sky.yaml` / `<config>.sbatch` beside the config."""
    if request.out is not None:
        return Path(request.out)
    config = Path(request.config)
    return config.with_name(config.stem + SUFFIX[request.engine])


def _ship(cwd: Path) -> None:
    """Write the thrifty wheel the task installs, and make sure SkyPilot uploads it: a wheel
    its workdir upload leaves out would fail the job's setup on a machine already paid for."""
    shipped, created = wheel.ship(cwd)
    excluded = skypilot.excluded_from_upload(cwd, shipped)
    if excluded is None:
        return
    (cwd / shipped).unlink()
    if created:
        shutil.rmtree(cwd / wheel.FOLDER)
    raise ThriftyError(
        f"{shipped}, the thrifty the job installs, would not be uploaded: {excluded} leaves "
        f"it out of SkyPilot's workdir; keep {wheel.FOLDER}/ out of that file (SkyPilot "
        "reads .skyignore instead of .gitignore when there is one)"
    )


def _submit(engine: str, out: Path, job: FleetJob) -> int:
    if engine == "skypilot":
        print(f"wrote {out}; submitting: {skypilot.submit_hint(out, job)}", flush=True)
        return skypilot.submit(out, job)
    sbatch = slurm.sbatch_executable()
    passed = job.passed()
    if sbatch is None:
        needs = f" ({', '.join(p.name for p in passed)} set there)" if passed else ""
        print(
            f"wrote {out}; no sbatch here: submit it on the cluster with "
            f"{slurm.submit_hint(out)}{needs}"
        )
        return 0
    print(f"wrote {out}; submitting: {slurm.submit_hint(out)}", flush=True)
    return slurm.submit(out, sbatch, {p.name: p.value for p in passed})
