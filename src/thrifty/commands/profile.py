"""`thrifty profile`: a short run, classified into its bottleneck, with what to change."""

from __future__ import annotations

import argparse
import json
import tempfile

from thrifty.console import add_config_options, add_output_options


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="run a few steps and name the bottleneck, with ordered recommendations",
        description="Run a short job (the demo by default) with full instrumentation and print "
        "where each step's time goes, the bottleneck, the evidence and what to change.",
    )
    parser.add_argument(
        "--steps", type=int, default=20, metavar="N", help="steps to measure (default 20)"
    )
    add_output_options(parser, json=True)
    parser.add_argument("--trace", metavar="DIR", help="also write a torch.profiler trace to DIR")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        metavar="X",
        help="the device's peak TFLOP/s (for an unknown GPU)",
    )
    add_config_options(parser, nargs="?", help="default: the demo")
    parser.set_defaults(handler=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    import logging

    from thrifty.checkpointing.saving.rng import seed_everything
    from thrifty.config import load_config, parse_set_args
    from thrifty.demo import DEMO_CONFIG
    from thrifty.errors import ThriftyError
    from thrifty.reporting.end_of_run import print_diagnosis
    from thrifty.run.task import build_task

    if args.steps < 1:
        raise ThriftyError(
            f"--steps {args.steps} is invalid: a profile needs at least 1 step (e.g. --steps 20)"
        )
    logging.basicConfig(
        level=logging.WARNING if args.json else logging.INFO, format="thrifty: %(message)s"
    )
    with tempfile.TemporaryDirectory(prefix="thrifty-profile-") as tmp:
        # A scratch run: no checkpoints kept, no notices polled, nothing left behind.
        overrides = [
            ("run.max_steps", args.steps),
            ("run.out", tmp),
            ("run.progress", "off"),
            ("checkpoint.every", "off"),
            ("checkpoint.location", f"{tmp}/checkpoints"),
            ("checkpoint.resume", "never"),
            ("spot.provider", "none"),
            ("measure.breakdown", True),  # what a profile is made of, whatever the job says
            *parse_set_args(args.overrides),
        ]
        if args.trace:
            overrides.append(("measure.trace", args.trace))
        if args.peak_tflops is not None:
            overrides.append(("measure.peak_tflops", args.peak_tflops))
        base = None if args.config else DEMO_CONFIG
        config = load_config(args.config, overrides, base=base)
        seed_everything(config.run.seed)
        task = build_task(config)
        trainer = task.trainer(config, validate=False)  # a profile measures training only
        result = trainer.fit()
    diagnosis = trainer.diagnosis
    if diagnosis is None:
        if not config.measure.breakdown:
            raise ThriftyError(
                "a profile needs the per-step breakdown, and --set measure.breakdown=false turns "
                "it off: leave it on"
            )
        raise ThriftyError(
            "the profile measured no step after warm-up: use more --steps (e.g. --steps 20)"
        )
    if args.json:
        report = diagnosis.to_dict()
        report["tokens_per_second"] = result.tokens_per_second
        report["samples_per_second"] = result.samples_per_second
        report["precision"] = result.precision
        print(json.dumps(report, indent=2))
    else:
        print_diagnosis(diagnosis, result)
    return 0
