"""run.max_tokens on the batch shapes people bring (nanoGPT's `(x, y)` tuples, dicts, lists of
token-id tensors) ends the run where it should, or is refused before training in one line when
the batches hold no tokens; and nanoGPT-style models given a loss_fn get one line naming the
fix, not a raw error from inside fit()."""

from __future__ import annotations

import sys

import pytest
import torch

from test_cli import run_cli
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ConfigError, ThriftyError
from thrifty.levers.accumulation import count_tokens

BLOCK = 8  # tokens a sample
VOCAB = 16

# A project as a user writes it: a nanoGPT-like model (forward(idx, targets=None) returns
# (logits, loss), the loss None without targets), its data as (x, y) pairs, and loss_fns.
PROJECT = f"""
import torch
from torch import nn
from torch.nn import functional as F

BLOCK, VOCAB = {BLOCK}, {VOCAB}


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.wte = nn.Embedding(VOCAB, 16)
        self.block = nn.Linear(16, 16)
        self.lm_head = nn.Linear(16, VOCAB)

    def forward(self, idx, targets=None):
        logits = self.lm_head(torch.relu(self.block(self.wte(idx))))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


class Features(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x, y):
        return F.mse_loss(self.lin(x), y)


class Pairs(torch.utils.data.Dataset):
    # nanoGPT's get_batch, as a dataset: x a window of tokens, y the same window one later.
    def __init__(self, n=64):
        g = torch.Generator().manual_seed(1)
        self.tokens = torch.randint(0, VOCAB, (n + BLOCK + 1,), generator=g)
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.tokens[i : i + BLOCK], self.tokens[i + 1 : i + 1 + BLOCK]


def model():
    return TinyGPT()


def features_model():
    return Features()


def pairs():
    return Pairs()


def floats():
    return torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 2))


def second_item(out, batch):
    # The loss the model returns: None, as the model is called without its target.
    return out[1]


def unflattened(out, batch):
    return F.cross_entropy(out[0], batch[1])
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "tokensproj.py").write_text(PROJECT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("tokensproj", None)
    import tokensproj

    config = tmp_path / "job.toml"
    config.write_text(
        '[run]\nmax_tokens = 100\nprogress = "off"\n[batch]\nmicro = 4\n[data]\n'
        'num_workers = 0\n[schedule]\ndecay = "constant"\n[task]\nmodel = "tokensproj:model"\n'
        'train_data = "tokensproj:pairs"\n'
    )
    yield tokensproj, config
    sys.modules.pop("tokensproj", None)


def config(tmp_path, **run) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {"device": "cpu", "out": str(tmp_path / "r"), "progress": "off", **run},
            "batch": {"micro": 4},
            "data": {"num_workers": 0, "shuffle": False},
            "schedule": {"decay": "constant"},
        }
    )


def test_max_tokens_ends_a_nanogpt_shaped_run_at_the_step_that_reaches_it(tmp_path, project):
    module, _ = project
    # 4 samples of 8 tokens a step: 96 tokens after step 3, 128 after step 4 >= 100.
    cfg = config(tmp_path, max_tokens=100, max_steps=20)  # max_steps: a budget never reached
    result = Trainer(module.model(), module.pairs(), cfg).fit()
    assert (result.steps, result.tokens, result.stop_reason) == (4, 128, "max_tokens")
    assert result.tokens_per_second is not None and result.tokens_per_second > 0


def test_tokens_are_counted_in_tuples_dicts_and_lists_of_token_ids():
    x = torch.zeros(4, BLOCK, dtype=torch.long)
    assert count_tokens((x, x)) == count_tokens([x, x]) == count_tokens({"idx": x}) == 32
    assert count_tokens({"batch": [x.int(), x]}) == 32
    # Not token ids: float features, one class label a sample, uint8 images.
    assert count_tokens((torch.randn(4, 12), torch.zeros(4, dtype=torch.long))) == 0
    assert count_tokens(torch.zeros(4, 3, 8, 8, dtype=torch.uint8)) == 0


REFUSED = (
    "run.max_tokens = 100 counts tokens, but the batches hold no token ids (an input_ids or "
    "loss_mask, or a 2-D int64 tensor; a batch holds float32 (1, 4), float32 (1, 2)): use "
    "run.max_steps, run.max_time or run.max_epochs"
)


def test_max_tokens_on_batches_without_tokens_is_refused_before_training(tmp_path, project):
    module, _ = project
    with pytest.raises(ConfigError) as caught:
        Trainer(module.features_model(), module.floats(), config(tmp_path, max_tokens=100))
    assert str(caught.value) == REFUSED
    assert not (tmp_path / "r").exists()  # refused before the run directory was made


def test_max_tokens_without_tokens_exits_2_on_the_command_line(capsys, project, tmp_path):
    _, job = project
    args = [
        "--set",
        "task.model=tokensproj:features_model",
        "--set",
        "task.train_data=tokensproj:floats",
        "--set",
        "run.max_steps=40",  # a budget the refusal comes before; it bounds a run not refused
    ]
    code, _, err = run_cli(capsys, "train", str(job), "--out", str(tmp_path / "r"), *args)
    assert code == 2, err
    assert err.strip() == f"thrifty: error: {REFUSED}"


WITHOUT_TARGET = (
    "loss_fn found no loss: given a loss_fn, thrifty calls the model on all but the batch's last "
    "item (the target), so TinyGPT returned ((4, 8, 16), None), with no loss in it. The model "
    "computes its own loss when given its target: drop loss_fn"
)
UNFLATTENED = (
    "it was given the model's output of shapes ((4, 8, 16), None) and a batch of shapes "
    "((4, 8), (4, 8)): cross_entropy takes logits (N, vocab) and targets (N,), so flatten the "
    "positions into N: F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))"
)


@pytest.mark.parametrize(
    ("loss_fn", "message"),
    [("second_item", WITHOUT_TARGET), ("unflattened", UNFLATTENED)],
)
def test_a_nanogpt_model_given_a_loss_fn_gets_one_line_naming_the_fix(
    tmp_path, project, loss_fn, message
):
    module, _ = project
    cfg = config(tmp_path, max_steps=2)
    with pytest.raises(ThriftyError) as caught:
        Trainer(module.model(), module.pairs(), cfg, loss_fn=getattr(module, loss_fn)).fit()
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    if loss_fn == "unflattened":
        assert str(caught.value).startswith("loss_fn(output, batch) raised ")


@pytest.mark.parametrize(
    ("loss_fn", "message"),
    [("second_item", WITHOUT_TARGET), ("unflattened", UNFLATTENED)],
)
def test_a_loss_fn_error_exits_2_on_the_command_line(capsys, project, tmp_path, loss_fn, message):
    _, job = project
    args = ["--set", "run.max_steps=2", "--set", f"task.loss_fn=tokensproj:{loss_fn}"]
    code, _, err = run_cli(capsys, "train", str(job), "--out", str(tmp_path / "r"), *args)
    assert code == 2, err
    assert err.startswith("thrifty: error: loss_fn") and message in err, err
    assert len(err.strip().splitlines()) == 1, err
