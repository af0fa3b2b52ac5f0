"""What `thrifty launch` asks of the fleet: the config, the machines, the engine, where the job
file goes, an optional sweep and the figures its cost estimate is priced with.

The command line builds a `LaunchRequest` once; a program can build one itself and pass it to
`thrifty.fleet.launching.run`. Values are kept as given (strings where the user wrote text):
`launching` checks them against the config and the catalog, each bad one in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class CostFigures:
    """The figures the cost estimate is priced with; None: the planner's default or the
    config's value. `params`: parameters; `tokens`: training tokens; `seq`: tokens per
    sample; `mfu`: 0-1; `instance`: a catalog instance name (also checked against `--gpus`)."""

    instance: str | None = None
    params: float | None = None
    tokens: float | None = None
    seq: int | None = None
    mfu: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchRequest:
    """One `thrifty launch`: `config` (a CONFIG.toml path) with its `--set` `overrides`, on
    `nodes` nodes of `gpus` (`GPU:COUNT`, per node), written for `engine` ("skypilot" or
    "slurm"). `bucket`: the checkpoint location every node reads; `out`: the job file (None:
    beside the config); `max_restarts`: relaunches after a failure that is not a preemption;
    `time`: the Slurm time limit as written (`24h`). `sweep` (a SPACE.toml path), `storage` and
    `study` make it one sweep worker per node instead of one training run."""

    config: str
    gpus: str
    overrides: tuple[str, ...] = ()
    nodes: int = 1
    spot: bool = False
    bucket: str | None = None
    engine: str = "skypilot"
    dry_run: bool = False
    out: str | None = None
    overwrite: bool = False
    max_restarts: int = 3
    time: str | None = None
    sweep: str | None = None
    storage: str | None = None
    study: str | None = None
    cost: CostFigures = field(default_factory=CostFigures)
