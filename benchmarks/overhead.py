"""Per-step overhead of thrifty.Trainer against a hand-written PyTorch loop with the same levers.

Both run the demo GPT on the demo data with the same precision, accumulation, AdamW, clipping,
warmup-cosine schedule and DataLoader, alternating round by round in one process so machine
noise hits both alike. Prints the median step time of each and their ratio (target ≤ 1.03).

    python benchmarks/overhead.py [--rounds 6] [--steps 25]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from demo_runs import EFFECTIVE, MICRO, demo_step_times

from thrifty.demo import DEMO_CONFIG, build_model, train_dataset
from thrifty.precision import resolve_precision
from thrifty.schedule import build_scheduler

ACCUM = EFFECTIVE // MICRO


def plain_loop(model, data, steps: int, precision, seed: int) -> list[float]:
    """The loop a careful engineer writes by hand, with the same levers."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=2e-3,
        betas=(0.9, 0.95),
    )
    sched = build_scheduler(
        opt, warmup_steps=5, decay="cosine", total_steps=steps, min_lr_ratio=0.1
    )
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=MICRO,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    batches = iter(loader)
    times = []
    last = time.perf_counter()
    for _ in range(steps):
        for _ in range(ACCUM):
            batch = next(batches)
            with torch.autocast("cpu", dtype=precision.dtype, enabled=precision.dtype is not None):
                loss = model(**batch)
            (loss / ACCUM).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


def trainer_loop(data, steps: int, out: str, seed: int) -> list[float]:
    schedule = {"warmup_steps": 5, "decay": "cosine", "min_lr_ratio": 0.1}
    return demo_step_times(data, steps, out, seed, schedule=schedule)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=25)
    args = parser.parse_args()
    data = train_dataset()
    precision = resolve_precision("auto", torch.device("cpu"))
    thrifty_times: list[float] = []
    plain_times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # Skip each round's first step: allocator warm-up, not steady state.
            thrifty_times += trainer_loop(data, args.steps, f"{tmp}/round{r}", seed=r)
            torch.manual_seed(r)
            model = build_model(**DEMO_CONFIG["task"]["model_args"])
            plain_times += plain_loop(model, data, args.steps, precision, seed=r)[1:]
    t, p = statistics.median(thrifty_times), statistics.median(plain_times)
    print(
        f"precision {precision.name}, micro {MICRO} × {ACCUM} accumulation, {args.rounds} rounds × {args.steps} steps, {torch.get_num_threads()} threads"
    )
    print(f"median step: thrifty.Trainer {t * 1e3:.2f} ms, plain loop {p * 1e3:.2f} ms")
    print(f"overhead ratio (Trainer / plain): {t / p:.3f}  (target ≤ 1.03)")


if __name__ == "__main__":
    main()
