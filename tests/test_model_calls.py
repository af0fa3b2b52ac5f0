"""Models as people write them: an `nn.Sequential` on `(x, y)` batches without a loss_fn is
one line naming the fix, and a model written as nanoGPT and minGPT write it,
`forward(idx, targets)` returning `(logits, loss)`, trains as it is."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from thrifty import Trainer, cli
from thrifty.config import TrainConfig
from thrifty.errors import ThriftyError


def config(tmp_path, name: str) -> TrainConfig:
    run = {"max_steps": 3, "device": "cpu", "out": str(tmp_path / name), "progress": "off"}
    return TrainConfig.from_dict(
        {
            "run": run,
            "batch": {"micro": 8},
            "precision": {"mode": "fp32"},
            "data": {"num_workers": 0, "shuffle": False},
            "checkpoint": {"final": False},
        }
    )


def pairs() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g))


def test_a_sequential_on_pairs_without_loss_fn_is_one_line_naming_loss_fn(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    with pytest.raises(ThriftyError) as caught:
        Trainer(model, pairs(), config=config(tmp_path, "seq")).fit()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "Sequential.forward(input) cannot take the batch's 2 items as positional arguments: "
        "give loss_fn(output, batch)"
    )
    assert "takes 2 positional arguments but 3 were given" in message  # Python's own words


def test_the_same_from_the_command_line_is_exit_2_and_one_line(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text(
        '[run]\nmax_steps = 2\ndevice = "cpu"\n[data]\nnum_workers = 0\n'
        '[task]\nmodel = "dist_task:model"\ntrain_data = "dist_task:train_data"\n'
    )
    assert cli.main(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("thrifty: ")]
    assert err[-1].startswith(
        "thrifty: error: Net.forward(x) cannot take the batch's 2 "
        "items as positional arguments: give loss_fn(output, batch)"
    )
    assert "Traceback" not in capsys.readouterr().err


class NanoGPTStyle(nn.Module):
    """forward(idx, targets=None) -> (logits, loss), as nanoGPT's and minGPT's GPT."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte = nn.Embedding(32, 16)
        self.lm_head = nn.Linear(16, 32)

    def forward(self, idx, targets=None):
        logits = self.lm_head(self.wte(idx))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, 32), targets.view(-1))


class LossOnly(NanoGPTStyle):
    def forward(self, idx, targets=None):
        return super().forward(idx, targets)[1]


def tokens() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (64, 12), generator=g)
    return TensorDataset(x, torch.roll(x, -1, 1))


def test_a_nanogpt_style_model_trains_as_it_is_exactly_as_one_returning_its_loss(tmp_path):
    tupled, plain = NanoGPTStyle(), LossOnly()
    assert all(a.equal(b) for a, b in zip(tupled.parameters(), plain.parameters(), strict=True))
    first = Trainer(tupled, tokens(), config=config(tmp_path, "tuple")).fit()
    second = Trainer(plain, tokens(), config=config(tmp_path, "loss")).fit()
    assert first.steps == second.steps == 3
    assert first.train_loss == second.train_loss
    for a, b in zip(tupled.parameters(), plain.parameters(), strict=True):
        assert a.equal(b)
    assert not tupled.lm_head.weight.equal(NanoGPTStyle().lm_head.weight)  # it did train


class TwoScalars(NanoGPTStyle):
    def forward(self, idx, targets=None):
        logits, loss = super().forward(idx, targets)
        return loss, loss.detach() * 2


def test_a_tuple_with_two_scalars_is_ambiguous_and_says_so(tmp_path):
    with pytest.raises(ThriftyError, match=r"returned a tuple, not a loss: .*\(logits, loss\)"):
        Trainer(TwoScalars(), tokens(), config=config(tmp_path, "two")).fit()


class RaisesInside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 2)

    def forward(self, x, y):
        return len(x.shape, 1)  # a TypeError of the user's own code


def test_a_type_error_inside_forward_is_the_users_and_is_not_renamed(tmp_path):
    with pytest.raises(TypeError, match="len\\(\\) takes exactly one argument"):
        Trainer(RaisesInside(), pairs(), config=config(tmp_path, "inside")).fit()


class Padded(torch.utils.data.Dataset):
    """Sequences of 12 slots holding 3 to 12 real tokens, right-padded, with their mask."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        real = 3 + i % 10
        mask = torch.zeros(12, dtype=torch.long)
        mask[:real] = 1
        ids = torch.arange(12) % 32 * mask
        return {"input_ids": ids, "attention_mask": mask, "targets": torch.roll(ids, -1)}


class MaskedLM(NanoGPTStyle):
    def forward(self, input_ids, attention_mask, targets):
        logits = self.lm_head(self.wte(input_ids))
        return F.cross_entropy(logits.view(-1, 32), targets.view(-1))


def test_padding_is_no_token_in_the_runs_counts(tmp_path):
    from thrifty.levers.accumulation import count_tokens

    data = Padded()
    real = sum(int(data[i]["attention_mask"].sum()) for i in range(len(data)))
    assert real < 32 * 12
    result = Trainer(MaskedLM(), data, config=config(tmp_path, "padded")).fit()
    assert result.steps == 3
    seen = [data[i] for i in range(24)]  # 3 steps of 8, in order (shuffle off)
    assert result.tokens == sum(int(s["attention_mask"].sum()) for s in seen)
    # A float mask (additive, 0 and -inf) is not a padding mask: every slot counts.
    additive = {
        "input_ids": torch.zeros(2, 5, dtype=torch.long),
        "attention_mask": torch.zeros(2, 5),
    }
    assert count_tokens(additive) == 10
