"""Small models and datasets shared by the tests."""

from __future__ import annotations

import torch

from thrifty.demo.model import GPT, GPTConfig


def tiny_gpt(dropout: float = 0.0, n_layer: int = 4, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=32, block_size=32, dropout=dropout))


class TokenDataset(torch.utils.data.Dataset):
    """Random byte windows; `pad` gives each sample a different number of real tokens."""

    def __init__(self, n: int = 64, block: int = 32, pad: bool = False, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 256, (n, block + 1), generator=g)
        self.lengths = torch.randint(1, block + 1, (n,), generator=g) if pad else None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"input_ids": self.x[i, :-1], "targets": self.x[i, 1:]}
        if self.lengths is not None:
            mask = torch.zeros(self.x.shape[1] - 1, dtype=torch.bool)
            mask[: self.lengths[i]] = True
            item["loss_mask"] = mask
        return item


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it was asked to apply."""

    def step(self, closure=None):  # type: ignore[override]
        self.seen = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]
        return super().step(closure)


class BurnDataset(torch.utils.data.Dataset):
    """Each item costs `ms` milliseconds of pure CPU work (think decoding and augmenting)."""

    def __init__(self, n: int = 256, ms: float = 4.0) -> None:
        self.n = n
        self.ms = ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        import time

        end = time.perf_counter() + self.ms / 1e3
        x = 0
        while time.perf_counter() < end:
            x += 1
        return torch.full((8,), float(i))
