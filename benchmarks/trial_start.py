"""What a trial of `thrifty tune` or `thrifty sweep` pays before its first step, in a warm worker
and in a new process (as trials ran before the warm engine), side by side in one run.

Each pair runs one trial cold (a new worker: Python, torch and thrifty imported, then the run)
and one warm (the next trial of a worker that already ran one), alternating, on the demo's
byte-level GPT (2 layers, 64 wide, fp32, the CPU). A trial's start-up is the time from the
search's order to the first step it reports (that step included); its whole time is the order
to its end (a few steps, an evaluation, a checkpoint, its summary). Printed: the median
of each over the pairs, and the break-even: a warm worker's trial pays its run's set-up, as a
loop that trains every trial in one process (Optuna driving `thrifty.Trainer`) does, and the
worker's own start once per device (the cold start less the warm one); a search whose trials
together train for less than ten times that pays more than 10% for it, and is better run in one
process. With a process per trial (before), each trial paid the cold start: trials shorter than
ten times it paid more than 10%.

With --compile MODE each trial compiles the model (torch.compile): a warm worker runs the code it
compiled for an earlier trial whose model passes the same guards, a new process compiles again
(from inductor's on-disk cache at best).

Not a test: the figures depend on the machine. Run:
    python benchmarks/trial_start.py [--pairs 5] [--compile default]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from thrifty.config import dump_toml
from thrifty.demo import DEMO_CONFIG
from thrifty.search.engine import Engine, TrialSession

STEPS = 5
CONFIG: dict[str, Any] = {
    **DEMO_CONFIG,
    "run": {"name": "start", "max_steps": STEPS, "device": "cpu", "seed": 0, "log_every": 5},
    "precision": {"mode": "fp32"},
    "batch": {"micro": 16, "effective": 16},
    "data": {"num_workers": 0},
    "eval": {"every": STEPS, "batches": 2, "micro": 16},
    "checkpoint": {"every": STEPS},
    "task": {
        **DEMO_CONFIG["task"],
        "model_args": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},
        "data_args": {"block_size": 64},
    },
}


def one_trial(engine: Engine, out: Path, name: str, options: list[str]) -> tuple[float, float]:
    """(start-up seconds, whole seconds) of one trial."""
    session: TrialSession = engine.start(
        ["--out", str(out / name), *options], dump_toml(CONFIG).encode(), out / f"{name}.log", name
    )
    pipe, first = session.pipe, []

    def turn() -> bool:
        if pipe.steps and not first:
            first.append(session.elapsed)
        return False

    code = pipe.serve(session, turn)
    session.wait()
    if code != 0:
        raise SystemExit(f"trial {name} failed ({code}): {session.error_line()}")
    whole = session.elapsed
    return (first[0] if first else whole), whole


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="cold/warm pairs (default 5)")
    parser.add_argument("--compile", metavar="MODE", help="compile.mode of every trial")
    args = parser.parse_args(argv)
    options = ["--set", f'compile.mode="{args.compile}"'] if args.compile else []
    out = Path(tempfile.mkdtemp(prefix="thrifty-trial-start-"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cold: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    engine = Engine(out / "workers", env)
    try:
        for i in range(args.pairs):
            engine.cold = True  # a new worker for this trial
            cold.append(one_trial(engine, out, f"cold-{i}", options))
            engine.cold = False  # the same worker again
            warm.append(one_trial(engine, out, f"warm-{i}", options))
            time.sleep(0.1)
    finally:
        engine.close()
    print(
        f"demo GPT (2 layers, 64 wide), {STEPS} steps a trial, CPU fp32, compile "
        f"{args.compile or 'off'}; "
        f"{args.pairs} cold/warm pairs, medians:"
    )
    c_start, c_whole = (statistics.median(x) for x in zip(*cold, strict=True))
    w_start, w_whole = (statistics.median(x) for x in zip(*warm, strict=True))
    print(f"  {'':<6}{'to step 1 s':>12}{'whole trial s':>15}")
    print(f"  {'cold':<6}{c_start:>12.2f}{c_whole:>15.2f}")
    print(f"  {'warm':<6}{w_start:>12.2f}{w_whole:>15.2f}")
    print(f"to step 1, warm / cold: {w_start / c_start:.2f}")
    worker = max(0.0, c_start - w_start)
    print(
        f"break-even: a worker's start costs {worker:.2f} s once per device: a search whose trials "
        f"together train for less than {10 * worker:.0f} s pays over 10% for it; with a process "
        f"per trial, every trial shorter than {10 * c_start:.0f} s did"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
