"""GPT-2 124M on one GPU: the best plain PyTorch loop against thrifty, side by side in one run.

The model is GPT-2 small as nanoGPT writes it (12 layers, 12 heads, 768 wide, vocabulary
50,304, context 1,024, tied embeddings, attention through SDPA), trained on generated tokens
(a random walk over the vocabulary, so there is something to learn and nothing to download),
0.5M tokens (512 sequences) per optimizer step. The arms, in this order:

  (a) plain: the best plain loop: bf16 autocast, torch.compile, fused AdamW, the largest
      micro-batch that fits (the largest power of two whose eager step fits; compiled steps
      take less memory), gradient accumulation to 512 sequences, batches already pinned;
  (c) thrifty as (a): `thrifty train` with (a)'s settings, measurement on: the Trainer's cost
      (c)/(a), which must stay above 0.99;
  (f) fp8: (a) with torchao's float8 linears (tensorwise scaling), the same init and data:
      tokens/s, and the loss parity check thrifty applies (within 0.01 nats of (a));
  (b) thrifty: `thrifty tune` on the config as a user writes it (precision auto, micro auto,
      compile off, workers auto), with no flags (its default budget, 10 minutes, unless
      --tune-budget or --deadline says otherwise), then `thrifty train` on its winner. The
      tune's trials run one after another in its warm worker (`thrifty.search.engine`): CUDA
      is initialised once and a compiled arm compiled once, so its paired comparisons of
      torch.compile fit in the budget; the tune's record keeps each trial's wall seconds and
      the tune's own, to show what deciding cost.

Printed: tokens/s, MFU by nanoGPT's formula (6N + 12·L·H·Q·T FLOPs per token, N without the
position embedding) against the dense bf16 peak of an H100/H200 SXM (989 TFLOP/s) and against
the peak measured here (an 8192³ bf16 matmul), peak memory, and the ratios to (a). Everything
also goes to --out as gpt2_124m.json, with the tune's report.

Without a GPU (or with --tiny) the same code runs a tiny GPT (2 layers, 64 wide, vocabulary
512, context 64, 8 sequences a step) on the CPU, so `make test` covers it; those figures mean
nothing.

    python benchmarks/gpt2_124m.py [--out DIR] [--steps 10] [--tune-budget 10m] [--tiny]
                                   [--deadline SECONDS] [--arms plain,thrifty-as-plain,fp8,thrifty]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
H100_BF16_DENSE = 989e12  # H100/H200 SXM dense bf16 tensor-core peak (NVIDIA's datasheet)
PUBLISHED = 466_000  # tokens/s, the best public single-H100 PyTorch figure for this model


# --- the model, as nanoGPT writes it ---------------------------------------------------------


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50304  # 50,257 rounded up to a multiple of 64
    block_size: int = 1024


TINY = {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 512, "block_size": 64}


class SelfAttention(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd)
        self.attn = SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """`forward(input_ids, targets)` returns the mean cross-entropy."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    def num_params(self) -> int:
        """nanoGPT's count: every parameter (the tied head once) but the position embedding."""
        return sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()


def build_model(**kwargs: Any) -> GPT2:
    return GPT2(GPT2Config(**kwargs))


class WalkTokens(torch.utils.data.Dataset):
    """Generated sequences: a random walk over the vocabulary, steps of 0 to 3. Item i is the
    same in every process and run (seeded by i), so arms that read the same items see the
    same data; the best loss is ln 4 ≈ 1.39 nats."""

    def __init__(self, block_size: int = 1024, vocab_size: int = 50304, samples: int = 1 << 20):
        self.block_size, self.vocab_size, self.samples = block_size, vocab_size, samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        start = torch.randint(self.vocab_size, (1,), generator=g)
        steps = torch.randint(4, (self.block_size,), generator=g)
        walk = start + torch.cat([torch.zeros(1, dtype=torch.long), steps.cumsum(0)])
        walk = walk % self.vocab_size
        return {"input_ids": walk[:-1], "targets": walk[1:]}


def train_dataset(block_size: int = 1024, vocab_size: int = 50304) -> WalkTokens:
    return WalkTokens(block_size, vocab_size)


def flops_per_token(cfg: GPT2Config, params: int) -> float:
    """nanoGPT's estimate: 6N for the weights' matmuls, 12·L·H·Q·T for attention."""
    head = cfg.n_embd // cfg.n_head
    return 6 * params + 12 * cfg.n_layer * cfg.n_head * head * cfg.block_size


# --- the plain loop ----------------------------------------------------------------------------


@dataclass
class Arm:
    name: str
    tokens_per_second: float | None = None
    micro: int | None = None
    peak_memory_gib: float | None = None
    losses: list[float] | None = None
    note: str = ""
    error: str | None = None


def peak_bf16_flops(device: torch.device) -> float | None:
    """The dense bf16 matmul rate measured here: 8192³ products, after a warm-up."""
    if device.type != "cuda":
        return None
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize(device)
    runs = 20
    start = time.perf_counter()
    for _ in range(runs):
        a @ b
    torch.cuda.synchronize(device)
    rate = 2 * n**3 * runs / (time.perf_counter() - start)
    del a, b
    torch.cuda.empty_cache()
    return rate


def batches(micro: int, count: int, cfg: GPT2Config, device: torch.device) -> list[dict]:
    """The first `count` micro-batches of the dataset in order, pinned on a GPU's host."""
    data = WalkTokens(cfg.block_size, cfg.vocab_size)
    out = []
    for i in range(count):
        items = [data[i * micro + j] for j in range(micro)]
        batch = {k: torch.stack([item[k] for item in items]) for k in items[0]}
        if device.type == "cuda":
            batch = {k: v.pin_memory() for k, v in batch.items()}
        out.append(batch)
    return out


def optimizer_for(model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """AdamW as nanoGPT sets it: decay on matrices only, fused on a GPU."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=6e-4, betas=(0.9, 0.95), fused=device.type == "cuda" or None
    )


def largest_micro(cfg: GPT2Config, effective: int, device: torch.device) -> int:
    """The largest power of two dividing `effective` whose eager bf16 step fits."""
    if device.type != "cuda":
        return min(effective, 4)
    torch.manual_seed(0)
    model = GPT2(cfg).to(device)
    micro = effective
    while micro > 1:
        try:
            x = torch.randint(cfg.vocab_size, (micro, cfg.block_size), device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, x)
            loss.backward()
            break
        except torch.OutOfMemoryError:
            pass
        finally:
            model.zero_grad(set_to_none=True)
            x = loss = None  # type: ignore[assignment]
            gc.collect()
            torch.cuda.empty_cache()
        micro //= 2
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return micro


@dataclass(frozen=True)
class Job:
    """What every arm trains: the model, the micro-batch and effective batch (sequences), the
    steps timed after the warm-up ones, and the device."""

    cfg: GPT2Config
    micro: int
    effective: int
    steps: int
    warmup: int
    device: torch.device


def plain_loop(
    name: str,
    job: Job,
    compile_model: bool,
    prepare: Callable[[nn.Module], str] | None = None,
) -> Arm:
    """Train `warmup + steps` optimizer steps; tokens/s over the last `steps`, timed with a
    device sync at each end and none in between; the losses of every step."""
    cfg, micro, effective, device = job.cfg, job.micro, job.effective, job.device
    steps, warmup = job.steps, job.warmup
    accumulation = effective // micro
    data = batches(micro, accumulation * (warmup + steps), cfg, device)
    torch.manual_seed(0)
    model = GPT2(cfg).to(device)
    note = prepare(model) if prepare is not None else ""
    optimizer = optimizer_for(model, device)
    forward = torch.compile(model) if compile_model else model
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if device.type == "cuda"
        else contextlib.nullcontext()
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses: list[torch.Tensor] = []
    it = iter(data)
    started = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            _sync(device)
            started = time.perf_counter()
        total = torch.zeros((), device=device)
        for _ in range(accumulation):
            batch = {k: v.to(device, non_blocking=True) for k, v in next(it).items()}
            with autocast:
                loss = forward(**batch) / accumulation
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total)
    _sync(device)
    seconds = time.perf_counter() - started
    arm = Arm(
        name,
        tokens_per_second=steps * effective * cfg.block_size / seconds,
        micro=micro,
        peak_memory_gib=_peak_gib(device),
        losses=[float(v) for v in torch.stack(losses).tolist()],
        note=note,
    )
    del model, optimizer, forward, data
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return arm


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


# --- the thrifty arms ----------------------------------------------------------------------------


def config_text(
    cfg: GPT2Config, effective: int, steps: int, device: str, settings: dict[str, Any]
) -> str:
    """The config a user writes for this job, with `settings` ("section.key": value) set."""
    sections: dict[str, dict[str, Any]] = {
        "run": {"name": "gpt2-124m", "max_steps": steps, "device": device, "log_every": 5},
        "precision": {"mode": "auto"},
        "batch": {"micro": "auto", "effective": effective},
        "optimizer": {
            "name": "adamw",
            "lr": 6e-4,
            "weight_decay": 0.1,
            "betas": [0.9, 0.95],
            "grad_clip": 1.0,
        },
        "data": {"num_workers": "auto"},
        "compile": {"mode": "off"},
        "checkpoint": {"every": "off", "final": False},
        "task": {
            "model": "gpt2_124m:build_model",
            "train_data": "gpt2_124m:train_dataset",
            "model_args": asdict(cfg),
            "data_args": {"block_size": cfg.block_size, "vocab_size": cfg.vocab_size},
        },
    }
    for key, value in settings.items():
        section, name = key.split(".", 1)
        sections[section][name] = value
    import tomli_w

    return tomli_w.dumps(sections)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(HERE), str(ROOT / "src"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def thrifty(args: list[str], log: Path, timeout: float) -> int:
    """`python -m thrifty ARGS`, its output shown and kept in `log`; sent SIGTERM (thrifty's
    stop: exit 75, work kept) after `timeout` seconds, killed a minute later."""
    command = [sys.executable, "-m", "thrifty", *args]
    print("$ thrifty " + " ".join(args), flush=True)
    with open(log, "w") as f:
        process = subprocess.Popen(
            command, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        stop = threading.Timer(timeout, process.terminate)
        kill = threading.Timer(timeout + 60, process.kill)
        stop.start()
        kill.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                sys.stdout.write(line)
                f.write(line)
            return process.wait()
        finally:
            stop.cancel()
            kill.cancel()


def thrifty_train(name: str, config: Path, out: Path, timeout: float) -> Arm:
    run_dir = out / f"run-{name}"
    code = thrifty(["train", str(config), "--out", str(run_dir)], out / f"{name}.log", timeout)
    summary_path = run_dir / "summary.json"
    if code != 0 or not summary_path.exists():
        return Arm(name, error=f"thrifty train exited {code}; see {name}.log")
    summary = json.loads(summary_path.read_text())
    peak = summary.get("peak_memory_bytes")
    return Arm(
        name,
        tokens_per_second=summary.get("tokens_per_second"),
        micro=summary.get("micro_batch"),
        peak_memory_gib=peak / 2**30 if peak else None,
        note=f"precision {summary.get('precision')}, accumulation "
        f"{summary.get('accumulation_steps')}",
    )


# --- the run ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where the runs and gpt2_124m.json go (default: a temp dir)")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per arm")
    parser.add_argument(
        "--tune-budget",
        default=None,
        help="the tune's --budget (default: "
        "tune's own, 10m; with --deadline, the time left less the winner's run)",
    )
    parser.add_argument(
        "--tune-levers",
        default=None,
        help="the tune's --levers (default: none given, all levers; the CPU test names one)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds the whole benchmark may take (default: no limit)",
    )
    parser.add_argument("--tiny", action="store_true", help="the tiny CPU model, even on a GPU")
    parser.add_argument(
        "--arms",
        default="plain,thrifty-as-plain,fp8,thrifty",
        help="which arms to run, in order (default all)",
    )
    args = parser.parse_args(argv)
    began = time.monotonic()
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    cfg = GPT2Config() if cuda else GPT2Config(**TINY)
    effective = 512 if cuda else 8
    warmup = 3 if cuda else 1
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="thrifty-gpt2-"))
    out.mkdir(parents=True, exist_ok=True)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    params = GPT2(cfg).num_params()
    fpt = flops_per_token(cfg, params)
    result: dict[str, Any] = {
        "machine": machine(device),
        "model": {**asdict(cfg), "params_nanogpt": params, "flops_per_token": fpt},
        "effective_tokens": effective * cfg.block_size,
        "peak_dense_bf16": H100_BF16_DENSE if cuda else None,
        "arms": {},
    }
    measured_peak = peak_bf16_flops(device)
    result["peak_measured"] = measured_peak
    print(f"{result['machine']}; N = {params:,}, {fpt / 1e6:.0f} MFLOP per token", flush=True)
    if measured_peak:
        print(f"measured bf16 matmul peak: {measured_peak / 1e12:.0f} TFLOP/s", flush=True)

    def record(arm: Arm) -> Arm:
        result["arms"][arm.name] = asdict(arm)
        (out / "gpt2_124m.json").write_text(json.dumps(result, indent=2))
        print(
            f"{arm.name}: {describe(arm, fpt, result['peak_dense_bf16'], measured_peak)}",
            flush=True,
        )
        return arm

    def left() -> float:
        if args.deadline is None:
            return 3600.0
        return args.deadline - (time.monotonic() - began)

    micro = largest_micro(cfg, effective, device)
    job = Job(cfg, micro, effective, args.steps, warmup, device)
    plain: Arm | None = None
    if "plain" in arms:
        plain = record(
            guarded(
                "plain",
                lambda: plain_loop("plain", job, compile_model=cuda),
            )
        )
    if "thrifty-as-plain" in arms:
        settings = {
            "precision.mode": "bf16" if cuda else "fp32",
            "batch.micro": micro,
            "compile.mode": "default" if cuda else "off",
            "data.num_workers": 4 if cuda else 0,
            "run.max_steps": warmup + args.steps,
        }
        path = out / "thrifty-as-plain.toml"
        path.write_text(config_text(cfg, effective, warmup + args.steps, device.type, settings))
        record(thrifty_train("thrifty-as-plain", path, out, timeout=max(60.0, left())))
    if "fp8" in arms:
        record(fp8_arm(job, plain))
    if "thrifty" in arms:
        given = out / "gpt2-124m.toml"
        given.write_text(config_text(cfg, effective, warmup + args.steps, device.type, {}))
        budget = args.tune_budget
        if budget is None and args.deadline is not None:
            budget = f"{max(30, int(left() - 90))}s"
        tune_dir = out / "tune"
        code = thrifty(
            [
                "tune",
                str(given),
                *(["--budget", budget] if budget else []),
                *(["--levers", args.tune_levers] if args.tune_levers else []),
                "--out",
                str(tune_dir),
            ],
            out / "tune.log",
            timeout=max(60.0, left()),
        )
        winner = tune_dir / "winner.toml"
        if winner.exists():
            record(thrifty_train("thrifty", winner, out, timeout=max(60.0, left())))
            with contextlib.suppress(OSError, ValueError):
                result["tune"] = summary_of_tune(json.loads((tune_dir / "tune.json").read_text()))
        else:
            record(Arm("thrifty", error=f"thrifty tune exited {code} with no winner"))
    print(table(result, fpt, measured_peak), flush=True)
    (out / "gpt2_124m.json").write_text(json.dumps(result, indent=2))
    print(f"output in {out}", flush=True)
    return 0


def guarded(name: str, run: Callable[[], Arm]) -> Arm:
    """An arm that failed is a row saying why, not the end of the benchmark."""
    try:
        return run()
    except Exception as exc:  # the other arms still run
        return Arm(name, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")


def fp8_arm(job: Job, plain: Arm | None) -> Arm:
    """The plain loop with float8 linears, and its loss against the plain loop's."""
    from thrifty.levers.fp8 import convert_to_fp8, fp8_unavailable, parity

    why = fp8_unavailable(job.device)
    if why is not None:
        return Arm("fp8", note=f"not run: {why}")

    def prepare(model: nn.Module) -> str:
        return f"{convert_to_fp8(model)} linears in float8"

    arm = guarded(
        "fp8",
        lambda: plain_loop("fp8", job, compile_model=True, prepare=prepare),
    )
    if arm.losses and plain is not None and plain.losses:
        arm.note += "; " + parity(plain.losses, arm.losses).describe()
    return arm


def summary_of_tune(report: dict[str, Any]) -> dict[str, Any]:
    keep = ("winner", "unit", "stopped_early", "pruned", "not_reached", "checks", "wall_seconds")
    out = {k: report.get(k) for k in keep}
    out["trials"] = [
        {
            k: t.get(k)
            for k in ("name", "setting", "status", "tokens_per_second", "wall_seconds", "error")
        }
        for t in report.get("trials", [])
    ]
    out["comparisons"] = [c.get("line") for c in report.get("comparisons", [])]
    return out


def machine(device: torch.device) -> str:
    if device.type != "cuda":
        return f"CPU ({platform.processor() or platform.machine()}), torch {torch.__version__}"
    props = torch.cuda.get_device_properties(device)
    driver = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
    return (
        f"{props.name}, {props.total_memory / 2**30:.0f} GiB, driver {driver or '?'}, "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}"
    )


def describe(arm: Arm, fpt: float, dense: float | None, measured_peak: float | None) -> str:
    """One arm in a line; MFU against `dense` (the datasheet's peak, None on a CPU) and the
    peak measured here."""
    if arm.error:
        return f"failed: {arm.error}"
    if arm.tokens_per_second is None:
        return arm.note or "no figure"
    parts = [f"{arm.tokens_per_second:,.0f} tokens/s"]
    if dense:
        parts.append(f"MFU {arm.tokens_per_second * fpt / dense:.1%} of {dense / 1e12:.0f} TFLOP/s")
    if measured_peak:
        parts.append(f"{arm.tokens_per_second * fpt / measured_peak:.1%} of measured")
    if arm.micro:
        parts.append(f"micro {arm.micro}")
    if arm.peak_memory_gib is not None:
        parts.append(f"peak {arm.peak_memory_gib:.1f} GiB")
    if arm.note:
        parts.append(arm.note)
    return ", ".join(parts)


def table(result: dict[str, Any], fpt: float, measured_peak: float | None) -> str:
    arms, dense = result["arms"], result["peak_dense_bf16"]
    plain = (arms.get("plain") or {}).get("tokens_per_second")
    lines = ["", "arm                tokens/s    MFU(989)  MFU(meas.)  peak GiB  vs plain"]
    for name, arm in arms.items():
        rate = arm.get("tokens_per_second")
        if rate is None:
            lines.append(f"{name:<18} {arm.get('error') or arm.get('note') or '-'}")
            continue
        mfu = f"{rate * fpt / dense:.1%}" if dense else "-"
        meas = f"{rate * fpt / measured_peak:.1%}" if measured_peak else "-"
        peak = arm.get("peak_memory_gib")
        ratio = f"{rate / plain:.3f}" if plain else "-"
        lines.append(
            f"{name:<18} {rate:>10,.0f}  {mfu:>8}  {meas:>10}  "
            f"{'-' if peak is None else f'{peak:.1f}':>8}  {ratio:>8}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
