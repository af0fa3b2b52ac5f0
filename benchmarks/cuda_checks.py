"""On a CUDA GPU: the checks that only a GPU can run, each printed as PASS or FAIL with its figures.

1. `precision.mode = "auto"` picks bf16 where the GPU supports it, and says why.
2. Activation checkpointing on the GPU: peak memory of a forward and backward of the demo GPT at
   GPT-2-small width with every block checkpointed against none, and the gradients equal.
3. fp16 with its loss scaler: a run trains (loss falls, every figure finite) and its checkpoint
   holds the scaler's state.
4. Spot preemption on the GPU: a `thrifty train` process sent SIGTERM mid-run (its whole process
   group, loader workers included) exits 75 with an emergency checkpoint; the same command resumes
   it, and the final checkpoint is bit-for-bit the uninterrupted run's (run.deterministic).
5. The system sampler reads the GPU through NVML (utilization, memory, power) and the run's MFU is
   measured against the catalog's peak for this GPU.
6. DDP and FSDP over NCCL (one process under torchrun): a run trains and checkpoints.
7. The micro-batch a heavier checkpointing policy would fit, as a run predicts it for
   `thrifty tune` (`micro_that_fits`): from the peaks of the sizes that fit under a memory limit
   and the activations each block holds, measured on the GPU; then each policy's real peak at the
   size predicted and a tenth above it, with a byte vocabulary (the blocks hold the most) and
   GPT-2's (the logits do). The size predicted must fit, within 5% of the limit: an optimistic
   prediction costs tune a trial. tune skips a policy only when the size it needs is more than
   a tenth above the prediction, so a tenth above must not fit.
8. A run's `peak_memory_bytes` is its training steps' peak, not its set-up's: `thrifty train` at
   GPT-2-small width with every block checkpointed reports well under the peak of the same run
   without (the FLOP count at start runs one eager step before checkpointing is applied; that
   step's peak would otherwise be both runs' figure).

    python benchmarks/cuda_checks.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from thrifty.commands.chaos.compare import compare_runs
from thrifty.demo import build_model
from thrifty.levers.activation_checkpointing import (
    apply_activation_checkpointing,
    find_repeated_blocks,
    micro_that_fits,
    remove_activation_checkpointing,
)
from thrifty.levers.precision import resolve_precision
from thrifty.measure.flops import count_flops

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.toml"
RESULTS: list[tuple[str, bool]] = []


def check(name: str, ok: bool, detail: str) -> None:
    RESULTS.append((name, ok))
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def thrifty(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "thrifty", *args],
        env={**os.environ, **(env or {})},
        start_new_session=True,  # its own process group: SIGTERM reaches the loader workers too
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(job: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, _ = job.communicate(timeout=timeout)
    return job.returncode, out


def demo_args(out: Path, device: str, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        str(DEMO),
        "--out",
        str(out),
        "--set",
        f"run.device={device}",
        "--set",
        f"run.max_steps={steps}",
        "--set",
        "run.max_time=10m",
        "--set",
        "run.progress=off",
        *extra,
    ]


def precision_auto(device: str) -> None:
    chosen = resolve_precision("auto", torch.device(device))
    name = torch.cuda.get_device_name(device)
    check(
        "precision auto",
        chosen.name == ("bf16" if torch.cuda.is_bf16_supported() else "fp16"),
        f"{name}: {chosen.name} ({chosen.reason})",
    )


def activation_checkpointing(device: str) -> None:
    def step(policy: str) -> tuple[int, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = build_model(n_layer=12, n_head=12, n_embd=768, block_size=1024).to(device)
        if policy != "off":
            apply_activation_checkpointing(model, policy)
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, 256, (8, 1025), generator=g).to(device)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x[:, :-1], targets=x[:, 1:])
        loss.backward()
        peak = torch.cuda.max_memory_allocated(device) - base
        grads = [p.grad.detach().float().clone() for p in model.parameters()]
        return peak, grads

    def distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        """Relative difference of the whole gradient: ‖a − b‖ / ‖b‖."""
        diff = torch.cat([(x - y).flatten() for x, y in zip(a, b, strict=True)])
        return float(diff.norm() / torch.cat([y.flatten() for y in b]).norm())

    off_peak, off_grads = step("off")
    _, again = step("off")
    all_peak, all_grads = step("all")
    # CUDA's atomics (the embedding's backward) make two identical steps differ a little: the
    # recomputed step must differ from the plain one no more than that.
    noise, recomputed = distance(again, off_grads), distance(all_grads, off_grads)
    check(
        "activation checkpointing",
        all_peak < 0.7 * off_peak and recomputed <= 2 * noise + 1e-3,
        f"peak above the weights {off_peak / 2**30:.2f} GiB off, {all_peak / 2**30:.2f} GiB with "
        f"every block checkpointed ({all_peak / off_peak:.0%}); gradients' relative difference "
        f"{recomputed:.1e} (two plain steps: {noise:.1e})",
    )


def checkpointing_room(device: str, vocab: int, width: int = 768, block: int = 1024) -> None:
    torch.manual_seed(0)
    model = build_model(
        n_layer=12, n_head=width // 64, n_embd=width, block_size=block, vocab_size=vocab
    )
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device != "cpu")

    def loss(micro: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(micro)
        x = torch.randint(0, vocab, (micro, block + 1), generator=g).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return model(input_ids=x[:, :-1], targets=x[:, 1:])

    def peak(micro: int) -> int:
        """A training step's peak allocation at `micro` samples, as the micro-batch search
        measures it."""
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        loss(micro).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)

    peak(1)  # the optimizer's state: allocated by the first step, held by every later one
    sizes = {m: peak(m) for m in (4, 8, 16)}
    limit = (sizes[8] + sizes[16]) / 2  # 8 fits without checkpointing, 16 does not
    tried = [{"micro": m, "fits": m <= 8, "peak_bytes": sizes[m]} for m in sizes]
    blocks = {name: model.get_submodule(name) for name in find_repeated_blocks(model)}
    count = count_flops(lambda: loss(8).backward(), blocks)
    optimizer.zero_grad(set_to_none=True)
    fits = micro_that_fits(
        tried, limit, count.block_bytes, count.input_bytes, 8, "off", count.head_bytes
    )
    figures, ok = [], bool(fits)
    for policy in ("every_other", "all"):
        predicted = fits.get(policy, 0)
        if predicted < 1:
            ok = False
            figures.append(f"{policy}: no prediction ({fits})")
            continue
        apply_activation_checkpointing(model, policy, count.block_bytes)
        above = math.ceil(predicted * 1.1)
        at, over = peak(predicted), peak(above)
        remove_activation_checkpointing(model)
        ok = ok and at <= 1.05 * limit and over > limit
        figures.append(
            f"{policy}: predicted {predicted}, its peak {at / limit:.1%} of the limit, "
            f"{above}'s {over / limit:.1%}"
        )
    check(
        f"checkpointing room, vocabulary {vocab}",
        ok,
        f"limit {limit / 2**30:.2f} GiB (8 fit without checkpointing, 16 do not); "
        + "; ".join(figures),
    )


def fp16_scaler(device: str, tmp: Path) -> None:
    out = tmp / "fp16"
    code, text = finish(thrifty(demo_args(out, device, 60, "--set", "precision.mode=fp16")))
    losses = [r["loss"] for r in records(out) if "loss" in r] if code == 0 else []
    state = {}
    if code == 0:
        from thrifty.checkpointing.store import CheckpointManager

        manager = CheckpointManager(str(out / "checkpoints"))
        state = manager.load(manager.latest())
    scaler = state.get("scaler") or {}
    ok = code == 0 and len(losses) > 2 and losses[-1] < losses[0] and bool(scaler)
    check(
        "fp16 with loss scaler",
        ok,
        f"exit {code}; loss {losses[0]:.3f} -> {losses[-1]:.3f}; scaler state {sorted(scaler)}"
        if losses
        else f"exit {code}: {text[-600:]}",
    )


def preemption(device: str, tmp: Path) -> None:
    extra = ["--set", "run.deterministic=true", "--set", "checkpoint.every=10"]
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    ref = tmp / "reference"
    code, text = finish(thrifty(demo_args(ref, device, 60, *extra), env))
    if code != 0:
        check("SIGTERM and exact resume", False, f"reference run exit {code}: {text[-600:]}")
        return
    run = tmp / "preempted"
    job = thrifty(demo_args(run, device, 60, *extra), env)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and job.poll() is None:
        steps = (
            [r["step"] for r in records(run) if "loss" in r]
            if (run / "metrics.jsonl").exists()
            else []
        )
        if steps and max(steps) >= 25:
            break
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGTERM)  # the whole group, as a scheduler does
    first, text = finish(job)
    second, text2 = finish(thrifty(demo_args(run, device, 60, *extra), env))
    comparison = compare_runs(ref, run, records(ref), records(run)) if second == 0 else {}
    check(
        "SIGTERM and exact resume",
        first == 75 and second == 0 and bool(comparison.get("match")),
        f"first attempt exit {first} (75 = resumable), resumed exit {second}; final step "
        f"{comparison.get('final_step')}; state identical: {comparison.get('match')}; "
        f"first loss difference at step {comparison.get('first_loss_difference')}"
        if second == 0
        else f"exits {first}, {second}: {text[-400:]} {text2[-600:]}",
    )


def nvml_and_mfu(device: str, tmp: Path) -> None:
    out = tmp / "bf16"
    code, text = finish(thrifty(demo_args(out, device, 80, "--set", "precision.mode=bf16")))
    if code != 0:
        check("NVML sampling and MFU", False, f"exit {code}: {text[-600:]}")
        return
    systems = [r["system"] for r in records(out) if "gpu_util_percent_mean" in r.get("system", {})]
    gpu_keys = sorted({k for s in systems for k in s if k.endswith("_mean") and "gpu" in k})
    summary = json.loads((out / "summary.json").read_text())
    basis = summary.get("mfu_basis") or {}
    check(
        "NVML sampling and MFU",
        bool(gpu_keys) and summary.get("mfu") is not None,
        f"GPU figures sampled {gpu_keys}; last { ({k: systems[-1].get(k) for k in gpu_keys}) }; "
        f"MFU {summary.get('mfu')}, peak {basis.get('peak_flops_per_second')} FLOP/s from "
        f"{basis.get('peak_source')}",
    )


def one_process_strategies(device: str, tmp: Path) -> None:
    for strategy in ("ddp", "fsdp"):
        out = tmp / strategy
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "1",
            "-m",
            "thrifty",
            *demo_args(out, device, 30, "--set", f"distributed.strategy={strategy}"),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        ckpts = sorted(p.name for p in (out / "checkpoints").glob("*")) if out.exists() else []
        losses = [r["loss"] for r in records(out) if "loss" in r] if out.exists() else []
        check(
            f"{strategy} over NCCL",
            done.returncode == 0 and bool(ckpts) and bool(losses) and losses[-1] < losses[0],
            f"exit {done.returncode}; checkpoints {ckpts}; loss "
            f"{losses[0] if losses else None} -> {losses[-1] if losses else None}"
            if done.returncode == 0
            else f"exit {done.returncode}: {(done.stdout + done.stderr)[-800:]}",
        )


def steps_peak(device: str, tmp: Path, width: int = 768, block: int = 1024) -> None:
    def peak(policy: str) -> float | None:
        out = tmp / f"peak-{policy}"
        shape = ["n_layer=12", f"n_head={width // 64}", f"n_embd={width}", f"block_size={block}"]
        sets = [f"task.model_args.{w}" for w in shape] + [
            f"task.data_args.block_size={block}",
            "precision.mode=bf16",
            "batch.micro=8",
            "batch.effective=8",
            "data.num_workers=0",
            f"activation_checkpointing.policy={policy}",
        ]
        extra = [arg for value in sets for arg in ("--set", value)]
        code, text = finish(thrifty(demo_args(out, device, 5, *extra)))
        if code != 0:
            raise RuntimeError(f"{policy}: exit {code}: {text[-600:]}")
        return json.loads((out / "summary.json").read_text()).get("peak_memory_bytes")

    off, every = peak("off"), peak("all")
    check(
        "the steps' peak memory",
        off is not None and every is not None and every < 0.8 * off,
        f"summary.json peak_memory_bytes {off / 2**30:.2f} GiB off, {every / 2**30:.2f} GiB with "
        f"every block checkpointed ({every / off:.0%})"
        if off and every
        else f"no peak reported: {off}, {every}",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", help="comma-separated check names to run (default all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("cuda_checks: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 2
    print(f"device: {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}")
    checks: dict[str, Callable[..., None]] = {
        "precision": lambda tmp: precision_auto(args.device),
        "checkpointing": lambda tmp: activation_checkpointing(args.device),
        "room": lambda tmp: [checkpointing_room(args.device, v) for v in (256, 50_304)],
        "fp16": lambda tmp: fp16_scaler(args.device, tmp),
        "preemption": lambda tmp: preemption(args.device, tmp),
        "nvml": lambda tmp: nvml_and_mfu(args.device, tmp),
        "strategies": lambda tmp: one_process_strategies(args.device, tmp),
        "peak": lambda tmp: steps_peak(args.device, tmp),
    }
    chosen = args.only.split(",") if args.only else list(checks)
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            try:
                checks[name](Path(tmp))
            except Exception as exc:  # one check's failure must not hide the others' figures
                check(name, False, f"{type(exc).__name__}: {exc}")
    failed = [name for name, ok in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
