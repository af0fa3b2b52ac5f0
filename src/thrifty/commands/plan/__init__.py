"""`thrifty plan`: plan a job's cost before paying for it.

It prints one section for each question its options can answer: the job estimate (model + data
+ hardware), memory, scaling (more than one GPU), spot economics (an interruption rate), the
compute-optimal allocation (a budget), the cost levers (--levers), or the case study.
`thrifty plan fit PATH...` (fit.py) fits a scaling law to your own runs; `--fit FILE` uses it;
`thrifty plan isoflop` (isoflop.py) lays out and runs the IsoFLOP grid to fit it on.
Registering only builds the parser; the handler imports the planner when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from thrifty.commands.plan.options import (
    BANDWIDTH,
    BUDGET_DOLLARS,
    BUDGET_FLOPS,
    BUDGET_GPU_HOURS,
    COUNT_INT,
    DTYPES,
    EARLY_STOP,
    FIT,
    FRACTION,
    FRACTION_OR_ZERO,
    HOURS,
    PARAMS,
    RATE,
    RUNS,
    SECONDS,
    SEQUENCES,
    SHAPE,
    SPEEDUP,
    STEPS,
    TOKENS,
    bounded,
)
from thrifty.commands.prices import add_catalog_options


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `plan` to the `thrifty` command line."""
    plan = subparsers.add_parser(
        "plan",
        help="estimate a training job's cost, memory, scaling and spot economics",
        description="Plan a job before paying for it: FLOPs, hours and cost on an instance, "
        "memory per GPU, data-parallel scaling, spot economics, the compute-optimal model size "
        "for a budget, and the saving of each cost lever. Counts accept suffixes: 7B, 1.4T, 2e21.",
    )
    model = plan.add_argument_group("model (a parameter count or a transformer shape)")
    model.add_argument("--params", type=PARAMS, metavar="N", help="parameter count, e.g. 7B")
    for flag, text in (
        ("--layers", "layers"),
        ("--hidden", "hidden size"),
        ("--heads", "attention heads"),
        ("--vocab", "vocabulary size"),
        ("--seq", "sequence length (tokens)"),
    ):
        model.add_argument(flag, type=SHAPE, metavar="N", help=text)
    data = plan.add_argument_group("data (tokens, or steps x batch x --seq), or hours")
    data.add_argument("--tokens", type=TOKENS, metavar="D", help="training tokens, e.g. 1.4T")
    data.add_argument(
        "--hours",
        type=HOURS,
        metavar="H",
        help="hours of work on --instance, instead of a model and data: priced on-demand and "
        "on spot with the expected interruptions (default rate: the 5-10%% advisor bucket)",
    )
    data.add_argument("--steps", type=STEPS, metavar="S", help="optimizer steps")
    data.add_argument(
        "--batch", type=SEQUENCES, metavar="B", help="global batch in sequences per step"
    )
    hw = plan.add_argument_group("hardware")
    hw.add_argument("--instance", metavar="NAME", help="catalog instance, e.g. p4d.24xlarge")
    hw.add_argument("--gpu", metavar="NAME", help="catalog GPU, e.g. H100 (no price)")
    hw.add_argument(
        "--count",
        type=COUNT_INT,
        default=1,
        metavar="K",
        help="instances (or GPUs with --gpu); default 1",
    )
    hw.add_argument("--dtype", choices=DTYPES, default="bf16", help="compute dtype (default bf16)")
    hw.add_argument(
        "--mfu",
        type=FRACTION,
        metavar="F",
        help="model FLOPs utilization 0-1 (default 0.35), e.g. from a `thrifty profile` run",
    )
    hw.add_argument(
        "--recompute",
        choices=("none", "every-other", "full"),
        default="none",
        help="activation checkpointing: layers recomputed in backward (default none)",
    )
    _plan_memory_options(plan)
    _plan_spot_options(plan)
    _plan_budget_options(plan)
    _plan_lever_options(plan)
    plan.add_argument(
        "--case-study",
        action="store_true",
        help="recompute the '$50K -> $18K' case study and list where its figures disagree",
    )
    add_catalog_options(plan)
    plan.set_defaults(handler=_run_plan, config=None)
    from thrifty.commands.plan.fit import register_fit
    from thrifty.commands.plan.isoflop import register_isoflop

    commands = plan.add_subparsers(
        dest="plan_command",
        metavar="CONFIG.toml|fit|isoflop",
        title="a training config to price, or a subcommand (optional)",
        required=False,
        action=_ConfigOrCommand,
    )
    register_fit(commands)
    register_isoflop(commands)


class _ConfigOrSubcommands(Mapping[str, Any]):
    """The subcommands, and any word ending in .toml: a training config to price."""

    def __init__(self, parsers: dict[str, Any]) -> None:
        self._parsers = parsers

    def __contains__(self, key: object) -> bool:
        return key in self._parsers or (isinstance(key, str) and key.endswith(".toml"))

    def __getitem__(self, key: str) -> Any:
        return self._parsers[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsers)

    def __len__(self) -> int:
        return len(self._parsers)


class _ConfigOrCommand(argparse._SubParsersAction):
    """`plan fit ...`, `plan isoflop ...`, or `plan CONFIG.toml [options]`: a config takes the
    place of a subcommand (argparse hands a subcommand every word after it, so the words after
    the config are read as plan's own options)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse only tests membership and iterates: a view that also admits a config
        self.choices = _ConfigOrSubcommands(self._name_parser_map)  # type: ignore[assignment]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, list)  # nargs=PARSER: the word and every word after it
        if values[0] in self._name_parser_map:
            super().__call__(parser, namespace, values, option_string)
            return
        if getattr(namespace, "config", None) is not None:
            parser.error(f"give one training config, not {namespace.config} and {values[0]}")
        namespace.config = values[0]
        parser.parse_args(values[1:], namespace)


def _plan_memory_options(plan: argparse.ArgumentParser) -> None:
    mem = plan.add_argument_group("memory and scaling")
    mem.add_argument("--optimizer", choices=("adamw", "sgd-momentum", "sgd"), default="adamw")
    mem.add_argument(
        "--zero",
        type=int,
        choices=(0, 1, 2, 3),
        default=0,
        help="ZeRO/FSDP stage: 1 shards optimizer states, 2 + gradients, 3 + weights",
    )
    mem.add_argument(
        "--micro-batch",
        type=COUNT_INT,
        default=1,
        metavar="B",
        help="sequences per GPU per forward (default 1)",
    )
    mem.add_argument(
        "--attention",
        choices=("flash", "eager"),
        default="flash",
        help="attention implementation assumed for activations (default flash/SDPA)",
    )
    mem.add_argument(
        "--grad-accum",
        type=COUNT_INT,
        default=1,
        metavar="K",
        help="micro-batches per optimizer step",
    )
    mem.add_argument(
        "--grad-bytes",
        type=int,
        choices=(2, 4),
        default=4,
        help="bytes per gradient value in the all-reduce (default 4: fp32 under autocast)",
    )
    for flag, text in (
        (
            "--bus-bandwidth",
            "intra-node all-reduce bandwidth with unit, e.g. 300GB/s or '600GB/s bidirectional'",
        ),
        ("--network-bandwidth", "inter-node network bandwidth per node with unit, e.g. 400Gb/s"),
    ):
        mem.add_argument(flag, type=BANDWIDTH, metavar="BW", help=text)


def _plan_spot_options(plan: argparse.ArgumentParser) -> None:
    spot = plan.add_argument_group("spot economics")
    rate = spot.add_mutually_exclusive_group()
    rate.add_argument(
        "--interruptions-per-hour", type=RATE, metavar="R", help="spot interruption rate"
    )
    rate.add_argument(
        "--mtbi-hours", type=HOURS, metavar="H", help="mean time between interruptions"
    )
    rate.add_argument(
        "--advisor",
        metavar="BUCKET",
        help="AWS Spot Instance Advisor bucket: '<5%%', '5-10%%', '10-15%%', '15-20%%', '>20%%'",
    )
    spot.add_argument(
        "--save-seconds",
        type=SECONDS,
        default=60.0,
        metavar="S",
        help="checkpoint save time (default 60)",
    )
    spot.add_argument(
        "--restart-seconds",
        type=bounded("seconds", 1e7, "ten million seconds, 116 days", positive=False),
        default=600.0,
        metavar="S",
        help="time to get a new instance and resume (default 600)",
    )
    spot.add_argument(
        "--checkpoint-interval",
        type=SECONDS,
        metavar="S",
        help="seconds between checkpoints (default: Daly's optimum)",
    )


def _plan_budget_options(plan: argparse.ArgumentParser) -> None:
    budget = plan.add_argument_group("compute-optimal size for a budget (Chinchilla)")
    which = budget.add_mutually_exclusive_group()
    for flag, kind, metavar, text in (
        ("--budget-flops", BUDGET_FLOPS, "C", "budget in FLOPs, e.g. 5.88e23"),
        (
            "--budget-gpu-hours",
            BUDGET_GPU_HOURS,
            "H",
            "budget in GPU-hours (needs --gpu or --instance)",
        ),
        ("--budget-dollars", BUDGET_DOLLARS, "USD", "budget in USD (needs --instance)"),
    ):
        which.add_argument(flag, type=kind, metavar=metavar, help=text)
    budget.add_argument(
        "--fit",
        type=FIT,
        default="epoch",
        metavar="FIT",
        help="loss fit: epoch (default, Epoch AI 2024), hoffmann (paper's rounded "
        "coefficients), tokens-per-param (~20 tokens per parameter), a FILE saved by 'thrifty "
        "plan fit --out FILE', or a folder: its scaling-fit.json if it holds one, else the runs "
        "in it, fitted now (1,000 bootstrap resamples, seed 0)",
    )
    budget.add_argument(
        "--pricing",
        choices=("on-demand", "spot"),
        default="on-demand",
        help="price used for a dollar budget (default on-demand)",
    )


def _plan_lever_options(plan: argparse.ArgumentParser) -> None:
    levers = plan.add_argument_group("cost levers (--levers)")
    levers.add_argument(
        "--levers", action="store_true", help="show the saving of each lever in sequence"
    )
    levers.add_argument(
        "--runs", type=RUNS, default=1.0, metavar="R", help="runs per period (default 1)"
    )
    levers.add_argument(
        "--early-stop",
        type=EARLY_STOP,
        default=0.0,
        metavar="K",
        help="runs stopped early because they would not improve (default 0)",
    )
    levers.add_argument(
        "--early-stop-at",
        type=FRACTION_OR_ZERO,
        default=0.6,
        metavar="F",
        help="fraction of runtime at which they stop (default 0.6)",
    )
    levers.add_argument(
        "--baseline-dtype",
        choices=DTYPES,
        default="tf32",
        help="precision before the precision lever (default tf32)",
    )
    levers.add_argument(
        "--precision-speedup",
        type=SPEEDUP,
        metavar="X",
        help="measured speed-up of --dtype over --baseline-dtype (default: peak ratio)",
    )
    levers.add_argument(
        "--microbatch-speedup",
        type=SPEEDUP,
        default=1.0,
        metavar="X",
        help="measured net speed-up of the larger micro-batch checkpointing allows (default 1)",
    )
    levers.add_argument(
        "--compile-speedup",
        type=SPEEDUP,
        default=1.0,
        metavar="X",
        help="measured torch.compile speed-up (default 1)",
    )
    levers.add_argument("--plot", metavar="FILE.png", help="write a waterfall chart of the levers")


def _run_plan(args: argparse.Namespace) -> int:
    from thrifty.commands.plan.sections import run_plan

    return run_plan(args)
