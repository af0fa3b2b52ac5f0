"""What the CPU benchmarks share: the demo model trained by thrifty.Trainer for a few steps,
returning the per-step times it recorded."""

from __future__ import annotations

import logging
from typing import Any

import torch

from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.demo import DEMO_CONFIG, build_model
from thrifty.rundir.files import read_metrics

MICRO, EFFECTIVE = 8, 16


def run_config(
    out: str, steps: int, seed: int, micro: int, effective: int, **sections: Any
) -> dict[str, Any]:
    """A short quiet CPU run: no worker processes, checkpoints or notices; `sections` merged."""
    return {
        "run": {
            "max_steps": steps,
            "device": "cpu",
            "out": out,
            "progress": "off",
            "seed": seed,
            "log_every": 10,
        },
        "batch": {"micro": micro, "effective": effective},
        "data": {"num_workers": 0},
        "checkpoint": {"every": "off"},
        "spot": {"provider": "none"},
        **sections,
    }


def demo_step_times(data: Any, steps: int, out: str, seed: int, **sections: Any) -> list[float]:
    """Train the demo GPT for `steps` steps (micro 8 × 2, CPU, no worker processes, no
    checkpoints or notices) with `sections` merged into the config; the step times after the
    first, which pays the allocator's warm-up."""
    config = {**DEMO_CONFIG, **run_config(out, steps, seed, MICRO, EFFECTIVE, **sections)}
    torch.manual_seed(seed)
    model = build_model(**DEMO_CONFIG["task"]["model_args"])
    if not logging.getLogger().handlers:  # quiet runs: fit() prints its summary otherwise
        logging.basicConfig(level=logging.WARNING, format="thrifty: %(message)s")
    Trainer(model, data, TrainConfig.from_dict(config)).fit()
    times = [r["step_seconds"] for r in read_metrics(f"{out}/metrics.jsonl") if "step_seconds" in r]
    return times[1:]
