"""A scaling law fitted on your own runs predicts a larger run it never saw.

An IsoFLOP grid of the demo's byte-level GPT on this machine (3 widths x 3 FLOP budgets, each
run trained on D = C / (6N) tokens with its own cosine schedule), run as a sweep by
`thrifty.search.sweep.isoflop` exactly as `thrifty plan isoflop` runs it; the law
L(N, D) = E + A/N^alpha + B/D^beta fitted on the grid as `thrifty plan fit` fits it; then one
held-out run, wider than every run of the grid and at a larger budget, is predicted before it
runs, and run. Printed: the grid, the fitted constants, the predicted and the measured final
validation loss of the held-out run and their difference in percent. The goal: within 5%.

Not a test: the figures depend on the machine. Run: python benchmarks/scaling_fit.py
(about 10 minutes on a 2-core CPU; --workers 2 runs two grid runs at once).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from thrifty.demo import DEMO_CONFIG

KEY = "task.model_args.n_embd"
SIZES = (32, 48, 64)
BUDGETS = (1e11, 2.5e11, 6e11)
HELD_OUT = (96, 1.2e12)  # width and budget of the run the fit predicts
CONFIG: dict[str, Any] = {
    **DEMO_CONFIG,
    "run": {"name": "isoflop", "device": "cpu", "seed": 0, "log_every": 100, "progress": "off"},
    "precision": {"mode": "fp32"},
    "batch": {"micro": 16, "effective": 16},
    "optimizer": {**DEMO_CONFIG["optimizer"], "lr": 0.002},
    "schedule": {**DEMO_CONFIG["schedule"], "warmup_steps": 10, "decay": "cosine"},
    "data": {"num_workers": 0},
    "eval": {"every": 100_000, "batches": 16, "micro": 32},  # once, at the end
    "checkpoint": {"every": 200},
    "task": {
        **DEMO_CONFIG["task"],
        "model_args": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},
        "data_args": {"block_size": 64},
    },
}


def held_out_run(config: Path, out: Path, steps: int) -> float:
    """Train the held-out run with `thrifty train`; its final validation loss."""
    width = HELD_OUT[0]
    command = [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(out)]
    command += ["--set", f"{KEY}={width}", "--set", f"run.max_steps={steps}"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return float(json.loads((out / "summary.json").read_text())["final_val_loss"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    from thrifty.plan.lawfit import fit_scaling_law
    from thrifty.plan.lawpoints import read_points
    from thrifty.search.sweep.isoflop import layout, run_grid

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = root / "config.toml"
        config.write_text(tomli_w.dumps(CONFIG))
        runs = layout(config, KEY, SIZES, BUDGETS)
        started = time.monotonic()
        run_grid(config, KEY, runs, root / "grid", workers=args.workers, say=lambda _: None)
        grid_seconds = time.monotonic() - started
        points = read_points([str(root / "grid")])
        print(f"grid: {len(points.points)} runs in {grid_seconds:.0f} s")
        for p in sorted(points.points, key=lambda p: (p.flops, p.params)):
            print(
                f"  N={p.params:>9,.0f}  D={p.tokens:>11,.0f}  C={p.flops:.3g}  loss={p.loss:.4f}"
            )
        fit = fit_scaling_law(points.points, resamples=100)
        law = fit.law
        print(
            f"fit: E={law.E:.3f} A={law.A:.4g} B={law.B:.4g} alpha={law.alpha:.3f} "
            f"beta={law.beta:.3f} (approach 2: {fit.agreement() or 'not available'})"
        )
        (held,) = layout(config, KEY, (*SIZES, HELD_OUT[0]), (HELD_OUT[1],))[-1:]
        predicted = law.loss(held.params, held.tokens)
        print(
            f"held out: {KEY}={HELD_OUT[0]} N={held.params:,} D={held.tokens:,} "
            f"C={held.flops:.3g} ({held.params / max(p.params for p in points.points):.1f}x the "
            f"largest N, {held.flops / max(BUDGETS):.1f}x the largest budget)"
        )
        print(f"predicted loss: {predicted:.4f}")
        measured = held_out_run(config, root / "held-out", held.steps)
        error = 100.0 * (predicted - measured) / measured
        print(f"measured loss:  {measured:.4f}")
        print(f"difference: {error:+.2f}% (goal: within 5%)")


if __name__ == "__main__":
    main()
