"""benchmarks/gpt2_124m.py: the GPU proof's model is GPT-2 124M as nanoGPT counts it, and its
CPU fallback runs every arm (the plain loop, thrifty with the plain loop's settings, FP8's
refusal, tune and its winner) end to end, so the GPU run's code path is exercised here."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "gpt2_124m.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpt2_124m", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpt2_124m"] = module  # its dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpt2_124m", None)


def test_the_model_is_gpt2_small_as_nanogpt_counts_it(bench):
    model = bench.GPT2(bench.GPT2Config())
    total = sum(p.numel() for p in model.parameters())
    assert total == 124_475_904  # tied head counted once; vocabulary 50,304
    assert model.lm_head.weight is model.wte.weight
    n = model.num_params()
    assert n == total - 1024 * 768  # nanoGPT leaves the position embedding out
    # 6N for the weights' matmuls, forward and backward, plus attention's 12·L·H·Q·T.
    assert bench.flops_per_token(bench.GPT2Config(), n) == 6 * n + 12 * 12 * 12 * 64 * 1024
    # At the best public single-H100 figure, 466,000 tokens/s, that is about 40% MFU.
    mfu = 466_000 * bench.flops_per_token(bench.GPT2Config(), n) / bench.H100_BF16_DENSE
    assert mfu == pytest.approx(0.403, abs=0.002)


def test_the_generated_tokens_are_the_same_in_every_process_and_learnable(bench):
    data = bench.WalkTokens(block_size=64, vocab_size=512)
    a, b = data[7], bench.WalkTokens(block_size=64, vocab_size=512)[7]
    assert a["input_ids"].equal(b["input_ids"]) and a["targets"].equal(b["targets"])
    assert a["targets"][:-1].equal(a["input_ids"][1:])
    steps = (a["targets"] - a["input_ids"]) % 512
    assert set(steps.tolist()) <= {0, 1, 2, 3}  # a walk: ln 4 nats is the best loss


def test_the_cpu_fallback_runs_every_arm_and_writes_the_table(bench, tmp_path, capsys):
    # The benchmark's main here (its thrifty arms are processes of their own, as on the GPU).
    out = tmp_path / "bench"
    argv = [
        "--tiny",
        "--out",
        str(out),
        "--steps",
        "2",
        "--tune-budget",
        "5m",
        "--tune-levers",
        "precision",  # on this CPU nothing to try: the tune ends after the config as given
    ]
    code = bench.main(argv)
    done = capsys.readouterr()
    assert code == 0, done.out[-3000:] + done.err[-3000:]
    result = json.loads((out / "gpt2_124m.json").read_text())
    arms = result["arms"]
    assert list(arms) == ["plain", "thrifty-as-plain", "fp8", "thrifty"]
    for name in ("plain", "thrifty-as-plain", "thrifty"):
        assert arms[name]["error"] is None and arms[name]["tokens_per_second"] > 0, arms[name]
    assert len(arms["plain"]["losses"]) == 1 + 2  # warm-up and timed steps, each recorded
    assert all(math.isfinite(x) for x in arms["plain"]["losses"])
    assert arms["fp8"]["note"].startswith("not run: FP8 needs a CUDA GPU")
    tune = result["tune"]
    assert tune["winner"] and tune["trials"][0]["name"] == "00-baseline"
    # What tune left out, and why, as its tune.json says it (lists, even when empty).
    assert all(isinstance(tune[k], list) for k in ("pruned", "not_reached", "checks")), tune
    assert "vs plain" in done.out and "thrifty-as-plain" in done.out
