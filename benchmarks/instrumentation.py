"""Cost of the loop's own measurements: the demo with instrumentation on vs off.

On: per-phase step timings, MFU, system sampling every 0.5 s and the cost meter. Off: none of
them. The two alternate round by round in one process; prints the median step time of each and
their ratio (target ≤ 1.01).

    python benchmarks/instrumentation.py [--rounds 16] [--steps 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from demo_runs import demo_step_times

from thrifty.demo import train_dataset


def run(data, steps: int, out: str, seed: int, instrumented: bool) -> list[float]:
    return demo_step_times(
        data,
        steps,
        out,
        seed,
        measure={"breakdown": instrumented, "system": instrumented},
        cost={"usd_per_gpu_hour": 2.0, "pricing": "on-demand"} if instrumented else {},
    )


def direct_cost(accumulation: int = 2, repeats: int = 20_000) -> tuple[float, float]:
    """Seconds of instrumentation work per step (the timer's marks, on the training thread) and
    per second of training (the system sampler's samples, on its own thread): a noise-free
    upper bound beside the A/B ratio."""
    from thrifty.measure.system import SystemSampler
    from thrifty.measure.timing import CpuTimer

    timer = CpuTimer()
    start = time.perf_counter()
    for _ in range(repeats):
        timer.start()
        timer.mark("data_wait")
        for _ in range(accumulation):
            timer.mark("host_to_device")
            timer.mark("forward")
            timer.mark("backward")
        timer.mark("optimizer")
        timer.resolve(timer.finish())
    per_step = (time.perf_counter() - start) / repeats
    sampler = SystemSampler(0.5, gpu=False)
    sampler._open_psutil()
    start = time.perf_counter()
    for _ in range(200):
        sampler.sample_once()
    per_sample = (time.perf_counter() - start) / 200
    return per_step, per_sample / 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
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
    per_step, sampler_share = direct_cost()
    print(
        f"direct cost: timer {per_step * 1e6:.1f} µs per step ({per_step / t_off:.4%} of a step); "
        f"system sampler {sampler_share:.4%} of one core"
    )


if __name__ == "__main__":
    main()
