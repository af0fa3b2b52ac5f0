"""On a CUDA GPU: the demo GPT in bf16 vs fp32, and torch.compile on vs off.

Prints tokens/s for each combination and the speed-ups, so the claims about mixed precision and
compile are measured on real hardware. The model is the demo's architecture at GPT-2-small
width so the GPU has real work; throughput excludes compile warm-up (the Trainer's meter skips
the first steps).

    python benchmarks/gpu_check.py [--steps 60] [--layers 12] [--width 768] [--micro 16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch

from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.demo import build_model, train_dataset


def run(precision: str, compile_mode: str, args: argparse.Namespace, out: str) -> float:
    cfg = TrainConfig.from_dict(
        {
            "run": {
                "max_steps": args.steps,
                "device": "cuda",
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
    torch.cuda.synchronize()
    return result.tokens_per_second


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument(
        "--tf32", action="store_true", help="let fp32 matmuls use TF32 (off: true fp32)"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp32", "bf16"):
            for compile_mode in ("off", "default"):
                key = (precision, compile_mode)
                rates[key] = run(precision, compile_mode, args, f"{tmp}/{precision}-{compile_mode}")
                print(
                    f"{precision:>5} compile={compile_mode:<8} {rates[key]:>12,.0f} tokens/s",
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
