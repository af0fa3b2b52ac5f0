"""A small real Lightning job for the integration tests: a LightningModule (a two-layer MLP
language model over token windows, no dropout) trained through `thrifty_pl.fit`.

python pl_job.py ROOT STEPS [--stop-at N] [--kill-saving N] [--loader plain|stateful]
- --stop-at N: during step N the job sends SIGTERM to its whole process group, from inside;
- --nan-at N: from step N on the loss is NaN;
- --kill-saving N: the process SIGKILLs itself while Lightning writes thrifty's save of step N;
- at the end the weights are saved to ROOT/final.pt for the test to compare.
"""

from __future__ import annotations

import argparse
import os
import signal

import lightning as L
import torch
from torch import nn

from thrifty.integrations import lightning as thrifty_pl


class Windows(torch.utils.data.Dataset):
    def __init__(self, n: int = 96, length: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 64, (n, length + 1), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i, :-1], self.x[i, 1:]


class TinyLM(L.LightningModule):
    def __init__(self, stop_at: int | None = None, nan_at: int | None = None) -> None:
        super().__init__()
        self.nan_at = nan_at
        self.embed = nn.Embedding(64, 32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64))
        self.stop_at = stop_at

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.mlp(self.embed(x))
        loss = nn.functional.cross_entropy(logits.view(-1, 64), y.reshape(-1))
        if self.nan_at is not None and self.trainer.global_step >= self.nan_at:
            return loss * float("nan")
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        # Lightning calls this after the callbacks' hook: sent once step N-1 is done, the
        # signal is heard at step N's boundary, as a signal arriving during step N is.
        if self.stop_at is not None and self.trainer.global_step == self.stop_at - 1:
            self.stop_at = None
            os.killpg(os.getpgid(0), signal.SIGTERM)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("steps", type=int)
    parser.add_argument("--stop-at", type=int)
    parser.add_argument("--kill-saving", type=int)
    parser.add_argument("--loader", default="stateful")
    parser.add_argument("--every", default="off")
    parser.add_argument("--nan-at", type=int)
    a = parser.parse_args()
    L.seed_everything(0, verbose=False)
    model = TinyLM(a.stop_at, a.nan_at)
    if a.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else:
        Loader = torch.utils.data.DataLoader  # noqa: N806
    loader = Loader(Windows(), batch_size=8, shuffle=True)
    trainer = L.Trainer(
        max_steps=a.steps,
        accelerator="cpu",
        devices=1,
        default_root_dir=a.root,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=2,
    )
    if a.kill_saving:
        save = trainer.save_checkpoint

        def killed_while_saving(path, *args, **kwargs):
            if str(path).endswith(f"step-{a.kill_saving}.ckpt"):
                with open(path, "wb") as f:
                    f.write(b"cut short")
                os.kill(os.getpid(), signal.SIGKILL)
            save(path, *args, **kwargs)

        trainer.save_checkpoint = killed_while_saving
    every = int(a.every) if a.every.isdigit() else a.every
    thrifty_pl.fit(
        trainer,
        model,
        train_dataloaders=loader,
        config={
            "cost": {"usd_per_gpu_hour": 3.6},
            "spot": {"provider": "none"},
            "checkpoint": {"every": every},
            "run": {"log_every": 2},
        },
    )
    torch.save(model.state_dict(), os.path.join(a.root, "final.pt"))


if __name__ == "__main__":
    main()
