"""Accumulation on the models people bring: transformers' GPT-2 (a causal LM, its labels padded
with -100 by DataCollatorForLanguageModeling), BERT masked LM (-100 where no token is masked)
and a BERT sequence classifier (one label a sample), on uneven lengths. An effective batch of 16
at micro-batch 1, 4 and 16, and on 2 ranks, applies the gradient of the full batch's loss: the
mean over its valid label tokens (samples for the classifier), to float rounding.

Models are built from small configs (no download), dropout off, trained in fp32."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import RecordingSGD
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.levers.accumulation import Weighting, count_loss_tokens, is_causal_lm

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TESTS = Path(__file__).resolve().parent
VOCAB = 48
EFFECTIVE = 16
KINDS = ("gpt2", "bert-mlm", "bert-classifier")


def tokenizer() -> Any:
    """A word-level tokenizer built in place: [PAD] is 0, [MASK] 1, words t2 .. t47."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"[PAD]": 0, "[MASK]": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    model = Tokenizer(WordLevel(vocab, unk_token="[PAD]"))
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=model, pad_token="[PAD]", mask_token="[MASK]"
    )


class Texts(torch.utils.data.Dataset):
    """16 token sequences of 3 to 24 tokens; `kind` adds the labels its model trains on."""

    def __init__(self, kind: str, n: int = EFFECTIVE, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items: list[dict[str, Any]] = []
        for _ in range(n):
            length = int(torch.randint(3, 25, (), generator=g))
            ids = torch.randint(2, VOCAB, (length,), generator=g).tolist()
            item: dict[str, Any] = {"input_ids": ids}
            if kind == "bert-mlm":  # some tokens masked, at least one: labels -100 elsewhere
                masked = torch.rand(length, generator=g) < 0.3
                masked[int(torch.randint(0, length, (), generator=g))] = True
                item["input_ids"] = [1 if m else t for t, m in zip(ids, masked, strict=True)]
                item["labels"] = [t if m else -100 for t, m in zip(ids, masked, strict=True)]
            elif kind == "bert-classifier":
                item["labels"] = int(torch.randint(0, 3, (), generator=g))
            self.items.append(item)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.items[i]


def collator(kind: str) -> Any:
    tok = tokenizer()
    if kind == "gpt2":
        return transformers.DataCollatorForLanguageModeling(tok, mlm=False)
    if kind == "bert-mlm":
        return transformers.DataCollatorForTokenClassification(tok)  # pads labels with -100
    return transformers.DataCollatorWithPadding(tok)


def build_model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=VOCAB,
            n_positions=32,
            n_embd=32,
            n_layer=2,
            n_head=2,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=1,
            eos_token_id=1,
        )
        return transformers.GPT2LMHeadModel(config)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    if kind == "bert-mlm":
        return transformers.BertForMaskedLM(config)
    return transformers.BertForSequenceClassification(config)


def train_config(out: Path, micro: int, normalize: str = "auto") -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {"max_steps": 1, "device": "cpu", "out": str(out), "progress": "off"},
            "precision": {"mode": "fp32"},
            "batch": {"micro": micro, "effective": EFFECTIVE, "normalize": normalize},
            "optimizer": {"grad_clip": 0.0},
            "schedule": {"decay": "constant"},
            "data": {"num_workers": 0, "shuffle": False},
            "measure": {"breakdown": False},
        }
    )


def accumulated_gradient(kind: str, out: Path, micro: int, **kw: Any) -> list[torch.Tensor]:
    """The gradient thrifty applies in its first step (an SGD at lr 0 records it)."""
    model = build_model(kind)
    optimizer = RecordingSGD(model.parameters(), lr=0.0)
    cfg = train_config(out, micro, **kw)
    Trainer(model, Texts(kind), cfg, optimizer=optimizer, collate_fn=collator(kind)).fit()
    return optimizer.seen


def full_batch_gradient(kind: str) -> list[torch.Tensor]:
    """The gradient of the model's own loss on all 16 samples in one batch: the mean over the
    batch's valid label tokens (over its samples for the classifier)."""
    model = build_model(kind)
    data = Texts(kind)
    batch = collator(kind)([data[i] for i in range(len(data))])
    model(**batch).loss.backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def relative_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    diff = sum((x.double() - y.double()).pow(2).sum() for x, y in zip(a, b, strict=True))
    norm = sum(y.double().pow(2).sum() for y in b)
    return float(torch.sqrt(diff / norm))


@pytest.fixture(scope="module")
def reference() -> dict[str, list[torch.Tensor]]:
    return {kind: full_batch_gradient(kind) for kind in KINDS}


@pytest.mark.parametrize("micro", [1, 4, 16])
@pytest.mark.parametrize("kind", KINDS)
def test_any_micro_batch_applies_the_full_batchs_per_token_gradient(
    tmp_path, reference, kind, micro
):
    seen = accumulated_gradient(kind, tmp_path / "run", micro)
    assert relative_error(seen, reference[kind]) < 1e-5


def test_a_causal_lms_labels_are_counted_shifted_and_a_masked_lms_as_they_are():
    labels = torch.tensor([[5, 6, 7, -100], [8, -100, -100, -100]])
    batch = {"input_ids": labels.clamp(min=0), "labels": labels}
    assert count_loss_tokens(batch, shifted=True) == 2 + 0  # targets 6, 7; none in row 2
    assert count_loss_tokens(batch, shifted=False) == 4
    assert is_causal_lm(build_model("gpt2"))
    assert not is_causal_lm(build_model("bert-mlm"))
    assert not is_causal_lm(build_model("bert-classifier"))


def test_normalize_tokens_counts_a_causal_lms_shifted_targets_not_its_attention_mask(tmp_path):
    # "tokens" once counted attention_mask ones, one more a sequence than the loss averages.
    seen = accumulated_gradient("gpt2", tmp_path / "run", 4, normalize="tokens")
    assert relative_error(seen, full_batch_gradient("gpt2")) < 1e-5


def test_the_weighting_is_said_once_at_start_naming_why(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="thrifty"):
        accumulated_gradient("gpt2", tmp_path / "run", 4)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("accumulation:")]
    assert said == [
        "accumulation: micro-batch losses weighted by their valid label tokens (labels != -100, "
        "shifted: GPT2LMHeadModel is a causal LM), as one big batch would average them"
    ]
    classifier = Weighting("auto", build_model("bert-classifier"))
    batch = collator("bert-classifier")([Texts("bert-classifier")[0]])
    assert classifier.describe(batch) == (
        "micro-batch losses weighted by samples (the batches carry no loss_mask or per-token "
        "labels)"
    )


def test_tunes_micro_batch_lever_changes_no_loss_of_a_padded_causal_lm(tmp_path):
    """What `thrifty tune` varies (the setting's batch.micro, the effective batch kept): two
    steps of GPT-2 on padded text give the same losses and weights at micro 2 and 8."""
    from thrifty.config.files import apply_overrides
    from thrifty.search.tune.space import Setting

    def run(micro: int) -> tuple[list[float], list[torch.Tensor]]:
        out = tmp_path / f"micro-{micro}"
        base = train_config(out, 8).to_dict(secrets=False)
        base["run"].update(max_steps=2, log_every=1)
        setting = Setting.of(TrainConfig.from_dict(base)).with_(micro=micro)
        cfg = TrainConfig.from_dict(apply_overrides(base, setting.config_values().items()))
        model = build_model("gpt2")
        data = Texts("gpt2", n=32)
        Trainer(model, data, cfg, collate_fn=collator("gpt2")).fit()
        lines = (out / "metrics.jsonl").read_text().splitlines()
        losses = [json.loads(line)["loss"] for line in lines if '"loss"' in line]
        return losses, [p.detach().clone() for p in model.parameters()]

    (losses_2, weights_2), (losses_8, weights_8) = run(2), run(8)
    assert len(losses_2) == len(losses_8) == 2
    assert losses_2 == pytest.approx(losses_8, rel=1e-5)
    assert relative_error(weights_2, weights_8) < 1e-6


# -- two ranks ------------------------------------------------------------------------------


def rank_main(out: str) -> None:
    """One rank of the 2-rank job: each model trains one step of micro 4 × 2 on this rank's
    half of the effective 16; rank 0 writes the gradients DDP averaged."""
    for kind in KINDS:
        seen = accumulated_gradient(kind, Path(out) / kind, 4)
        if os.environ["RANK"] == "0":
            torch.save(seen, Path(out) / f"{kind}.pt")


def test_two_ranks_apply_the_full_batchs_per_token_gradient(tmp_path, reference):
    sys.path.insert(0, str(TESTS / "distributed"))
    from ranks_by_hand import run_ranks

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent / "src")]),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    command = [
        sys.executable,
        "-c",
        f"import test_accum_tokens as t; t.rank_main({str(tmp_path)!r})",
    ]
    done = run_ranks(command, env, 2, tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for kind in KINDS:
        seen = torch.load(tmp_path / f"{kind}.pt", weights_only=True)
        assert relative_error(seen, reference[kind]) < 1e-5, kind
