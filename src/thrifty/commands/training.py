"""`thrifty demo` and `thrifty train`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from thrifty.console import add_config_options, add_output_options, add_set_option
from thrifty.lazy import load_torch
from thrifty.records.stop import StopReason

if TYPE_CHECKING:
    from collections.abc import Sequence

    from thrifty.callbacks import Callback
    from thrifty.records.stop_signals import StopSignals
    from thrifty.run.trainer import Trainer


def _common(parser: argparse.ArgumentParser) -> None:
    add_output_options(
        parser,
        out="run directory (run.out; default: runs/<run.name>)",
        overwrite="start over in a run directory that holds a run (run.overwrite)",
    )
    parser.add_argument(
        "--steps", type=int, metavar="N", help="optimizer steps to run (run.max_steps)"
    )
    parser.add_argument(
        "--resume",
        metavar="WHERE",
        help="auto (default: the newest valid checkpoint), never, or a checkpoint's path or URL "
        "(checkpoint.resume)",
    )
    parser.add_argument(
        "--allow-config-change",
        action="store_true",
        help="on a resume, apply changes to the learning rate, schedule, optimizer, seed, "
        "precision, batch or task instead of refusing them (run.allow_config_change)",
    )
    parser.add_argument(
        "--trace",
        metavar="DIR",
        help="write a torch.profiler trace of a few steps to DIR (measure.trace)",
    )
    parser.add_argument(
        "--nprocs",
        type=int,
        metavar="N",
        help="train with N processes on this machine (DDP by default; like torchrun "
        "--standalone --nproc_per_node N); for several machines launch with torchrun",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        metavar="X",
        help="the device's peak TFLOP/s for MFU (measure.peak_tflops)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="train a small byte-level GPT on the Python standard library's source",
        description="Train a small byte-level GPT from scratch on the Python standard library's "
        "own source files (no download) and print the run's summary.",
    )
    add_set_option(demo)
    _common(demo)
    demo.set_defaults(handler=run_demo, callbacks=())

    train = subparsers.add_parser(
        "train",
        help="train the model, data and optimizer a TOML config names",
        description="Train a model from a TOML config whose [task] names factories by import path.",
    )
    add_config_options(train)
    _common(train)
    # `callbacks`: what the command line's caller hands the Trainer (a trial's report to its
    # search, in its warm worker `thrifty.worker`); none from a terminal.
    train.set_defaults(handler=run_train, callbacks=())


def _overrides(args: argparse.Namespace) -> list[tuple[str, Any]]:
    from thrifty.config import parse_set_args

    pairs: list[tuple[str, Any]] = parse_set_args(args.overrides)
    if args.steps is not None:
        pairs.append(("run.max_steps", args.steps))
    if args.out is not None:
        pairs.append(("run.out", args.out))
    if args.overwrite:
        pairs.append(("run.overwrite", True))
    if args.resume is not None:
        pairs.append(("checkpoint.resume", args.resume))
    if args.allow_config_change:
        pairs.append(("run.allow_config_change", True))
    if args.trace is not None:
        pairs.append(("measure.trace", args.trace))
    if args.peak_tflops is not None:
        pairs.append(("measure.peak_tflops", args.peak_tflops))
    return pairs


def run_demo(args: argparse.Namespace) -> int:
    from thrifty.config import load_config
    from thrifty.demo import DEMO_CONFIG
    from thrifty.records.stop_signals import stopping

    with stopping() as stops:
        config = load_config(None, _overrides(args), base=DEMO_CONFIG)
        return _run(args, config, stops)


def run_train(args: argparse.Namespace) -> int:
    from thrifty.config import load_config
    from thrifty.records.stop_signals import stopping

    with stopping() as stops:  # the default stop signals until the config names its own
        config = load_config(args.config, _overrides(args))  # bad input fails here, once
        return _run(args, config, stops)


def _run(args: argparse.Namespace, config: Any, stops: StopSignals) -> int:
    """Train in this process, with `args.callbacks`, or launch `--nprocs` of them (each rank
    without them). A stop signal before the first step raises StopRequested (see
    `thrifty.records.stop_signals`), which the command line ends with exit code 75 and one
    line."""
    launching = _launching(args)
    stops.install(config.spot.signals)
    stops.check()
    _refuse_a_run_dir_in_use(config)
    if launching:
        with stops.interruptible():  # until the launcher's handlers replace ours
            return _launch(args, config)
    from thrifty.strategies.launcher import follow_launcher

    follow_launcher(config.spot.signals)  # a rank of --nprocs: it stops if the launcher dies
    load_torch()  # the compiler too, which the optimizer imports: not in a launcher
    return _train(config, stops, args.callbacks)


def _refuse_a_run_dir_in_use(config: Any) -> None:
    """A run directory another live job holds: said at once, before torch's compiler, the
    model and the data are loaded (and ranks started), not once training opens it. Rank 0
    asks: the others of its job would find rank 0 itself holding it."""
    from thrifty.checkpointing.saving.opening import run_dir_of
    from thrifty.rundir.lock import RunLock
    from thrifty.strategies.process_group import env_rank

    if env_rank() == 0:
        RunLock(run_dir_of(config)).refuse_if_in_use()


def _launching(args: argparse.Namespace) -> bool:
    if args.nprocs is not None and args.nprocs < 1:
        from thrifty.errors import ConfigError

        raise ConfigError(f"--nprocs {args.nprocs} is invalid: give 1 or more processes")
    return args.nprocs is not None and args.nprocs > 1


def _launch(args: argparse.Namespace, config: Any) -> int:
    from thrifty.strategies.launcher import launch

    config.batch.check_world_size(args.nprocs)  # here, not in each rank it would start
    return launch(
        args.nprocs,
        args.argv,
        signals=config.spot.signals,
        upload_deadline=config.checkpoint.upload_deadline_seconds,
    )


def _train(config: Any, stops: StopSignals, callbacks: Sequence[Callback] = ()) -> int:
    import logging
    import sys

    from thrifty.checkpointing.saving.rng import seed_everything
    from thrifty.records.stop_signals import EXIT_PREEMPTED
    from thrifty.redact import install_log_redaction
    from thrifty.reporting.end_of_run import show_result
    from thrifty.run.task import build_task
    from thrifty.strategies.process_group import env_rank

    # Only rank 0 speaks; the other ranks log errors alone, naming themselves. Other
    # libraries' information (botocore's "Found credentials in environment variables") is
    # not thrifty's to print: their warnings are.
    rank = env_rank()
    logging.basicConfig(
        level=logging.WARNING if rank == 0 else logging.ERROR,
        format="thrifty: %(message)s" if rank == 0 else f"thrifty: rank {rank}: %(message)s",
    )
    logging.getLogger("thrifty").setLevel(logging.INFO if rank == 0 else logging.ERROR)
    install_log_redaction()  # no credential reaches the terminal or a captured log
    with stops.interruptible():  # the user's factories, the model, the data: nothing written
        seed_everything(config.run.seed)
        task = build_task(config)
        trainer = task.trainer(config, callbacks=callbacks)
    with trainer:  # the ranks leave the process group together: a launcher sees one outcome
        trainer.from_script = False  # the command shows the result and exits with its code
        result = trainer.fit()
        if rank == 0:
            show_result(result, trainer.diagnosis)
    if result.stop_reason == StopReason.DIVERGED:
        return 1  # failed: restarting would diverge again; the last good checkpoint is kept
    if result.stop_reason == StopReason.PREEMPTED:
        return EXIT_PREEMPTED
    late = _late_stop(stops, trainer)
    if late and rank == 0:
        print(
            f"thrifty: {late} after the last step (step {result.steps}): the run is finished, "
            "nothing left to save (exit code 0)",
            file=sys.stderr,
        )
    return 0


def _late_stop(stops: StopSignals, trainer: Trainer) -> str:
    """A stop signal after the loop's last look ("received SIGTERM"), or "": the watcher's
    while the last checkpoint was finished, the command's while the outputs were written."""
    watcher = trainer.checkpointer.watcher
    if watcher is not None and watcher.requested:
        return watcher.reason
    return stops.reason
