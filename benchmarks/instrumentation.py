"""Cost of the loop's own measurements: the demo with instrumentation on vs off.

On: per-phase step timings, MFU, system sampling every 0.5 s and the cost meter. Off: none of
them. The two alternate round by round in one process; prints the median step time of each and
their ratio (target ≤ 1.01).

    python benchmarks/instrumentation.py [--rounds 6] [--steps 25]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch

from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.demo import DEMO_CONFIG, build_model, train_dataset
from thrifty.rundir import read_metrics


def run(data, steps: int, out: str, seed: int, instrumented: bool) -> list[float]:
    cfg = TrainConfig.from_dict(
        {
            **DEMO_CONFIG,
            "run": {
                "max_steps": steps,
                "device": "cpu",
                "out": out,
                "progress": "off",
                "seed": seed,
                "log_every": 10,
            },
            "batch": {"micro": 8, "effective": 16},
            "data": {"num_workers": 0},
            "checkpoint": {"every": "off"},
            "spot": {"provider": "none"},
            "measure": {"breakdown": instrumented, "system": instrumented},
            "cost": {"usd_per_gpu_hour": 2.0, "pricing": "on-demand"} if instrumented else {},
        }
    )
    torch.manual_seed(seed)
    model = build_model(**DEMO_CONFIG["task"]["model_args"])
    Trainer(model, data, cfg).fit()
    return [r["step_seconds"] for r in read_metrics(f"{out}/metrics.jsonl") if "step_seconds" in r][
        1:
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=25)
    args = parser.parse_args()
    data = train_dataset()
    on: list[float] = []
    off: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            first, second = (
                (True, False) if r % 2 == 0 else (False, True)
            )  # alternate the order too
            for instrumented in (first, second):
                times = run(data, args.steps, f"{tmp}/{r}-{instrumented}", r, instrumented)
                (on if instrumented else off).extend(times)
    t_on, t_off = statistics.median(on), statistics.median(off)
    print(
        f"{args.rounds} rounds × {args.steps} steps, demo model, micro 8 × 2, {torch.get_num_threads()} threads"
    )
    print(f"median step: instrumented {t_on * 1e3:.2f} ms, plain {t_off * 1e3:.2f} ms")
    print(f"instrumentation ratio (on / off): {t_on / t_off:.3f}  (target ≤ 1.01)")


if __name__ == "__main__":
    main()
