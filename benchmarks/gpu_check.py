"""On a CUDA GPU: the demo GPT in bf16 vs fp32, and torch.compile on vs off — with the
Trainer's throughput and MFU checked against a synchronized reference.

Prints tokens/s for each combination and the speed-ups, so the claims about mixed precision and
compile are measured on real hardware. The model is the demo's architecture at GPT-2-small
width so the GPU has real work; throughput excludes compile warm-up (the Trainer's meter skips
the first steps).

The Trainer measures each logging interval from one host sync to the next, so the time the
host spends waiting for the GPU is counted. Two checks show it: the largest per-step sum of
phase seconds never exceeds the step (shares add up to at most 100 %), and the Trainer's
tokens/s (eager) sits at or a little below a plain loop's, timed with `torch.cuda.synchronize`
around its steady steps; a ratio well above 1 would mean GPU time went uncounted. `--device`
trains on another GPU (`cuda:1`): the memory figures say which GPU did the work.

Then the micro-batch lever against real out-of-memory errors: with
`torch.cuda.set_per_process_memory_fraction` capping this process, `batch.micro = "auto"` must
choose a size whose peak stays under the cap less `batch.memory_margin`, and a run whose
micro-batch does not fit must halve it and finish with the configured effective batch.

    python benchmarks/gpu_check.py [--steps 60] [--layers 12] [--width 768] [--micro 16]
                                   [--device cuda:1]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.demo import build_model, train_dataset


def run(precision: str, compile_mode: str, args: argparse.Namespace, out: str) -> dict:
    cfg = TrainConfig.from_dict(
        {
            "run": {
                "max_steps": args.steps,
                "device": args.device,
                "out": out,
                "progress": "off",
                "log_every": 20,
            },
            "precision": {"mode": precision, "allow_tf32": args.tf32},
            "batch": {"micro": args.micro},
            "optimizer": {"lr": 6e-4, "weight_decay": 0.1, "betas": [0.9, 0.95]},
            "schedule": {"warmup_steps": 10, "decay": "cosine"},
            "data": {"num_workers": "auto"},
            "compile": {"mode": compile_mode},
        }
    )
    torch.manual_seed(0)
    model = build_model(
        n_layer=args.layers, n_head=args.width // 64, n_embd=args.width, block_size=args.block
    )
    result = Trainer(model, train_dataset(args.block, max_bytes=20_000_000), cfg).fit()
    torch.cuda.synchronize(args.device)
    steps = [
        json.loads(line)
        for line in (Path(out) / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    worst = max(
        (sum(s["breakdown"].values()) / s["step_seconds"] for s in steps if "breakdown" in s),
        default=float("nan"),
    )
    return {
        "tokens_per_second": result.tokens_per_second,
        "mfu": result.mfu,
        "step_ms": (result.step_seconds or float("nan")) * 1e3,
        "worst_phase_sum": worst,
    }


def memory_checks(args: argparse.Namespace, out: str) -> None:
    """Real OOMs: the process capped at a fraction of the GPU, `auto` and a micro-batch too big."""
    device = torch.device(args.device)
    if device.index is None:  # the cap is set per device index: "cuda" is the current one
        device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = 0.25
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        for name, micro in (("auto", "auto"), ("too-big", 4 * args.micro)):
            gc.collect()  # the previous case's Trainer, if a reference cycle still holds it
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            cfg = TrainConfig.from_dict(
                {
                    "run": {
                        "max_steps": 8,
                        "device": args.device,
                        "out": f"{out}/{name}",
                        "progress": "off",
                    },
                    "precision": {"mode": "bf16"},
                    "batch": {"micro": micro, "effective": 8 * args.micro},
                    "data": {"num_workers": 0},
                }
            )
            torch.manual_seed(0)
            model = build_model(
                n_layer=args.layers,
                n_head=args.width // 64,
                n_embd=args.width,
                block_size=args.block,
            )
            trainer = Trainer(model, train_dataset(args.block, max_bytes=5_000_000), cfg)
            # The training's peak, not the size search's: a trial that did not fit filled the cap.
            torch.cuda.reset_peak_memory_stats(device)
            result = trainer.fit()
            peak = torch.cuda.max_memory_allocated(device)
            del trainer
            print(
                f"memory cap {fraction:.0%} of {total / 2**30:.0f} GiB, micro {micro}: "
                f"{result.steps} steps at micro-batch {result.micro_batch}, peak "
                f"{peak / 2**30:.2f} GiB ({peak / (fraction * total):.0%} of the cap), "
                f"search {result.micro_batch_search}; allocated before the run "
                f"{before / 2**30:.2f} GiB",
                flush=True,
            )
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def reference_tokens_per_second(precision: str, args: argparse.Namespace) -> float:
    """A plain eager loop with the same model, data and optimizer, timed between two
    `torch.cuda.synchronize` calls around its steady steps: the truth on the GPU."""
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.manual_seed(0)
    model = build_model(
        n_layer=args.layers, n_head=args.width // 64, n_embd=args.width, block_size=args.block
    ).to(device)
    loader = torch.utils.data.DataLoader(
        train_dataset(args.block, max_bytes=20_000_000),
        batch_size=args.micro,
        shuffle=True,
        drop_last=True,
        num_workers=4,
        pin_memory=True,
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=True
    )
    batches = iter(loader)

    def step() -> None:
        batch = {k: v.to(device, non_blocking=True) for k, v in next(batches).items()}
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(5):  # warm-up: allocator, cuBLAS heuristics
        step()
    measured = max(10, args.steps - 5)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(measured):
        step()
    torch.cuda.synchronize(device)
    return measured * args.micro * args.block / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--device", default="cuda", help="the GPU to train on (default cuda)")
    parser.add_argument(
        "--tf32", action="store_true", help="let fp32 matmuls use TF32 (off: true fp32)"
    )
    parser.add_argument(
        "--memory-only", action="store_true", help="only the out-of-memory checks (no throughput)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="thrifty: %(message)s")  # quiet runs
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    print(f"device: {torch.cuda.get_device_name(device)} ({device}), torch {torch.__version__}")
    if not args.memory_only:
        throughput(args)
    with tempfile.TemporaryDirectory() as tmp:
        memory_checks(args, tmp)
    return 0


def throughput(args: argparse.Namespace) -> None:
    """Tokens/s of the Trainer in each precision with and without compile, against a plain loop."""
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp32", "bf16"):
            # The plain loop first, beside the eager Trainer: after a compiled run in the same
            # process it measured up to 9 % slower (H100), which would flatter the Trainer.
            reference = reference_tokens_per_second(precision, args)
            for compile_mode in ("off", "default"):
                key = (precision, compile_mode)
                r = run(precision, compile_mode, args, f"{tmp}/{precision}-{compile_mode}")
                rates[key] = r["tokens_per_second"]
                mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
                print(
                    f"{precision:>5} compile={compile_mode:<8} {rates[key]:>12,.0f} tokens/s "
                    f"(sync to sync)  MFU {mfu}  step {r['step_ms']:.1f} ms  "
                    f"largest phase sum / step {r['worst_phase_sum']:.3f} (≤ 1)",
                    flush=True,
                )
            print(
                f"{precision:>5} plain loop, synchronized: {reference:>12,.0f} tokens/s; "
                f"Trainer / plain (eager) {rates[precision, 'off'] / reference:.3f} "
                "(≤ about 1; well above 1 means uncounted GPU time)",
                flush=True,
            )
    print(
        f"bf16 speed-up over fp32 (eager):     {rates['bf16', 'off'] / rates['fp32', 'off']:.2f}×"
    )
    print(
        f"bf16 speed-up over fp32 (compiled):  {rates['bf16', 'default'] / rates['fp32', 'default']:.2f}×"
    )
    print(
        f"compile speed-up (bf16):             {rates['bf16', 'default'] / rates['bf16', 'off']:.2f}×"
    )
    print(
        f"compile speed-up (fp32):             {rates['fp32', 'default'] / rates['fp32', 'off']:.2f}×"
    )
    for index in range(torch.cuda.device_count()):
        peak = torch.cuda.max_memory_allocated(index) / 2**30
        print(f"cuda:{index} peak memory allocated: {peak:.2f} GiB")


if __name__ == "__main__":
    sys.exit(main())
