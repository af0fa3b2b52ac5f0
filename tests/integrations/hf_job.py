"""A small real Hugging Face job for the integration tests: GPT-2 built from its config
(dropout off), trained by transformers' Trainer through `thrifty_hf.fit`.

python hf_job.py OUT STEPS [--stop-at N] [--kill-saving N] [--workers W]
- --stop-at N: during step N the job sends SIGTERM to its whole process group (as a spot
  machine's shutdown does), from inside, so the signal lands at a known step;
- --nan-at N: from step N on the loss is NaN (the logged gradient norm shows it);
- --kill-saving N: the process SIGKILLs itself while the Trainer writes checkpoint-N (after
  the model's weights, before the optimizer's state);
- at the end the model's weights are saved to OUT/final.pt for the test to compare.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from thrifty.integrations import transformers as thrifty_hf


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 96, length: int = 24) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 64, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        # thrifty's callback runs first: sent once step N-1 is done, the signal is heard at
        # step N's boundary, as a signal arriving during step N is.
        if state.global_step == self.step - 1:
            os.killpg(os.getpgid(0), signal.SIGTERM)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("steps", type=int)
    parser.add_argument("--stop-at", type=int)
    parser.add_argument("--kill-saving", type=int)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--nan-at", type=int)
    a = parser.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=a.out,
        max_steps=a.steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        save_strategy="steps" if a.save_steps else "no",
        save_steps=a.save_steps or 500,
        logging_steps=5,
        report_to=[],
        seed=0,
        use_cpu=True,
        dataloader_num_workers=a.workers,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    if a.stop_at:
        trainer.add_callback(StopAt(a.stop_at))
    if a.nan_at:
        compute_loss = trainer.compute_loss

        def diverging(*args, **kwargs):
            loss = compute_loss(*args, **kwargs)
            return loss * float("nan") if trainer.state.global_step >= a.nan_at else loss

        trainer.compute_loss = diverging
    if a.kill_saving:
        save = trainer._save_optimizer_and_scheduler

        def killed_while_saving(output_dir):
            if output_dir.endswith(f"checkpoint-{a.kill_saving}"):
                os.kill(os.getpid(), signal.SIGKILL)
            save(output_dir)

        trainer._save_optimizer_and_scheduler = killed_while_saving
    thrifty_hf.fit(
        trainer,
        config={
            "cost": {"usd_per_gpu_hour": 3.6},
            "spot": {"provider": "none"},
            "checkpoint": {"every": "off"},
            "run": {"log_every": 2},
        },
    )
    torch.save(model.state_dict(), os.path.join(a.out, "final.pt"))


if __name__ == "__main__":
    main()
