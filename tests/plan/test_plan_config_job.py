"""`thrifty plan CONFIG.toml`: a training config priced from its own model and budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from thrifty.plan.catalog import load_catalog

TASK = '''
import torch
from torch import nn


class LM(nn.Module):
    """An embedding and one linear head: forward FLOPs are 2 x seq x dim x vocab."""

    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, x, y):
        logits = self.out(self.emb(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())


def lm(vocab=64, dim=32):
    return LM(vocab, dim)


def data(n=100, seq_len=16):
    x = torch.randint(0, 64, (n, seq_len), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.TensorDataset(x, x)
'''
SEQ, DIM, VOCAB = 16, 32, 64
# Forward 2*seq*dim*vocab; backward twice that (the input's and the weight's gradients). The
# embedding is a lookup: no FLOPs.
FLOPS_PER_SAMPLE = 3 * 2 * SEQ * DIM * VOCAB


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write the task module and a config with the budget given; return the config's name."""
    (tmp_path / "plan_config_task.py").write_text(TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield_names: list[str] = []

    def write(run: str, batch: str = "micro = 8", extra: str = "") -> str:
        name = f"job{len(yield_names)}.toml"
        yield_names.append(name)
        (tmp_path / name).write_text(
            '[task]\nmodel = "plan_config_task:lm"\ntrain_data = "plan_config_task:data"\n'
            f"data_args = {{ n = 100, seq_len = {SEQ} }}\n[run]\n{run}\n[batch]\n{batch}\n{extra}"
        )
        return name

    yield write
    sys.modules.pop("plan_config_task", None)


def _hours(flops: float, gpu: str, gpus: int = 1, mfu: float = 0.35) -> float:
    peak = load_catalog().gpu(gpu).peak_flops("bf16")
    return flops / (gpus * peak * mfu) / 3600


@pytest.mark.parametrize(
    ("run", "samples"),
    [
        ("max_steps = 1000", 1000 * 8),  # steps x effective batch (micro 8, one GPU)
        ("max_tokens = 64000", 64000 / SEQ),
        ("max_epochs = 30", 30 * 100),
        ("max_steps = 1000\nmax_epochs = 30", 30 * 100),  # the first budget reached ends it
    ],
)
def test_a_config_is_priced_from_its_counted_flops_and_its_budget(cli, job, run, samples) -> None:
    r = cli("plan", job(run), "--gpu", "A10G", "--json")
    assert r.code == 0, r.err
    est = json.loads(r.out)["estimate"]
    flops = FLOPS_PER_SAMPLE * samples
    assert est["flops"]["total"] == pytest.approx(flops)
    assert est["tokens"] == pytest.approx(samples * SEQ)
    assert est["instance"] == "g5.xlarge"  # the cheapest catalog instance with one A10G
    hours = _hours(flops, "A10G")
    assert est["hours"] == pytest.approx(hours)
    assert est["cost"]["on-demand"] == pytest.approx(hours * 1.006)
    assumed = " ".join(est["assumptions"])
    assert "counted on one sample's forward and backward" in assumed
    assert f"{SEQ} tokens per sample (task.data_args.seq_len)" in assumed


def test_max_time_caps_the_hours_when_it_ends_the_run_first(cli, job) -> None:
    # 1e9 steps would take far longer than the 30 s run.max_time allows.
    r = cli("plan", job('max_steps = 1000000000\nmax_time = "30s"'), "--gpu", "A10G", "--json")
    assert r.code == 0, r.err
    est = json.loads(r.out)["estimate"]
    assert est["hours"] == pytest.approx(30 / 3600)
    assert any("run.max_time (0.00833333 h) ends the run first" in a for a in est["assumptions"])


def test_a_config_on_a_spot_instance_is_priced_on_spot_and_under_commitments(cli, job) -> None:
    name = job("max_steps = 1000")
    r = cli("plan", name, "--instance", "p4d.24xlarge", "--mfu", "0.5", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    flops = FLOPS_PER_SAMPLE * 1000 * 8 * 8  # micro 8 on each of the instance's 8 GPUs
    hours = _hours(flops, "A100", gpus=8, mfu=0.5)
    assert data["estimate"]["hours"] == pytest.approx(hours)
    assert data["estimate"]["cost"]["spot"] == pytest.approx(hours * 8.0001)
    assert data["spot"]["work_hours"] == pytest.approx(hours)
    shares = {t["term"]: t["break_even_on_demand"] for t in data["commitment"]["terms"]}
    assert shares == pytest.approx({"1-year": 14.27 / 21.96, "3-year": 9.66 / 21.96})
    text = cli("plan", name, "--instance", "p4d.24xlarge").out
    for title in ("Job estimate", "FLOPs, counted", "Spot economics", "Commitments on p4d"):
        assert title in text


def test_the_cli_prints_the_dollars_for_a_bigger_budget(cli, job) -> None:
    samples = 10**13 * 8
    r = cli("plan", job("max_steps = 10000000000000"), "--gpu", "A10G")
    assert r.code == 0, r.err
    usd = _hours(FLOPS_PER_SAMPLE * samples, "A10G") * 1.006
    assert 100 < usd < 1000
    assert f"cost, on-demand   ${usd:,.2f} at $1.01/h" in r.out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "needs hardware: --instance NAME (e.g. g5.xlarge) or --gpu NAME"),
        (["--gpu", "A10G", "--params", "7B"], "gives the model and the budget: leave out --params"),
        (["--gpu", "A10G", "more.toml"], "give one training config"),
    ],
)
def test_a_config_without_what_it_needs_is_one_line(cli, job, args, expected) -> None:
    r = cli("plan", job("max_steps = 10"), *args)
    assert r.code == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert expected in line


def test_a_stream_with_an_epoch_budget_is_refused_in_one_line(cli, job, tmp_path) -> None:
    (tmp_path / "plan_config_stream.py").write_text(
        "import torch\n"
        "class S(torch.utils.data.IterableDataset):\n"
        "    def __iter__(self):\n"
        "        while True:\n"
        "            x = torch.zeros(16, dtype=torch.long)\n"
        "            yield x, x\n"
        "def stream(**kw):\n    return S()\n"
    )
    name = job("max_epochs = 2")
    text = (
        (tmp_path / name).read_text().replace("plan_config_task:data", "plan_config_stream:stream")
    )
    (tmp_path / name).write_text(text)
    r = cli("plan", name, "--gpu", "A10G")
    sys.modules.pop("plan_config_stream", None)
    assert r.code == 2
    (line,) = r.err.strip().splitlines()
    assert "run.max_epochs needs the training data's length" in line


def test_subcommands_still_parse_after_the_config_route(cli) -> None:
    r = cli("plan", "isoflop", "--help")
    assert r.code == 0 and "isoflop" in r.out
